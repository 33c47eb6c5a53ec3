"""The TransactionLog slice on SQLite: producer-id blocks and each transactional id's transaction."""

from __future__ import annotations

import json
from typing import Any

from icelog.errors import StoreError
from icelog.meta.sqlite.cluster import refuse
from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import ShardFence, TransactionLog, TransactionRecord


class SqliteTransactions(TransactionLog):
    """TransactionLog over the store's SqliteDatabase; every write is durable (clients are answered about it)."""

    _db: SqliteDatabase

    def allocate_producer_ids(self, count: int) -> int:
        if count < 1:
            raise StoreError("allocate at least one producer id")
        with self._db.tx(durable=True) as conn:
            row = conn.execute("SELECT next_producer_id FROM producer_ids").fetchone()
            first = row[0] if row else 0
            conn.execute("INSERT OR REPLACE INTO producer_ids VALUES (0, ?)", (first + count,))
            return int(first)

    def save_transaction(self, record: TransactionRecord, fence: ShardFence | None = None) -> bool:
        if fence is not None:
            refuse()  # (a cluster's coordinator: PostgreSQL only)
        detail = json.dumps({"partitions": [list(tp) for tp in record.partitions], "groups": list(record.groups)})
        with self._db.tx(durable=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO transactions VALUES (?, ?, ?, ?, ?, ?)",
                (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms,
                 record.state, detail),
            )
        return True

    def transactions(self) -> list[TransactionRecord]:
        rows = self._db.rows("SELECT * FROM transactions ORDER BY transactional_id")
        return [transaction_record(*row) for row in rows]

    def transaction(self, transactional_id: str) -> TransactionRecord | None:
        rows = self._db.rows("SELECT * FROM transactions WHERE transactional_id = ?", (transactional_id,))
        return transaction_record(*rows[0]) if rows else None


def transaction_record(
    txn_id: str, pid: int, epoch: int, timeout_ms: int, state: str, detail: str
) -> TransactionRecord:
    """A `transactions` row as its record."""
    data = json.loads(detail)
    partitions = tuple((t, p) for t, p in data["partitions"])
    return TransactionRecord(txn_id, pid, epoch, timeout_ms, state, partitions, transaction_groups(data))


def transaction_groups(data: dict[str, Any]) -> tuple[str, ...]:
    """The groups of a transaction's stored detail (before issue 46 they were the keys of "pending_offsets", whose
    offsets stayed in the transaction's own record: such offsets of a transaction open across the upgrade are lost)."""
    return tuple(data.get("groups", data.get("pending_offsets", ())))
