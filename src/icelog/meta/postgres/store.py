"""PostgreSQL implementation of the metadata store: for metadata beyond one machine's disk.

Same semantics as the SQLite store (meta/sqlite/), slice for slice: one class per slice of the interface
(meta/store.py), each in its own module over one `PostgresDatabase` (database.py: the pool, retries, outages;
schema.py: the versioned tables); `PostgresStore` is all of them. Writes that read first lock what they read
(`FOR UPDATE`, an advisory lock for registry ids), so concurrent callers serialise as they do behind SQLite's
single writer.
"""

from __future__ import annotations

from icelog.meta.postgres.archive import PostgresArchive
from icelog.meta.postgres.cluster import PostgresCluster
from icelog.meta.postgres.database import PostgresDatabase
from icelog.meta.postgres.groups import PostgresGroups
from icelog.meta.postgres.intake import PostgresIntake
from icelog.meta.postgres.locks import AdvisoryLock, try_advisory_lock
from icelog.meta.postgres.registry import PostgresRegistry
from icelog.meta.postgres.security import PostgresSecurity
from icelog.meta.postgres.snapshots import PostgresSnapshots
from icelog.meta.postgres.topics import PostgresTopics
from icelog.meta.postgres.transactions import PostgresTransactions
from icelog.meta.store import MetadataStore


class PostgresStore(
    PostgresTopics, PostgresIntake, PostgresArchive, PostgresGroups, PostgresTransactions, PostgresSnapshots,
    PostgresRegistry, PostgresSecurity, PostgresCluster, MetadataStore,
):
    """The metadata in one PostgreSQL database (or the first schema of the URL's search_path)."""

    def __init__(self, url: str) -> None:
        self._db = PostgresDatabase(url)

    def try_lock(self, name: str, shared: bool = False) -> AdvisoryLock | None:
        return try_advisory_lock(self._db, name, shared)

    def close(self) -> None:
        self._db.close()
