"""Kafka's ACL model: resource types, pattern types, operations and permissions (kafka-python's enums, Kafka's
codes), how a binding matches a resource, and how a filter (Describe/DeleteAcls, `icelog acl`) matches a binding.

Everything here is pure (no store, no clock), so the wire handlers, the authorizer and the CLI judge bindings and
filters alike, with Kafka's words in the messages a client or a user sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kafka.protocol.admin.acl import ACLOperation, ACLPermissionType, ACLResourcePatternType, ACLResourceType

from icelog.meta.security import AclEntry

__all__ = [
    "ACLOperation",
    "ACLPermissionType",
    "ACLResourcePatternType",
    "ACLResourceType",
    "AclEntry",
    "AclFilter",
    "InvalidAclError",
    "validate_binding",
    "binding_applies",
]

CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name, as Kafka's
WILDCARD = "*"  # a LITERAL resource name or a principal matching all
USER_PREFIX = "User:"

# The resource types icelog authorizes (Kafka's DELEGATION_TOKEN is not served).
RESOURCE_TYPES = (ACLResourceType.TOPIC, ACLResourceType.GROUP, ACLResourceType.CLUSTER,
                  ACLResourceType.TRANSACTIONAL_ID)

# Kafka's AclEntry.supportedOperations: what a binding of each resource type may name (ALL always).
SUPPORTED_OPERATIONS: dict[int, frozenset[ACLOperation]] = {
    ACLResourceType.TOPIC: frozenset({
        ACLOperation.READ, ACLOperation.WRITE, ACLOperation.CREATE, ACLOperation.DESCRIBE, ACLOperation.DELETE,
        ACLOperation.ALTER, ACLOperation.DESCRIBE_CONFIGS, ACLOperation.ALTER_CONFIGS,
    }),
    ACLResourceType.GROUP: frozenset({ACLOperation.READ, ACLOperation.DESCRIBE, ACLOperation.DELETE}),
    ACLResourceType.CLUSTER: frozenset({
        ACLOperation.CREATE, ACLOperation.CLUSTER_ACTION, ACLOperation.DESCRIBE_CONFIGS, ACLOperation.ALTER_CONFIGS,
        ACLOperation.IDEMPOTENT_WRITE, ACLOperation.ALTER, ACLOperation.DESCRIBE,
    }),
    ACLResourceType.TRANSACTIONAL_ID: frozenset({ACLOperation.DESCRIBE, ACLOperation.WRITE}),
}

# An ALLOW of any of these also allows the key (Kafka's AclAuthorizer: "allow implies describe").
IMPLIED_BY: dict[ACLOperation, frozenset[ACLOperation]] = {
    ACLOperation.DESCRIBE: frozenset({
        ACLOperation.DESCRIBE, ACLOperation.READ, ACLOperation.WRITE, ACLOperation.DELETE, ACLOperation.ALTER,
    }),
    ACLOperation.DESCRIBE_CONFIGS: frozenset({ACLOperation.DESCRIBE_CONFIGS, ACLOperation.ALTER_CONFIGS}),
}


class InvalidAclError(ValueError):
    """A binding or filter Kafka would refuse (INVALID_REQUEST); the message says why."""


def _enum_name(enum: type[IntEnum], code: int) -> str:
    """The member's name, or the bare code for one Kafka's enum does not know."""
    return next((str(m.name) for m in enum if m.value == code), str(code))


def _known(enum: type[IntEnum], code: int) -> bool:
    return code != 0 and any(m.value == code for m in enum)  # 0 is every enum's UNKNOWN


def validate_binding(entry: AclEntry) -> None:
    """Raise InvalidAclError for a binding Kafka's CreateAcls refuses (AclControlManager.validateNewAcl and the
    AclAuthorizer's checks), with Kafka's wording where it has one."""
    if entry.resource_type not in RESOURCE_TYPES:
        raise InvalidAclError(f"Invalid resourceType {_enum_name(ACLResourceType, entry.resource_type)}")
    if entry.pattern_type not in (ACLResourcePatternType.LITERAL, ACLResourcePatternType.PREFIXED):
        raise InvalidAclError(f"Invalid patternType {_enum_name(ACLResourcePatternType, entry.pattern_type)}")
    if entry.operation == ACLOperation.ANY or not _known(ACLOperation, entry.operation):
        raise InvalidAclError(f"Invalid operation {_enum_name(ACLOperation, entry.operation)}")
    if entry.permission not in (ACLPermissionType.ALLOW, ACLPermissionType.DENY):
        raise InvalidAclError(f"Invalid permissionType {_enum_name(ACLPermissionType, entry.permission)}")
    if not entry.resource_name:
        raise InvalidAclError("Resource name should not be empty")
    if entry.resource_type == ACLResourceType.CLUSTER and entry.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if entry.pattern_type == ACLResourcePatternType.PREFIXED and entry.resource_name == WILDCARD:
        raise InvalidAclError("A PREFIXED pattern may not be '*': use a LITERAL '*' to match every resource")
    if ":" not in entry.principal:
        raise InvalidAclError(
            f"Could not parse principal from `{entry.principal}` "
            "(no colon is present separating the principal type from the principal name); write User:NAME"
        )
    if not entry.principal.startswith(USER_PREFIX) or entry.principal == USER_PREFIX:
        raise InvalidAclError(f"Principal `{entry.principal}` is not User:NAME or User:*")
    if not entry.host:
        raise InvalidAclError("Host should not be empty: use '*' for any host")
    operation = ACLOperation(entry.operation)
    if operation != ACLOperation.ALL and operation not in SUPPORTED_OPERATIONS[entry.resource_type]:
        kind = ACLResourceType(entry.resource_type).name
        valid = ", ".join(sorted(o.name for o in SUPPORTED_OPERATIONS[entry.resource_type]))
        raise InvalidAclError(f"Invalid operation {operation.name} for resource type {kind} (it takes {valid} or ALL)")


def binding_applies(entry: AclEntry, resource_type: int, name: str) -> bool:
    """Whether a binding's resource pattern covers the resource (exact or '*' LITERAL, or a PREFIXED prefix)."""
    if entry.resource_type != resource_type:
        return False
    if entry.pattern_type == ACLResourcePatternType.LITERAL:
        return entry.resource_name in (name, WILDCARD)
    return entry.pattern_type == ACLResourcePatternType.PREFIXED and name.startswith(entry.resource_name)


