"""SQLite implementation of the metadata store: the embedded default.

One class per slice of the interface (meta/store.py), each in its own module over one `SqliteDatabase`
(database.py: connections, locks, transactions; schema.py: the tables); `SqliteStore` is all of them.
"""

from __future__ import annotations

from pathlib import Path

from icelog.meta.sqlite.archive import SqliteArchive
from icelog.meta.sqlite.cluster import SqliteCluster
from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.sqlite.groups import SqliteGroups
from icelog.meta.sqlite.intake import SqliteIntake
from icelog.meta.sqlite.locks import FileLock, FileLocks
from icelog.meta.sqlite.registry import SqliteRegistry
from icelog.meta.sqlite.security import SqliteSecurity
from icelog.meta.sqlite.snapshots import SqliteSnapshots
from icelog.meta.sqlite.topics import SqliteTopics
from icelog.meta.sqlite.transactions import SqliteTransactions
from icelog.meta.store import MetadataStore


class SqliteStore(
    SqliteTopics, SqliteIntake, SqliteArchive, SqliteGroups, SqliteTransactions, SqliteSnapshots, SqliteRegistry,
    SqliteSecurity, SqliteCluster, MetadataStore,
):
    """The metadata in one SQLite database file; its process locks are files beside it."""

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteDatabase(path)
        self._locks = FileLocks(Path(path).parent)  # only this machine's processes share a SQLite store

    def try_lock(self, name: str, shared: bool = False) -> FileLock | None:
        return self._locks.try_lock(name, shared)

    def close(self) -> None:
        self._db.close()
