"""The IntakeIndex slice on SQLite: where each partition's batches lie in the intake files, the tail recovery
rescans from, and the log starts that trims and retention move."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from icelog.meta.sqlite.cluster import refuse
from icelog.meta.sqlite.database import Row, SqliteDatabase
from icelog.meta.store import BrokerLease, IntakeChunk, IntakeIndex, IntakeRangeSummary, IntakeTail

_CHUNK_COLUMNS = (
    "topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp"
)
# Chunks of partition ?1/?2 holding offsets at or past ?3: a primary-key range from the chunk holding ?3
# (chunks of a partition are contiguous and disjoint), whatever the index size.
_FROM_OFFSET = (
    "topic_id = ?1 AND partition = ?2 AND base_offset >= COALESCE((SELECT MAX(base_offset) FROM intake_chunks "
    "WHERE topic_id = ?1 AND partition = ?2 AND base_offset <= ?3), -1) AND end_offset > ?3"
)


def _chunk_rows(rows: list[Row]) -> list[IntakeChunk]:
    ids: dict[str, uuid.UUID] = {}  # parse each topic id once
    return [IntakeChunk(ids.get(r[0]) or ids.setdefault(r[0], uuid.UUID(r[0])), *r[1:]) for r in rows]


class SqliteIntake(IntakeIndex):
    """IntakeIndex over the store's SqliteDatabase: writes on its write connection, reads of chunks on its read
    connection (they never wait for the intake writer's commits)."""

    _db: SqliteDatabase

    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        now_ms = int(time.time() * 1000)  # the ingest time of the records: they are durable now
        rows = [
            (str(c.topic_id), c.partition, c.base_offset, c.end_offset, c.file_id, c.position, c.length,
             c.max_timestamp, c.ingest_timestamp if c.ingest_timestamp >= 0 else now_ms)
            for c in chunks
        ]
        with self._db.tx() as conn:
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

    def commit_sequenced(
        self, chunks: Iterable[IntakeChunk], tail: IntakeTail, leader: BrokerLease | None = None
    ) -> list[IntakeChunk]:
        if leader is not None:
            refuse()
        now_ms = int(time.time() * 1000)
        assigned: list[IntakeChunk] = []
        # Durable: the object is acknowledged once this returns, and a lost commit would hand its offsets out again.
        with self._db.tx(durable=True) as conn:
            row = conn.execute("SELECT file_id FROM intake_tail").fetchone()
            if row is not None and row[0] >= tail.file_id:  # committed before: the answer was lost
                found = conn.execute(
                    f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE file_id = ? ORDER BY position", (tail.file_id,)
                ).fetchall()
                return _chunk_rows(found)
            for c in chunks:
                tid = str(c.topic_id)
                found = conn.execute(
                    "SELECT high_watermark FROM partitions WHERE topic_id = ? AND partition = ?", (tid, c.partition)
                ).fetchone()
                if found is None:  # deleted since the append: not indexed
                    continue
                base = int(found[0])
                chunk = IntakeChunk(c.topic_id, c.partition, base, base + c.end_offset - c.base_offset, c.file_id,
                                    c.position, c.length, c.max_timestamp, now_ms)
                conn.execute(
                    "INSERT INTO intake_chunks (topic_id, partition, base_offset, end_offset, file_id, position, "
                    "length, max_timestamp, ingest_timestamp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (tid, c.partition, chunk.base_offset, chunk.end_offset, c.file_id, c.position, c.length,
                     c.max_timestamp, now_ms),
                )
                conn.execute("UPDATE partitions SET high_watermark = ? WHERE topic_id = ? AND partition = ?",
                             (chunk.end_offset, tid, c.partition))
                assigned.append(chunk)
            conn.execute("INSERT OR REPLACE INTO intake_tail VALUES (0, ?, ?)", (tail.file_id, tail.position))
        return assigned

    def intake_tail(self, node: int | None = None) -> IntakeTail | None:
        if node is not None:
            refuse()
        rows = self._db.rows("SELECT file_id, position FROM intake_tail")
        return IntakeTail(*rows[0]) if rows else None

    def intake_chunks(self, topic_id: uuid.UUID | None = None) -> list[IntakeChunk]:
        query = f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks"
        args: tuple[str, ...] = ()
        if topic_id is not None:
            query += " WHERE topic_id = ?"
            args = (str(topic_id),)
        return _chunk_rows(self._db.rows(query + " ORDER BY topic_id, partition, base_offset", args))

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
        [(count, size, oldest)] = self._db.index_rows(
            "SELECT COUNT(*), COALESCE(SUM(length), 0), "
            "MIN(CASE WHEN ingest_timestamp >= 0 THEN ingest_timestamp ELSE max_timestamp END) "
            f"FROM intake_chunks WHERE {_FROM_OFFSET}",
            (str(topic_id), partition, offset),
        )
        return IntakeRangeSummary(count, size, -1 if oldest is None else oldest)

    def intake_bytes_below(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        [(size,)] = self._db.index_rows(
            "SELECT COALESCE(SUM(length), 0) FROM intake_chunks WHERE topic_id = ? AND partition = ? "
            "AND base_offset < ?3 AND end_offset <= ?3",
            (str(topic_id), partition, offset),
        )
        return int(size)

    def intake_files_in_use(self, file_ids: Iterable[int]) -> set[int]:
        # One look-up of the file_id index per file: there are few files, many chunks.
        query = "SELECT 1 FROM intake_chunks WHERE file_id = ? LIMIT 1"
        return {file_id for file_id in file_ids if self._db.index_rows(query, (file_id,))}

    def _chunks(self, query: str, args: tuple[object, ...]) -> list[IntakeChunk]:
        return _chunk_rows(self._db.index_rows(query, args))

    def trim_intake(self, topic_id: uuid.UUID, partition: int, log_start_offset: int) -> None:
        tid = str(topic_id)
        # Durable: intake files are deleted right after a trim, and must never be gone while indexed.
        with self._db.tx(durable=True) as conn:
            conn.execute(
                "DELETE FROM intake_chunks WHERE topic_id = ? AND partition = ? AND end_offset <= ?",
                (tid, partition, log_start_offset),
            )
            conn.execute(
                "UPDATE partitions SET log_start_offset = MAX(log_start_offset, ?) "
                "WHERE topic_id = ? AND partition = ?",
                (log_start_offset, tid, partition),
            )

    def move_retention_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        with self._db.tx(durable=True) as conn:
            conn.execute(
                "UPDATE partitions SET retention_start_offset = MAX(retention_start_offset, ?) "
                "WHERE topic_id = ? AND partition = ?",
                (offset, str(topic_id), partition),
            )