@dataclass(frozen=True)
class AclFilter:
    """A filter over bindings as DescribeAcls / DeleteAcls carry it (Kafka's AclBindingFilter).

    resource_type ANY, pattern_type ANY (any pattern, exact name) or MATCH (every binding that applies to the
    named resource: the exact LITERAL, the '*' LITERAL and PREFIXED prefixes of it), operation ANY and
    permission ANY match all; a None name, principal or host matches any.
    """

    resource_type: int = ACLResourceType.ANY
    resource_name: str | None = None
    pattern_type: int = ACLResourcePatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = ACLOperation.ANY
    permission: int = ACLPermissionType.ANY

    def validate(self) -> None:
        """Raise InvalidAclError for a filter with an UNKNOWN (or unknown-code) field, as Kafka refuses it."""
        checks: list[tuple[type[IntEnum], int, str]] = [
            (ACLResourceType, self.resource_type, "resourceType"),
            (ACLResourcePatternType, self.pattern_type, "patternType"),
            (ACLOperation, self.operation, "operation"),
            (ACLPermissionType, self.permission, "permissionType"),
        ]
        for enum, code, what in checks:
            if not _known(enum, code):
                raise InvalidAclError(f"Invalid {what} {_enum_name(enum, code)} in filter")

    def matches(self, entry: AclEntry) -> bool:
        """Kafka's ResourcePatternFilter.matches and AccessControlEntryFilter.matches, together."""
        return self._matches_pattern(entry) and self._matches_entry(entry)

    def _matches_pattern(self, entry: AclEntry) -> bool:
        if self.resource_type != ACLResourceType.ANY and self.resource_type != entry.resource_type:
            return False
        if self.pattern_type not in (ACLResourcePatternType.ANY, ACLResourcePatternType.MATCH) and (
            self.pattern_type != entry.pattern_type
        ):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (ACLResourcePatternType.ANY, entry.pattern_type):
            return self.resource_name == entry.resource_name
        # MATCH with a name: the bindings that apply to that resource
        if entry.pattern_type == ACLResourcePatternType.LITERAL:
            return entry.resource_name in (self.resource_name, WILDCARD)
        return entry.pattern_type == ACLResourcePatternType.PREFIXED and self.resource_name.startswith(
            entry.resource_name
        )

    def _matches_entry(self, entry: AclEntry) -> bool:
        return (
            (self.principal is None or self.principal == entry.principal)
            and (self.host is None or self.host == entry.host)
            and (self.operation == ACLOperation.ANY or self.operation == entry.operation)
            and (self.permission == ACLPermissionType.ANY or self.permission == entry.permission)
        )
