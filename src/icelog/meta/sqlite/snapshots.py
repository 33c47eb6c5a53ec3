"""The ProducerSnapshots slice on SQLite: each partition's producer and transaction-index state at an offset."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import ProducerSnapshot, ProducerSnapshots


class SqliteSnapshots(ProducerSnapshots):
    """ProducerSnapshots over the store's SqliteDatabase."""

    _db: SqliteDatabase

    def save_producer_snapshots(self, snapshots: Iterable[ProducerSnapshot]) -> None:
        rows = [(str(s.topic_id), s.partition, s.offset, s.state) for s in snapshots]
        # NORMAL: a snapshot lost to a power loss only means replaying more intake at the next start-up.
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO producer_snapshots SELECT ?1, ?2, ?3, ?4 "
                "WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = ?1 AND partition = ?2) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET snapshot_offset = excluded.snapshot_offset, "
                "state = excluded.state WHERE excluded.snapshot_offset >= snapshot_offset",
                rows,
            )

    def producer_snapshots(self) -> list[ProducerSnapshot]:
        rows = self._db.rows(
            "SELECT topic_id, partition, snapshot_offset, state FROM producer_snapshots ORDER BY topic_id, partition"
        )
        return [ProducerSnapshot(uuid.UUID(t), p, o, s) for t, p, o, s in rows]

    def producer_snapshot(self, topic_id: uuid.UUID, partition: int) -> ProducerSnapshot | None:
        rows = self._db.rows(
            "SELECT snapshot_offset, state FROM producer_snapshots WHERE topic_id = ? AND partition = ?",
            (str(topic_id), partition),
        )
        return ProducerSnapshot(topic_id, partition, rows[0][0], rows[0][1]) if rows else None
