"""The ProducerSnapshots slice on PostgreSQL: each partition's producer and transaction-index state at an offset."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from icelog.meta.postgres.database import PostgresDatabase
from icelog.meta.store import ProducerSnapshot, ProducerSnapshots


class PostgresSnapshots(ProducerSnapshots):
    """ProducerSnapshots over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def save_producer_snapshots(self, snapshots: Iterable[ProducerSnapshot]) -> None:
        self._db.many(
            "INSERT INTO producer_snapshots SELECT %(t)s, %(p)s, %(o)s, %(s)s "
            "WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = %(t)s AND partition = %(p)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET snapshot_offset = excluded.snapshot_offset, "
            "state = excluded.state WHERE excluded.snapshot_offset >= producer_snapshots.snapshot_offset",
            [{"t": s.topic_id, "p": s.partition, "o": s.offset, "s": s.state} for s in snapshots],
        )

    def producer_snapshots(self) -> list[ProducerSnapshot]:
        rows = self._db.rows(
            "SELECT topic_id, partition, snapshot_offset, state FROM producer_snapshots ORDER BY topic_id, partition"
        )
        return [ProducerSnapshot(*row) for row in rows]

    def producer_snapshot(self, topic_id: uuid.UUID, partition: int) -> ProducerSnapshot | None:
        row = self._db.row("SELECT topic_id, partition, snapshot_offset, state FROM producer_snapshots "
                           "WHERE topic_id = %s AND partition = %s", (topic_id, partition))
        return ProducerSnapshot(*row) if row else None
