"""SQLite implementation of the metadata store: the embedded default."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

from icelog.errors import StoreError, TopicExistsError, UnknownTopicError
from icelog.meta.file_locks import FileLock, FileLocks
from icelog.meta.sqlite_registry import SqliteRegistry
from icelog.meta.sqlite_security import SqliteSecurity
from icelog.meta.store import (
    ArchiveState,
    CommittedOffset,
    GroupOffsets,
    IntakeChunk,
    IntakeRangeSummary,
    IntakeTail,
    MaintenanceRecord,
    MetadataStore,
    PartitionRecord,
    ProducerSnapshot,
    TopicRecord,
    TransactionRecord,
)
from icelog.table.field_ids import TableColumn

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (topic_id, key)
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    log_start_offset INTEGER NOT NULL DEFAULT 0,
    high_watermark INTEGER NOT NULL DEFAULT 0,
    intake_chunks INTEGER NOT NULL DEFAULT 0,
    intake_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS intake_chunks (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    file_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    length INTEGER NOT NULL,
    max_timestamp INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset)
);
CREATE INDEX IF NOT EXISTS intake_chunks_by_file ON intake_chunks (file_id);
CREATE TABLE IF NOT EXISTS archive_state (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    archived_offset INTEGER NOT NULL DEFAULT 0,
    last_commit_ms INTEGER NOT NULL DEFAULT -1,
    last_error TEXT NOT NULL DEFAULT '',
    last_error_ms INTEGER NOT NULL DEFAULT -1,
    dead_letters INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS intake_tail (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    file_id INTEGER NOT NULL,
    position INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS producer_ids (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next_producer_id INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS producer_snapshots (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    snapshot_offset INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS table_columns (
    table_name TEXT NOT NULL,
    path TEXT NOT NULL,
    field_id INTEGER NOT NULL,
    signature TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (table_name, path)
);
CREATE TABLE IF NOT EXISTS table_maintenance (
    table_name TEXT PRIMARY KEY,
    finished_ms INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    summary TEXT NOT NULL,
    data_files_after INTEGER NOT NULL,
    orphans_checked_ms INTEGER NOT NULL DEFAULT -1
);
"""


# partitions.intake_chunks / intake_bytes follow the index row by row, so start-up and `icelog status`
# read a partition's totals without touching its chunk rows (trigger bodies hold ';': executed one by one).
_INTAKE_TOTALS_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS intake_chunks_counted AFTER INSERT ON intake_chunks BEGIN "
    "UPDATE partitions SET intake_chunks = intake_chunks + 1, intake_bytes = intake_bytes + NEW.length "
    "WHERE topic_id = NEW.topic_id AND partition = NEW.partition; END",
    "CREATE TRIGGER IF NOT EXISTS intake_chunks_uncounted AFTER DELETE ON intake_chunks BEGIN "
    "UPDATE partitions SET intake_chunks = intake_chunks - 1, intake_bytes = intake_bytes - OLD.length "
    "WHERE topic_id = OLD.topic_id AND partition = OLD.partition; END",
)

_CHUNK_COLUMNS = (
    "topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp"
)
# Chunks of partition ?1/?2 holding offsets at or past ?3: a primary-key range from the chunk holding ?3
# (chunks of a partition are contiguous and disjoint), whatever the index size.
_FROM_OFFSET = (
    "topic_id = ?1 AND partition = ?2 AND base_offset >= COALESCE((SELECT MAX(base_offset) FROM intake_chunks "
    "WHERE topic_id = ?1 AND partition = ?2 AND base_offset <= ?3), -1) AND end_offset > ?3"
)


