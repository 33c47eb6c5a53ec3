"""The TransactionLog slice on PostgreSQL: producer-id blocks and each transactional id's transaction."""

from __future__ import annotations

from typing import Any

import psycopg.types.json

from icelog.errors import StoreError
from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.store import ShardFence, TransactionLog, TransactionRecord


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

    def save_transaction(self, record: TransactionRecord, fence: ShardFence | None = None) -> bool:
        detail = {"partitions": [list(tp) for tp in record.partitions], "groups": list(record.groups)}
        values = (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms, record.state,
                  psycopg.types.json.Jsonb(detail))

        def work(conn: Connection) -> bool:
            if fence is not None and not holds_shard(conn, fence):
                return False
            conn.execute(
                "INSERT INTO transactions VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (transactional_id) DO UPDATE "
                "SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "timeout_ms = excluded.timeout_ms, state = excluded.state, detail = excluded.detail", values)
            return True

        return self._db.run(work, idempotent=True)

    def transactions(self) -> list[TransactionRecord]:
        rows = self._db.rows(
            "SELECT transactional_id, producer_id, producer_epoch, timeout_ms, state, detail FROM transactions "
            "ORDER BY transactional_id"
        )
        return [transaction_record(*row) for row in rows]

    def transaction(self, transactional_id: str) -> TransactionRecord | None:
        row = self._db.row(
            "SELECT transactional_id, producer_id, producer_epoch, timeout_ms, state, detail FROM transactions "
            "WHERE transactional_id = %s", (transactional_id,)
        )
        return None if row is None else transaction_record(*row)


TRANSACTION_COLUMNS = "transactional_id, producer_id, producer_epoch, timeout_ms, state, detail"


def transaction_record(txn_id: str, pid: int, epoch: int, timeout_ms: int, state: str, data: Any) -> TransactionRecord:
    """A `transactions` row (TRANSACTION_COLUMNS) as its record (before issue 46 the groups were the keys of
    "pending_offsets", whose offsets stayed in the record: such offsets of a transaction open across the upgrade are
    lost)."""
    partitions = tuple((t, p) for t, p in data["partitions"])
    groups = tuple(data.get("groups", data.get("pending_offsets", ())))
    return TransactionRecord(txn_id, pid, epoch, timeout_ms, state, partitions, groups)


def holds_shard(conn: Connection, fence: ShardFence) -> bool:
    """Whether the fence's lease holds its coordinator shard, the shard's row locked shared: a claim by another
    broker waits for the caller's write (and its take_shard then reads it), or came first and the write finds the
    shard no longer its own."""
    lease, (shard_id, shard) = fence
    return conn.execute("SELECT 1 FROM leaderships WHERE topic_id = %s AND partition = %s AND node_id = %s "
                        "AND incarnation = %s FOR SHARE",
                        (shard_id, shard, lease.node_id, lease.incarnation)).fetchone() is not None
