"""The authorizer: Kafka's AclAuthorizer semantics over the ACLs of the metadata store.

DENY wins over ALLOW; LITERAL, wildcard ('*') and PREFIXED bindings all apply; an ALLOW of READ, WRITE, DELETE or
ALTER implies DESCRIBE, and ALTER_CONFIGS implies DESCRIBE_CONFIGS; super users may do anything; a resource with
no binding at all is open only with allow_everyone_if_no_acl_found. Bindings are held in memory and reloaded when
the store's security generation moves (another process changed them), checked at most once a second.
"""

from __future__ import annotations

from collections.abc import Iterable

from icelog.meta.security import AclEntry, SecurityStore
from icelog.security.acl import AclFilter, ACLOperation, ACLResourceType


class Authorizer:
    def __init__(self, store: SecurityStore, super_users: Iterable[str], allow_everyone_if_no_acl_found: bool) -> None:
        raise NotImplementedError

    def authorize(self, principal: str, host: str, operation: ACLOperation, resource_type: ACLResourceType,
                  name: str) -> bool:
        """Whether `principal` connecting from `host` may do `operation` on the resource."""
        raise NotImplementedError

    def describe(self, flt: AclFilter) -> list[AclEntry]:
        raise NotImplementedError

    def create(self, entries: Iterable[AclEntry]) -> None:
        raise NotImplementedError

    def delete(self, flt: AclFilter) -> list[AclEntry]:
        """Remove the bindings the filter matches; the ones removed."""
        raise NotImplementedError
