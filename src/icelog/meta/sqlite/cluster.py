"""The ClusterMembership slice on SQLite: refused. A SQLite database lives on one broker's disk, so no second broker
can share it; several brokers need the PostgreSQL store (meta/postgres/cluster.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import NoReturn

from icelog.errors import ConfigError
from icelog.meta.store import BrokerLease, BrokerRecord, ClusterMembership, Leadership

NEEDS_POSTGRES = ("several brokers share one metadata store only on PostgreSQL (metadata_url: postgresql://...): "
                  "a SQLite database is one broker's own")


def refuse() -> NoReturn:
    raise ConfigError(NEEDS_POSTGRES)


class SqliteCluster(ClusterMembership):
    """ClusterMembership on SQLite: every method refuses with the fix."""

    def register_broker(self, lease: BrokerLease, endpoints: Mapping[str, tuple[str, int]], rack: str | None) -> None:
        refuse()

    def heartbeat_broker(self, lease: BrokerLease) -> bool:
        refuse()

    def deregister_broker(self, lease: BrokerLease) -> None:
        refuse()

    def brokers(self, session_timeout_ms: int) -> list[BrokerRecord]:
        refuse()

    def leaderships(self) -> dict[tuple[uuid.UUID, int], Leadership]:
        refuse()

    def claim_leaderships(
        self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]], session_timeout_ms: int
    ) -> dict[tuple[uuid.UUID, int], int]:
        refuse()

    def release_leaderships(self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]]) -> None:
        refuse()