class SqliteStore(SqliteRegistry, SqliteSecurity, MetadataStore):
    """One SQLite database in WAL mode: a lock serialises the broker's threads on the write connection; reads
    of the intake index go through a second connection (see __init__)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._locks = FileLocks(Path(path).parent)  # only this machine's processes share a SQLite store
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        self._conn.execute("PRAGMA journal_mode=WAL")
        # Durability rule: whatever a client is answered about is on disk first. In WAL mode NORMAL loses
        # nothing to a kill -9 but may lose the last transactions to a power loss, so every write a client
        # is told about (topic DDL, producer-id blocks, committed offsets, transaction state, registry
        # writes, intake trims that precede file deletion) runs with FULL (`_tx(durable=True)`): its
        # COMMIT fsyncs the WAL, and with it every earlier NORMAL transaction. Only the intake index
        # (commit_intake) and archive bookkeeping stay NORMAL: intake frames are fdatasync'd before they
        # are indexed, so recovery re-indexes lost rows from the files (commit_intake is idempotent), and
        # the Iceberg table's snapshot summary is the truth of archive progress.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=10000")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self._conn.execute(statement)
        self._create_registry_tables()
        archive_columns = {row[1] for row in self._conn.execute("PRAGMA table_info(archive_state)")}
        if "dead_letters" not in archive_columns:  # stores created before the dead-letter table
            with suppress(sqlite3.OperationalError):
                self._conn.execute("ALTER TABLE archive_state ADD COLUMN dead_letters INTEGER NOT NULL DEFAULT 0")
        if "retention_start_offset" not in {row[1] for row in self._conn.execute("PRAGMA table_info(partitions)")}:
            with suppress(sqlite3.OperationalError):  # stores created before read-back
                self._conn.execute(
                    "ALTER TABLE partitions ADD COLUMN retention_start_offset INTEGER NOT NULL DEFAULT 0"
                )
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(intake_chunks)")}
        if "ingest_timestamp" not in columns:  # stores created before the archiver
            # (suppress: another process, the archiver or the broker, may have added it just now)
            with suppress(sqlite3.OperationalError):
                self._conn.execute(
                    "ALTER TABLE intake_chunks ADD COLUMN ingest_timestamp INTEGER NOT NULL DEFAULT -1"
                )
        self._migrate_intake_totals()
        self._create_security_tables()
        # Reads of the intake index (Fetch pages on worker threads, back-pressure aggregates, ListOffsets)
        # use a second connection: in WAL mode they then never wait for the intake writer's commits, nor
        # it for them. Each SELECT sees everything committed before it (autocommit).
        self._read_conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._read_conn.execute("PRAGMA query_only=1")
        self._read_conn.execute("PRAGMA busy_timeout=10000")
        self._read_lock = threading.Lock()

    def _migrate_intake_totals(self) -> None:
        """Stores created before per-partition intake totals: add and backfill them, with the triggers that
        keep them, in one transaction (the broker and the archiver may open the store at once)."""
        with self._tx() as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(partitions)")}
            if "intake_bytes" not in columns:
                conn.execute("ALTER TABLE partitions ADD COLUMN intake_chunks INTEGER NOT NULL DEFAULT 0")
                conn.execute("ALTER TABLE partitions ADD COLUMN intake_bytes INTEGER NOT NULL DEFAULT 0")
                conn.execute(
                    "UPDATE partitions SET (intake_chunks, intake_bytes) = (SELECT COUNT(*), COALESCE(SUM(length), 0) "
                    "FROM intake_chunks c WHERE c.topic_id = partitions.topic_id "
                    "AND c.partition = partitions.partition)"
                )
            for trigger in _INTAKE_TOTALS_TRIGGERS:
                conn.execute(trigger)

    @contextmanager
    def _tx(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; `durable` commits it with synchronous=FULL (see __init__)."""
        with self._lock:
            conn = self._conn
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

    # -- topics --------------------------------------------------------------------------------
    def _topic(self, conn: sqlite3.Connection, name: str) -> TopicRecord | None:
        row = conn.execute("SELECT topic_id, partitions FROM topics WHERE name = ?", (name,)).fetchone()
        if row is None:
            return None
        configs = dict(conn.execute("SELECT key, value FROM topic_configs WHERE topic_id = ?", (row[0],)))
        return TopicRecord(name, uuid.UUID(row[0]), row[1], configs)

    def _require(self, conn: sqlite3.Connection, name: str) -> TopicRecord:
        topic = self._topic(conn, name)
        if topic is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        return topic

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> TopicRecord:
        if partitions < 1:
            raise StoreError("a topic needs at least one partition")
        with self._tx(durable=True) as conn:
            if self._topic(conn, name) is not None:
                raise TopicExistsError(f"topic {name!r} already exists")
            topic_id = uuid.uuid4()
            conn.execute("INSERT INTO topics VALUES (?, ?, ?)", (name, str(topic_id), partitions))
            conn.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)", [(str(topic_id), k, v) for k, v in configs.items()]
            )
            conn.executemany(
                "INSERT INTO partitions (topic_id, partition) VALUES (?, ?)",
                [(str(topic_id), p) for p in range(partitions)],
            )
            return TopicRecord(name, topic_id, partitions, dict(configs))

    def delete_topic(self, name: str) -> TopicRecord:
        with self._tx(durable=True) as conn:
            topic = self._require(conn, name)
            tid = str(topic.topic_id)
            conn.execute("DELETE FROM topics WHERE topic_id = ?", (tid,))
            for table in ("topic_configs", "partitions", "intake_chunks", "archive_state", "producer_snapshots"):
                conn.execute(f"DELETE FROM {table} WHERE topic_id = ?", (tid,))
            return topic

    def add_partitions(self, name: str, total: int) -> TopicRecord:
        with self._tx(durable=True) as conn:
            topic = self._require(conn, name)
            if total <= topic.partitions:
                raise StoreError(f"topic {name!r} has {topic.partitions} partitions; {total} is not more")
            conn.execute("UPDATE topics SET partitions = ? WHERE name = ?", (total, name))
            conn.executemany(
                "INSERT INTO partitions (topic_id, partition) VALUES (?, ?)",
                [(str(topic.topic_id), p) for p in range(topic.partitions, total)],
            )
            return self._require(conn, name)

    def alter_topic_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str] = ()
    ) -> TopicRecord:
        with self._tx(durable=True) as conn:
            topic = self._require(conn, name)
            tid = str(topic.topic_id)
            conn.executemany(
                "DELETE FROM topic_configs WHERE topic_id = ? AND key = ?", [(tid, k) for k in delete_keys]
            )
            conn.executemany(
                "INSERT OR REPLACE INTO topic_configs VALUES (?, ?, ?)",
                [(tid, k, v) for k, v in set_configs.items()],
            )
            return self._require(conn, name)

    def get_topic(self, name: str) -> TopicRecord | None:
        with self._lock:
            return self._topic(self._conn, name)

    def list_topics(self) -> list[TopicRecord]:
        with self._lock:
            names = [r[0] for r in self._conn.execute("SELECT name FROM topics ORDER BY name")]
            return [self._require(self._conn, n) for n in names]

    # -- partitions ----------------------------------------------------------------------------
    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT partition, log_start_offset, high_watermark, intake_chunks, intake_bytes, "
                "retention_start_offset FROM partitions WHERE topic_id = ? ORDER BY partition",
                (str(topic_id),),
            ).fetchall()
        return [PartitionRecord(topic_id, *row) for row in rows]

    def move_retention_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        with self._tx(durable=True) as conn:
            conn.execute(
                "UPDATE partitions SET retention_start_offset = MAX(retention_start_offset, ?) "
                "WHERE topic_id = ? AND partition = ?",
                (offset, str(topic_id), partition),
            )

    # -- intake index --------------------------------------------------------------------------
    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        now_ms = int(time.time() * 1000)  # the ingest time of the records: they are durable now
        rows = [
            (str(c.topic_id), c.partition, c.base_offset, c.end_offset, c.file_id, c.position, c.length,
             c.max_timestamp, c.ingest_timestamp if c.ingest_timestamp >= 0 else now_ms)
            for c in chunks
        ]
        with self._tx() as conn:
            # Chunks of deleted topics (a frame written before DeleteTopics) are not indexed, nor chunks
            # a trim already dropped (recovery replaying frames from an older tail after a power loss).
            conn.executemany(
                "INSERT OR IGNORE INTO intake_chunks (topic_id, partition, base_offset, end_offset, file_id, "
                "position, length, max_timestamp, ingest_timestamp) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 "
                "WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = ?1 AND partition = ?2 "
                "AND log_start_offset < ?4)",
                rows,
            )
            conn.executemany(
                "UPDATE partitions SET high_watermark = MAX(high_watermark, ?) WHERE topic_id = ? AND partition = ?",
                [(r[3], r[0], r[1]) for r in rows],
            )
            conn.execute(
                "INSERT OR REPLACE INTO intake_tail VALUES (0, ?, ?)", (tail.file_id, tail.position)
            )

    def intake_tail(self) -> IntakeTail | None:
        with self._lock:
            row = self._conn.execute("SELECT file_id, position FROM intake_tail").fetchone()
        return IntakeTail(*row) if row else None

    def intake_chunks(self, topic_id: uuid.UUID | None = None) -> list[IntakeChunk]:
        query = (
            "SELECT topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, "
            "ingest_timestamp FROM intake_chunks"
        )
        args: tuple[str, ...] = ()
        if topic_id is not None:
            query += " WHERE topic_id = ?"
            args = (str(topic_id),)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY topic_id, partition, base_offset", args).fetchall()
        ids: dict[str, uuid.UUID] = {}  # parse each topic id once
        return [IntakeChunk(ids.get(r[0]) or ids.setdefault(r[0], uuid.UUID(r[0])), *r[1:]) for r in rows]

    def intake_chunks_after(
        self, topic_id: uuid.UUID, partition: int, offset: int, limit: int
    ) -> list[IntakeChunk]:
        # Two primary-key range lookups, whatever the index size: the chunk holding `offset`, then up to
        # `limit` chunks from it.
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} ORDER BY base_offset LIMIT ?4",
            (str(topic_id), partition, offset, limit),
        )

    def intake_last_chunks(self, topic_id: uuid.UUID, partition: int, limit: int) -> list[IntakeChunk]:
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = ? AND partition = ? "
            "ORDER BY base_offset DESC LIMIT ?",
            (str(topic_id), partition, limit),
        )
        rows.reverse()
        return rows

    def intake_chunks_by_time(
        self, topic_id: uuid.UUID, partition: int, offset: int, timestamp_ms: int, limit: int
    ) -> list[IntakeChunk]:
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} AND max_timestamp >= ?5 "
            "ORDER BY base_offset LIMIT ?4",
            (str(topic_id), partition, offset, limit, timestamp_ms),
        )

    def intake_max_timestamp_chunk(self, topic_id: uuid.UUID, partition: int) -> IntakeChunk | None:
        # One pass over the partition's rows in SQLite (bounded memory). No index on max_timestamp: it
        # would cost every group commit (about 40 % more CPU per commit_intake) for a rare request.
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = ? AND partition = ? "
            "ORDER BY max_timestamp DESC, base_offset LIMIT 1",
            (str(topic_id), partition),
        )
        return rows[0] if rows else None

    def intake_range_summary(self, topic_id: uuid.UUID, partition: int, offset: int) -> IntakeRangeSummary:
        with self._read_lock:
            count, size, oldest = self._read_conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(length), 0), "
                "MIN(CASE WHEN ingest_timestamp >= 0 THEN ingest_timestamp ELSE max_timestamp END) "
                f"FROM intake_chunks WHERE {_FROM_OFFSET}",
                (str(topic_id), partition, offset),
            ).fetchone()
        return IntakeRangeSummary(count, size, -1 if oldest is None else oldest)

    def intake_bytes_below(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        with self._read_lock:
            row = self._read_conn.execute(
                "SELECT COALESCE(SUM(length), 0) FROM intake_chunks WHERE topic_id = ? AND partition = ? "
                "AND base_offset < ?3 AND end_offset <= ?3",
                (str(topic_id), partition, offset),
            ).fetchone()
        return int(row[0])

    def intake_files_in_use(self, file_ids: Iterable[int]) -> set[int]:
        with self._read_lock:  # one look-up of the file_id index per file: there are few files, many chunks
            query = "SELECT 1 FROM intake_chunks WHERE file_id = ? LIMIT 1"
            return {file_id for file_id in file_ids if self._read_conn.execute(query, (file_id,)).fetchone()}

    def _chunks(self, query: str, args: tuple[object, ...]) -> list[IntakeChunk]:
        with self._read_lock:
            rows = self._read_conn.execute(query, args).fetchall()
        ids: dict[str, uuid.UUID] = {}
        return [IntakeChunk(ids.get(r[0]) or ids.setdefault(r[0], uuid.UUID(r[0])), *r[1:]) for r in rows]

    def trim_intake(self, topic_id: uuid.UUID, partition: int, log_start_offset: int) -> None:
        tid = str(topic_id)
        # Durable: intake files are deleted right after a trim, and must never be gone while indexed.
        with self._tx(durable=True) as conn:
            conn.execute(
                "DELETE FROM intake_chunks WHERE topic_id = ? AND partition = ? AND end_offset <= ?",
                (tid, partition, log_start_offset),
            )
            conn.execute(
                "UPDATE partitions SET log_start_offset = MAX(log_start_offset, ?) "
                "WHERE topic_id = ? AND partition = ?",
                (log_start_offset, tid, partition),
            )

    # -- archive state -------------------------------------------------------------------------
    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        query = (
            "SELECT topic_id, partition, archived_offset, last_commit_ms, last_error, last_error_ms, dead_letters "
            "FROM archive_state"
        )
        args: tuple[str, ...] = ()
        if topic_id is not None:
            query += " WHERE topic_id = ?"
            args = (str(topic_id),)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY topic_id, partition", args).fetchall()
        return [ArchiveState(uuid.UUID(r[0]), *r[1:]) for r in rows]

    def record_archive(
        self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int
    ) -> None:
        tid = str(topic_id)
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, archived_offset, last_commit_ms) "
                "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET "
                "archived_offset = MAX(archived_offset, excluded.archived_offset), "
                "last_commit_ms = MAX(last_commit_ms, excluded.last_commit_ms), "
                "last_error = '', last_error_ms = -1",
                [(tid, p, offset, commit_ms) for p, offset in archived_offsets.items()],
            )

    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        tid = str(topic_id)
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, dead_letters) "
                "SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET dead_letters = excluded.dead_letters",
                [(tid, p, n) for p, n in counts.items()],
            )

    def record_archive_error(
        self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int
    ) -> None:
        tid = str(topic_id)
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, last_error, last_error_ms) "
                "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET "
                "last_error = excluded.last_error, last_error_ms = excluded.last_error_ms",
                [(tid, p, error[:2000], at_ms) for p in partitions],
            )

    # -- consumer groups ---------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: GroupOffsets) -> None:
        rows = [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()]
        with self._tx(durable=True) as conn:
            conn.executemany("INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?, ?)", rows)

    def committed_offsets(self, group_id: str) -> GroupOffsets:
        with self._lock:
            rows = self._conn.execute(
                "SELECT topic, partition, committed_offset, metadata, commit_timestamp FROM group_offsets "
                "WHERE group_id = ? ORDER BY topic, partition",
                (group_id,),
            ).fetchall()
        return {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in rows}

    def offset_groups(self) -> list[str]:
        with self._lock:
            rows = self._conn.execute("SELECT DISTINCT group_id FROM group_offsets ORDER BY 1")
            return [r[0] for r in rows]

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        with self._tx(durable=True) as conn:
            if partitions is None:
                conn.execute("DELETE FROM group_offsets WHERE group_id = ?", (group_id,))
            else:
                conn.executemany(
                    "DELETE FROM group_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                    [(group_id, t, p) for t, p in partitions],
                )

    # -- archive table columns -------------------------------------------------------------------
    def table_columns(self, table: str) -> list[TableColumn]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT path, field_id, signature, deleted FROM table_columns WHERE table_name = ? "
                "ORDER BY field_id",
                (table,),
            ).fetchall()
        return [TableColumn(path, field_id, signature, bool(deleted)) for path, field_id, signature, deleted in rows]

    def save_table_columns(self, table: str, columns: Iterable[TableColumn]) -> None:
        with self._tx(durable=True) as conn:
            conn.execute("DELETE FROM table_columns WHERE table_name = ?", (table,))
            conn.executemany(
                "INSERT INTO table_columns (table_name, path, field_id, signature, deleted) VALUES (?, ?, ?, ?, ?)",
                [(table, c.path, c.field_id, c.signature, int(c.deleted)) for c in columns],
            )

    # -- table maintenance ---------------------------------------------------------------------------
    def record_maintenance(self, record: MaintenanceRecord) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO table_maintenance (table_name, finished_ms, duration_ms, outcome, summary, "
                "data_files_after, orphans_checked_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.table, record.finished_ms, record.duration_ms, record.outcome, record.summary,
                 record.data_files_after, record.orphans_checked_ms),
            )

    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT table_name, finished_ms, duration_ms, outcome, summary, data_files_after, orphans_checked_ms "
                "FROM table_maintenance"
            ).fetchall()
        return {row[0]: MaintenanceRecord(*row) for row in rows}

    # -- producers and transactions ----------------------------------------------------------------
    def allocate_producer_ids(self, count: int) -> int:
        if count < 1:
            raise StoreError("allocate at least one producer id")
        with self._tx(durable=True) as conn:
            row = conn.execute("SELECT next_producer_id FROM producer_ids").fetchone()
            first = row[0] if row else 0
            conn.execute("INSERT OR REPLACE INTO producer_ids VALUES (0, ?)", (first + count,))
            return int(first)

    def save_transaction(self, record: TransactionRecord) -> None:
        detail = json.dumps({
            "partitions": [list(tp) for tp in record.partitions],
            "pending_offsets": {
                group: [[t, p, o.offset, o.metadata, o.commit_timestamp] for (t, p), o in offsets.items()]
                for group, offsets in record.pending_offsets.items()
            },
        })
        with self._tx(durable=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO transactions VALUES (?, ?, ?, ?, ?, ?)",
                (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms,
                 record.state, detail),
            )

    def transactions(self) -> list[TransactionRecord]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM transactions ORDER BY transactional_id").fetchall()
        out = []
        for txn_id, pid, epoch, timeout_ms, state, detail in rows:
            data = json.loads(detail)
            pending = {
                group: {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in entries}
                for group, entries in data["pending_offsets"].items()
            }
            partitions = tuple((t, p) for t, p in data["partitions"])
            out.append(TransactionRecord(txn_id, pid, epoch, timeout_ms, state, partitions, pending))
        return out

    # -- producer-state snapshots ------------------------------------------------------------------
    def save_producer_snapshots(self, snapshots: Iterable[ProducerSnapshot]) -> None:
        rows = [(str(s.topic_id), s.partition, s.offset, s.state) for s in snapshots]
        # NORMAL: a snapshot lost to a power loss only means replaying more intake at the next start-up.
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO producer_snapshots SELECT ?1, ?2, ?3, ?4 "
                "WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = ?1 AND partition = ?2) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET snapshot_offset = excluded.snapshot_offset, "
                "state = excluded.state WHERE excluded.snapshot_offset >= snapshot_offset",
                rows,
            )

    def producer_snapshots(self) -> list[ProducerSnapshot]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT topic_id, partition, snapshot_offset, state FROM producer_snapshots "
                "ORDER BY topic_id, partition"
            ).fetchall()
        return [ProducerSnapshot(uuid.UUID(t), p, o, s) for t, p, o, s in rows]

    def try_lock(self, name: str, shared: bool = False) -> FileLock | None:
        return self._locks.try_lock(name, shared)

    def close(self) -> None:
        with self._read_lock:
            self._read_conn.close()
        with self._lock:
            self._conn.close()
