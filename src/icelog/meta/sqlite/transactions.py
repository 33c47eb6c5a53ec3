"""The TransactionLog slice on SQLite: producer-id blocks and each transactional id's transaction."""

from __future__ import annotations

import json

from icelog.errors import StoreError
from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import CommittedOffset, TransactionLog, TransactionRecord


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

    def save_transaction(self, record: TransactionRecord) -> None:
        detail = json.dumps({
            "partitions": [list(tp) for tp in record.partitions],
            "pending_offsets": {
                group: [[t, p, o.offset, o.metadata, o.commit_timestamp] for (t, p), o in offsets.items()]
                for group, offsets in record.pending_offsets.items()
            },
        })
        with self._db.tx(durable=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO transactions VALUES (?, ?, ?, ?, ?, ?)",
                (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms,
                 record.state, detail),
            )

    def transactions(self) -> list[TransactionRecord]:
        rows = self._db.rows("SELECT * FROM transactions ORDER BY transactional_id")
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
