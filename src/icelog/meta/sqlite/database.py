"""The SQLite store's database: its two connections, the locks that serialise threads on them, transactions.

Every slice of the store (topics.py, intake.py, …) runs its statements through one `SqliteDatabase`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from icelog.meta.sqlite.schema import prepare_schema

Row = tuple[Any, ...]


class SqliteDatabase:
    """One SQLite database in WAL mode: a lock serialises the broker's threads on the write connection; reads of
    the intake index go through a second connection (see __init__)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.lock = threading.RLock()
        self.conn.execute("PRAGMA journal_mode=WAL")
        # Durability rule: whatever a client is answered about is on disk first. In WAL mode NORMAL loses
        # nothing to a kill -9 but may lose the last transactions to a power loss, so every write a client
        # is told about (topic DDL, producer-id blocks, committed offsets, transaction state, registry
        # writes, intake trims that precede file deletion) runs with FULL (`tx(durable=True)`): its
        # COMMIT fsyncs the WAL, and with it every earlier NORMAL transaction. Only the intake index
        # (commit_intake) and archive bookkeeping stay NORMAL: intake frames are fdatasync'd before they
        # are indexed, so recovery re-indexes lost rows from the files (commit_intake is idempotent), and
        # the Iceberg table's snapshot summary is the truth of archive progress.
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA busy_timeout=10000")
        prepare_schema(self.conn, self.tx)
        # Reads of the intake index (Fetch pages on worker threads, back-pressure aggregates, ListOffsets)
        # use a second connection: in WAL mode they then never wait for the intake writer's commits, nor
        # it for them. Each SELECT sees everything committed before it (autocommit).
        self._read_conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._read_conn.execute("PRAGMA query_only=1")
        self._read_conn.execute("PRAGMA busy_timeout=10000")
        self._read_lock = threading.Lock()

    @contextmanager
    def tx(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; `durable` commits it with synchronous=FULL (see __init__)."""
        with self.lock:
            conn = self.conn
            if durable:
                conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
            finally:
                if durable:
                    conn.execute("PRAGMA synchronous=NORMAL")

    def rows(self, query: str, args: tuple[object, ...] = ()) -> list[Row]:
        """The rows of one read on the write connection (it sees every write of this process at once)."""
        with self.lock:
            return self.conn.execute(query, args).fetchall()

    def index_rows(self, query: str, args: tuple[object, ...] = ()) -> list[Row]:
        """The rows of one read on the read connection: intake index reads that must not wait for its writer."""
        with self._read_lock:
            return self._read_conn.execute(query, args).fetchall()

    def close(self) -> None:
        with self._read_lock:
            self._read_conn.close()
        with self.lock:
            self.conn.close()
