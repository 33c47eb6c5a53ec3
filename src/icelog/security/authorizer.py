"""The authorizer: Kafka's AclAuthorizer semantics over the ACLs of the metadata store.

DENY wins over ALLOW; LITERAL, wildcard ('*') and PREFIXED bindings all apply; an ALLOW of READ, WRITE, DELETE or
ALTER implies DESCRIBE, and ALTER_CONFIGS implies DESCRIBE_CONFIGS; super users may do anything; a resource with
no binding at all is open only with allow_everyone_if_no_acl_found. Bindings are held in memory and reloaded when
the store's security generation moves (another process changed them), checked at most once a second: `authorize`
runs for every request on the event loop, so it reads the store at most once a second and otherwise only dicts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from icelog.errors import IcelogError, first_line
from icelog.meta.security import AclEntry, SecurityStore
from icelog.security.acl import (
    IMPLIED_BY,
    WILDCARD,
    AclFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ACLResourceType,
    validate_binding,
)

log = logging.getLogger(__name__)

RELOAD_CHECK_SECONDS = 1.0  # how often the store's security generation is read


@dataclass
class _Bindings:
    """One resource type's bindings: LITERAL ones by name ('*' among them), PREFIXED ones in a list."""

    literal: dict[str, list[AclEntry]] = field(default_factory=dict)
    prefixed: list[AclEntry] = field(default_factory=list)

    def applying_to(self, name: str) -> list[AclEntry]:
        found = self.literal.get(name, []) + (self.literal.get(WILDCARD, []) if name != WILDCARD else [])
        return found + [e for e in self.prefixed if name.startswith(e.resource_name)]


def _index(entries: Iterable[AclEntry]) -> dict[int, _Bindings]:
    index: dict[int, _Bindings] = {}
    for entry in entries:
        bindings = index.setdefault(entry.resource_type, _Bindings())
        if entry.pattern_type == ACLResourcePatternType.PREFIXED:
            bindings.prefixed.append(entry)
        else:
            bindings.literal.setdefault(entry.resource_name, []).append(entry)
    return index


class Authorizer:
    """Answers whether a principal may do an operation on a resource, from an in-memory copy of the store's
    ACLs; creates and deletes bindings through the store (a durable write each, so callers run them off the
    event loop)."""

    def __init__(
        self,
        store: SecurityStore,
        super_users: Iterable[str],
        allow_everyone_if_no_acl_found: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._super_users = frozenset(super_users)
        self._allow_if_none = allow_everyone_if_no_acl_found
        self._clock = clock
        self._generation = -1
        self._checked_at = 0.0
        self._entries: list[AclEntry] = []
        self._index: dict[int, _Bindings] = {}
        self._stale = False  # the last check could not reach the store
        self._reload()

    def _reload(self) -> None:
        """Read every binding; the generation first, so a change made meanwhile is read again next time."""
        generation = self._store.security_generation()
        entries = self._store.acls()
        self._entries, self._index = entries, _index(entries)
        self._generation = generation
        self._checked_at = self._clock()

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < RELOAD_CHECK_SECONDS:
            return
        self._checked_at = now
        try:
            if self._store.security_generation() != self._generation:
                self._reload()
        except IcelogError as exc:
            if not exc.retriable:
                raise
            # The store is unreachable (a networked store's database down): decide on the bindings held, as they
            # were when last read, rather than refuse every request; checked again in a second.
            if not self._stale:
                log.warning("ACLs kept as last read: the metadata store is unavailable (%s)", first_line(exc))
            self._stale = True
            return
        self._stale = False

    def authorize(self, principal: str, host: str, operation: ACLOperation, resource_type: ACLResourceType,
                  name: str) -> bool:
        """Whether `principal` connecting from `host` may do `operation` on the resource."""
        if principal in self._super_users:
            return True
        self._refresh()
        bindings = self._index.get(resource_type)
        entries = bindings.applying_to(name) if bindings is not None else []
        if not entries:
            return self._allow_if_none
        mine = [e for e in entries if e.principal in (principal, "User:*") and e.host in (host, WILDCARD)]
        if any(e.permission == ACLPermissionType.DENY and e.operation in (operation, ACLOperation.ALL)
               for e in mine):
            return False
        allowing = IMPLIED_BY.get(operation, frozenset({operation})) | {ACLOperation.ALL}
        return any(e.permission == ACLPermissionType.ALLOW and e.operation in allowing for e in mine)

    def authorize_any(self, principal: str, host: str, operation: ACLOperation,
                      resource_type: ACLResourceType) -> bool:
        """Whether the principal may do `operation` on some resource of the type (Kafka's
        authorizeByResourceType, for KIP-679's "WRITE on any topic"): an ALLOW that no DENY covers."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):  # super users, open, '*'
            return True
        bindings = self._index.get(resource_type)
        if bindings is None:
            return False
        mine = [
            e for names in (*bindings.literal.values(), bindings.prefixed) for e in names
            if e.principal in (principal, "User:*") and e.host in (host, WILDCARD)
            and e.operation in (operation, ACLOperation.ALL)
        ]
        denied_names = {e.resource_name for e in mine if e.permission == ACLPermissionType.DENY
                        and e.pattern_type == ACLResourcePatternType.LITERAL}
        denied_prefixes = [e.resource_name for e in mine if e.permission == ACLPermissionType.DENY
                           and e.pattern_type == ACLResourcePatternType.PREFIXED]
        if WILDCARD in denied_names:
            return False
        return any(
            e.permission == ACLPermissionType.ALLOW
            and not (e.pattern_type == ACLResourcePatternType.LITERAL and e.resource_name in denied_names)
            and not any(e.resource_name.startswith(p) for p in denied_prefixes)
            for e in mine
        )

    def describe(self, flt: AclFilter) -> list[AclEntry]:
        """The bindings the filter matches (from memory, refreshed as `authorize` is)."""
        self._refresh()
        return [e for e in self._entries if flt.matches(e)]

    def create(self, entries: Iterable[AclEntry]) -> None:
        """Store the bindings (InvalidAclError for one Kafka would refuse, before anything is stored)."""
        entries = list(entries)
        for entry in entries:
            validate_binding(entry)
        self._store.add_acls(entries)
        self._reload()

    def delete(self, flt: AclFilter) -> list[AclEntry]:
        """Remove the bindings the filter matches; the ones removed."""
        flt.validate()
        self._reload()  # match against what the store holds now, not a second-old copy
        removed = [e for e in self._entries if flt.matches(e)]
        if removed:
            self._store.delete_acls(removed)
            self._reload()
        return removed

