"""The TransactionLog slice on PostgreSQL: producer-id blocks and each transactional id's transaction."""

from __future__ import annotations

import psycopg.types.json

from icelog.errors import StoreError
from icelog.meta.postgres.database import PostgresDatabase
from icelog.meta.store import CommittedOffset, TransactionLog, TransactionRecord


class PostgresTransactions(TransactionLog):
    """TransactionLog over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def allocate_producer_ids(self, count: int) -> int:
        if count < 1:
            raise StoreError("allocate at least one producer id")
        # One statement: the row lock serialises allocators. A retry after an unanswered commit skips a block,
        # which is harmless (ids are never reused either way).
        row = self._db.run(
            lambda conn: conn.execute(
                "UPDATE producer_ids SET next_producer_id = next_producer_id + %(n)s WHERE id = 0 "
                "RETURNING next_producer_id - %(n)s", {"n": count},
            ).fetchone(),
            transaction=False, idempotent=True,
        )
        assert row is not None, "producer_ids is seeded by the schema"
        return int(row[0])

    def save_transaction(self, record: TransactionRecord) -> None:
        detail = {
            "partitions": [list(tp) for tp in record.partitions],
            "pending_offsets": {
                group: [[t, p, o.offset, o.metadata, o.commit_timestamp] for (t, p), o in offsets.items()]
                for group, offsets in record.pending_offsets.items()
            },
        }
        self._db.statement(
            "INSERT INTO transactions VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (transactional_id) DO UPDATE SET "
            "producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
            "timeout_ms = excluded.timeout_ms, state = excluded.state, detail = excluded.detail",
            (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms, record.state,
             psycopg.types.json.Jsonb(detail)),
        )

    def transactions(self) -> list[TransactionRecord]:
        rows = self._db.rows(
            "SELECT transactional_id, producer_id, producer_epoch, timeout_ms, state, detail FROM transactions "
            "ORDER BY transactional_id"
        )
        out = []
        for txn_id, pid, epoch, timeout_ms, state, data in rows:
            pending = {
                group: {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in entries}
                for group, entries in data["pending_offsets"].items()
            }
            partitions = tuple((t, p) for t, p in data["partitions"])
            out.append(TransactionRecord(txn_id, pid, epoch, timeout_ms, state, partitions, pending))
        return out
