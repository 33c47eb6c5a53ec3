"""The IntakeIndex slice on PostgreSQL: where each partition's batches lie in the intake files, the tail recovery
rescans from, and the log starts that trims and retention move.

Unlike SQLite's, the intake index is committed durably: the database outlives the broker's machine, and a database
that lost the last index rows while the broker kept running would leave a hole that no recovery re-reads (the
broker's tail has moved on). Per-partition intake totals are kept by the statements that insert and delete chunks
(no triggers: the group commit stays one statement, one round trip).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from icelog.meta.postgres.database import Args, Connection, PostgresDatabase
from icelog.meta.store import BrokerLease, IntakeChunk, IntakeIndex, IntakeRangeSummary, IntakeTail

_CHUNK_COLUMNS = (
    "topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp"
)
# Chunks of partition %(t)s/%(p)s holding offsets at or past %(o)s: a primary-key range from the chunk
# holding %(o)s (chunks of a partition are contiguous and disjoint), whatever the index size.
_FROM_OFFSET = (
    "topic_id = %(t)s AND partition = %(p)s AND base_offset >= COALESCE((SELECT MAX(base_offset) "
    "FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s AND base_offset <= %(o)s), -1) "
    "AND end_offset > %(o)s"
)
# The group commit in one statement: index the chunks of live partitions not yet indexed (idempotent), add
# them to their partitions' totals, move high watermarks, record the tail.
_COMMIT_INTAKE = """
WITH rows AS (
    SELECT * FROM unnest(%(t)s::uuid[], %(p)s::int[], %(base)s::bigint[], %(end)s::bigint[], %(file)s::bigint[],
                         %(pos)s::bigint[], %(len)s::bigint[], %(ts)s::bigint[], %(ingest)s::bigint[])
        AS r(topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp)
), added AS (
    INSERT INTO intake_chunks (topic_id, partition, base_offset, end_offset, file_id, position, length,
                               max_timestamp, ingest_timestamp)
    SELECT r.* FROM rows r JOIN partitions p ON p.topic_id = r.topic_id AND p.partition = r.partition
    WHERE p.log_start_offset < r.end_offset
    ON CONFLICT (topic_id, partition, base_offset) DO NOTHING
    RETURNING topic_id, partition, length
), counted AS (
    SELECT topic_id, partition, COUNT(*) AS n, SUM(length) AS bytes FROM added GROUP BY topic_id, partition
), ends AS (
    SELECT topic_id, partition, MAX(end_offset) AS end_offset FROM rows GROUP BY topic_id, partition
), moved AS (
    UPDATE partitions p SET high_watermark = GREATEST(p.high_watermark, e.end_offset),
        intake_chunks = p.intake_chunks + COALESCE(c.n, 0), intake_bytes = p.intake_bytes + COALESCE(c.bytes, 0)
    FROM ends e LEFT JOIN counted c ON c.topic_id = e.topic_id AND c.partition = e.partition
    WHERE p.topic_id = e.topic_id AND p.partition = e.partition
)
INSERT INTO intake_tail VALUES (0, %(tail_file)s, %(tail_pos)s)
ON CONFLICT (id) DO UPDATE SET file_id = excluded.file_id, position = excluded.position
"""
# The sequencer (commit_sequenced), after the tail row is locked: each chunk (relative offsets: n records) takes its
# partition's high watermark as base offset and moves it past, then is indexed; one statement, one round trip. The
# partition rows are locked by the UPDATE, so two brokers' commits to one partition are put in one order.
_SEQUENCE_INTAKE = """
WITH rows AS (
    SELECT * FROM unnest(%(t)s::uuid[], %(p)s::int[], %(n)s::bigint[], %(file)s::bigint[], %(pos)s::bigint[],
                         %(len)s::bigint[], %(ts)s::bigint[])
        AS r(topic_id, partition, n, file_id, position, length, max_timestamp)
), moved AS (
    UPDATE partitions p SET high_watermark = p.high_watermark + r.n, intake_chunks = p.intake_chunks + 1,
        intake_bytes = p.intake_bytes + r.length
    FROM rows r WHERE p.topic_id = r.topic_id AND p.partition = r.partition AND (%(node)s::int IS NULL OR EXISTS (
        SELECT 1 FROM leaderships l WHERE l.topic_id = r.topic_id AND l.partition = r.partition
        AND l.node_id = %(node)s AND l.incarnation = %(inc)s))
    RETURNING r.topic_id, r.partition, p.high_watermark - r.n AS base_offset, p.high_watermark AS end_offset,
        r.file_id, r.position, r.length, r.max_timestamp
), added AS (
    INSERT INTO intake_chunks (topic_id, partition, base_offset, end_offset, file_id, position, length,
                               max_timestamp, ingest_timestamp)
    SELECT m.*, %(ingest)s::bigint FROM moved m
)
SELECT topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, %(ingest)s::bigint
FROM moved ORDER BY position
"""
_TRIM_INTAKE = """
WITH dropped AS (
    DELETE FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s AND end_offset <= %(o)s RETURNING length
)
UPDATE partitions SET log_start_offset = GREATEST(log_start_offset, %(o)s),
    intake_chunks = intake_chunks - (SELECT COUNT(*) FROM dropped),
    intake_bytes = intake_bytes - (SELECT COALESCE(SUM(length), 0) FROM dropped)
