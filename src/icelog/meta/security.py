"""The security part of the metadata store: users' SCRAM credentials and Kafka ACLs.

Kept apart from `store.py` so the records and methods read as one unit: `SecurityStore` is the slice the
broker's authenticator and authorizer, the registry and `icelog user` / `icelog acl` use; `MetadataStore`
includes it and every backend implements it (each method one atomic, durable transaction). Passwords are
never stored: only SCRAM's salted keys (RFC 5802), from which no password can be read back.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ScramCredential:
    """One user's credential for one mechanism (SCRAM-SHA-256 or SCRAM-SHA-512), as RFC 5802 stores it."""

    user: str
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys are secrets: never in a log line or a traceback
        return f"ScramCredential(user={self.user!r}, mechanism={self.mechanism!r}, iterations={self.iterations})"


@dataclass(frozen=True)
class AclEntry:
    """One ACL binding as Kafka defines it, with Kafka's numeric codes (kafka.protocol.admin.acl's enums).

    resource_type: TOPIC 2, GROUP 3, CLUSTER 4, TRANSACTIONAL_ID 5; pattern_type: LITERAL 3, PREFIXED 4;
    principal: "User:NAME" or "User:*"; host: "*" or an address; operation: ALL 2, READ 3, ... ;
    permission: DENY 2, ALLOW 3.
    """

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int


@runtime_checkable
class SecurityStore(Protocol):
    """Durable users (SCRAM credentials) and ACLs; `security_generation` moves on every change of either, so a
    running broker notices changes made by another process (`icelog user`, `icelog acl`) without a restart."""

    @abstractmethod
    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        """Credentials of one user (any mechanism) or of all users, sorted by user and mechanism."""

    @abstractmethod
    def save_scram_credential(self, credential: ScramCredential) -> None:
        """Create or replace the credential of (user, mechanism)."""

    @abstractmethod
    def delete_scram_credentials(self, user: str, mechanism: str | None = None) -> int:
        """Remove a user's credential for one mechanism, or all of them (None); how many were removed."""

    @abstractmethod
    def acls(self) -> list[AclEntry]:
        """Every ACL binding."""

    @abstractmethod
    def add_acls(self, entries: Iterable[AclEntry]) -> None:
        """Add ACL bindings; one already present is left as it is."""

    @abstractmethod
    def delete_acls(self, entries: Iterable[AclEntry]) -> None:
        """Remove these exact bindings (absent ones are ignored)."""

    @abstractmethod
    def security_generation(self) -> int:
        """A number that grows with every change of credentials or ACLs (a cheap read)."""