WHERE topic_id = %(t)s AND partition = %(p)s
"""


class PostgresIntake(IntakeIndex):
    """IntakeIndex over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        now_ms = int(time.time() * 1000)  # the ingest time of the records: they are durable now
        chunks = list(chunks)
        args = {
            "t": [c.topic_id for c in chunks], "p": [c.partition for c in chunks],
            "base": [c.base_offset for c in chunks], "end": [c.end_offset for c in chunks],
            "file": [c.file_id for c in chunks], "pos": [c.position for c in chunks],
            "len": [c.length for c in chunks], "ts": [c.max_timestamp for c in chunks],
            "ingest": [c.ingest_timestamp if c.ingest_timestamp >= 0 else now_ms for c in chunks],
            "tail_file": tail.file_id, "tail_pos": tail.position,
        }
        # One statement (one round trip, one commit); idempotent, so retried even when its commit went unanswered.
        self._db.statement(_COMMIT_INTAKE, args)

    def commit_sequenced(
        self, chunks: Iterable[IntakeChunk], tail: IntakeTail, leader: BrokerLease | None = None
    ) -> list[IntakeChunk]:
        chunks = list(chunks)
        args = {
            "t": [c.topic_id for c in chunks], "p": [c.partition for c in chunks],
            "n": [c.end_offset - c.base_offset for c in chunks], "file": [c.file_id for c in chunks],
            "pos": [c.position for c in chunks], "len": [c.length for c in chunks],
            "ts": [c.max_timestamp for c in chunks], "ingest": int(time.time() * 1000),
            "node": leader.node_id if leader else None, "inc": leader.incarnation if leader else None,
        }
        if leader is not None:  # a cluster's broker: its own tail row, and only the partitions it leads
            lock_tail = "SELECT file_id FROM intake_node_tails WHERE node_id = %(node)s FOR UPDATE"
            put_tail = ("INSERT INTO intake_node_tails VALUES (%(node)s, %(f)s, %(p)s) ON CONFLICT (node_id) DO UPDATE "
                        "SET file_id = excluded.file_id, position = excluded.position")
        else:
            lock_tail = "SELECT file_id FROM intake_tail WHERE id = 0 FOR UPDATE"
            put_tail = ("INSERT INTO intake_tail VALUES (0, %(f)s, %(p)s) ON CONFLICT (id) DO UPDATE "
                        "SET file_id = excluded.file_id, position = excluded.position")

        def work(conn: Connection) -> list[IntakeChunk]:
            # The tail row, locked: one sequencing commit at a time, and a retry finds its own object committed.
            row = conn.execute(lock_tail, args).fetchone()
            if leader is not None and chunks:
                # The leaderships read, locked shared: a claim by another broker waits for this commit (and then
                # finds its chunks), or committed first and this commit finds the partition no longer its own.
                conn.execute("SELECT 1 FROM leaderships l JOIN unnest(%(t)s::uuid[], %(p)s::int[]) AS k(t, p) "
                             "ON l.topic_id = k.t AND l.partition = k.p FOR SHARE OF l", args)
            if row is not None and row[0] >= tail.file_id:  # committed before: the answer was lost
                return [IntakeChunk(*r) for r in conn.execute(
                    f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE file_id = %(f)s ORDER BY position",
                    {"f": tail.file_id}).fetchall()]
            assigned = [IntakeChunk(*r) for r in conn.execute(_SEQUENCE_INTAKE, args).fetchall()] if chunks else []
            conn.execute(put_tail, {"node": args["node"], "f": tail.file_id, "p": tail.position})
            return assigned

        # Idempotent: a retry after a commit that went unanswered finds the tail moved and changes nothing.
        return self._db.run(work, idempotent=True)

    def intake_tail(self, node: int | None = None) -> IntakeTail | None:
        row = (self._db.row("SELECT file_id, position FROM intake_tail WHERE id = 0") if node is None else
               self._db.row("SELECT file_id, position FROM intake_node_tails WHERE node_id = %s", (node,)))
        return IntakeTail(*row) if row else None

    def intake_chunks(self, topic_id: uuid.UUID | None = None) -> list[IntakeChunk]:
        if topic_id is None:
            return self._chunks(f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks ORDER BY topic_id, partition, base_offset")
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s ORDER BY partition, base_offset",
            {"t": topic_id},
        )

    def intake_chunks_after(
        self, topic_id: uuid.UUID, partition: int, offset: int, limit: int
    ) -> list[IntakeChunk]:
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} ORDER BY base_offset LIMIT %(n)s",
            {"t": topic_id, "p": partition, "o": offset, "n": limit},
        )

    def intake_last_chunks(self, topic_id: uuid.UUID, partition: int, limit: int) -> list[IntakeChunk]:
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "ORDER BY base_offset DESC LIMIT %(n)s",
            {"t": topic_id, "p": partition, "n": limit},
        )
        rows.reverse()
        return rows

    def intake_chunks_by_time(
        self, topic_id: uuid.UUID, partition: int, offset: int, timestamp_ms: int, limit: int
    ) -> list[IntakeChunk]:
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} AND max_timestamp >= %(ts)s "
            "ORDER BY base_offset LIMIT %(n)s",
            {"t": topic_id, "p": partition, "o": offset, "n": limit, "ts": timestamp_ms},
        )

    def intake_max_timestamp_chunk(self, topic_id: uuid.UUID, partition: int) -> IntakeChunk | None:
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "ORDER BY max_timestamp DESC, base_offset LIMIT 1",
            {"t": topic_id, "p": partition},
        )
        return rows[0] if rows else None

    def intake_range_summary(self, topic_id: uuid.UUID, partition: int, offset: int) -> IntakeRangeSummary:
        row = self._db.row(
            "SELECT COUNT(*), COALESCE(SUM(length), 0), "
            "MIN(CASE WHEN ingest_timestamp >= 0 THEN ingest_timestamp ELSE max_timestamp END) "
            f"FROM intake_chunks WHERE {_FROM_OFFSET}",
            {"t": topic_id, "p": partition, "o": offset},
        )
        assert row is not None
        return IntakeRangeSummary(int(row[0]), int(row[1]), -1 if row[2] is None else int(row[2]))

    def intake_bytes_below(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        row = self._db.row(
            "SELECT COALESCE(SUM(length), 0) FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "AND base_offset < %(o)s AND end_offset <= %(o)s",
            {"t": topic_id, "p": partition, "o": offset},
        )
        return int(row[0]) if row else 0

    def intake_files_in_use(self, file_ids: Iterable[int]) -> set[int]:
        # One look-up of the file_id index per file: there are few files, many chunks.
        rows = self._db.rows(
            "SELECT f FROM unnest(%s::bigint[]) AS f "
            "WHERE EXISTS (SELECT 1 FROM intake_chunks WHERE file_id = f)",
            (list(file_ids),),
        )
        return {int(r[0]) for r in rows}

    def _chunks(self, query: str, args: Args = ()) -> list[IntakeChunk]:
        return [IntakeChunk(*row) for row in self._db.rows(query, args)]

    def trim_intake(self, topic_id: uuid.UUID, partition: int, log_start_offset: int) -> None:
        # Durable when it returns: intake files are deleted right after a trim, and must never be gone while indexed.
        self._db.statement(_TRIM_INTAKE, {"t": topic_id, "p": partition, "o": log_start_offset})

    def move_retention_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        self._db.statement(
            "UPDATE partitions SET retention_start_offset = GREATEST(retention_start_offset, %s) "
            "WHERE topic_id = %s AND partition = %s",
            (offset, topic_id, partition),
        )
