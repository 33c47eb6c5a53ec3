"""The ConsumerOffsets slice on SQLite: consumer groups' committed offsets (Kafka's `__consumer_offsets`), and the
transactional ones pending until their transaction ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from icelog.meta.sqlite.cluster import refuse
from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.sqlite.transactions import transaction_record
from icelog.meta.store import CommittedOffset, ConsumerOffsets, GroupOffsets, ShardFence, TxnOffsetStage

_UPSERT_OFFSETS = "INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?, ?)"


class SqliteGroups(ConsumerOffsets):
    """ConsumerOffsets over the store's SqliteDatabase; commits are durable (a client is answered about them)."""

    _db: SqliteDatabase

    def commit_offsets(self, group_id: str, offsets: GroupOffsets, fence: ShardFence | None = None) -> bool:
        if fence is not None:
            refuse()  # (a cluster's coordinator: PostgreSQL only)
        rows = [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()]
        with self._db.tx(durable=True) as conn:
            conn.executemany(_UPSERT_OFFSETS, rows)
        return True

    def committed_offsets(self, group_id: str) -> GroupOffsets:
        rows = self._db.rows(
            "SELECT topic, partition, committed_offset, metadata, commit_timestamp FROM group_offsets "
            "WHERE group_id = ? ORDER BY topic, partition",
            (group_id,),
        )
        return {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in rows}

    def offset_groups(self) -> list[str]:
        return [r[0] for r in self._db.rows("SELECT DISTINCT group_id FROM group_offsets ORDER BY 1")]

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        with self._db.tx(durable=True) as conn:
            if partitions is None:
                conn.execute("DELETE FROM group_offsets WHERE group_id = ?", (group_id,))
            else:
                conn.executemany(
                    "DELETE FROM group_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                    [(group_id, t, p) for t, p in partitions],
                )

    # -- KIP-848 consumer groups' state ----------------------------------------------------------------------
    def save_consumer_group_state(self, group_id: str, shard: int, state: str | None,
                                  fence: ShardFence | None = None) -> bool:
        if fence is not None:
            refuse()  # (a cluster's coordinator: PostgreSQL only)
        with self._db.tx(durable=True) as conn:
            if state is None:
                conn.execute("DELETE FROM consumer_group_states WHERE group_id = ?", (group_id,))
            else:
                conn.execute("INSERT OR REPLACE INTO consumer_group_states VALUES (?, ?, ?)", (group_id, shard, state))
        return True

    def consumer_group_states(self, shard: int | None = None) -> dict[str, str]:
        if shard is None:
            rows = self._db.rows("SELECT group_id, state FROM consumer_group_states ORDER BY 1")
        else:
            rows = self._db.rows("SELECT group_id, state FROM consumer_group_states WHERE shard = ? ORDER BY 1",
                                 (shard,))
        return {group_id: state for group_id, state in rows}

    # -- transactional offsets -------------------------------------------------------------------------------
    def stage_txn_offsets(
        self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int, offsets: GroupOffsets,
        fence: ShardFence | None = None,
    ) -> TxnOffsetStage:
        if fence is not None:
            refuse()  # (a cluster's coordinator: PostgreSQL only)
        rows = [(group_id, producer_id, t, p, producer_epoch, transactional_id, o.offset, o.metadata,
                 o.commit_timestamp) for (t, p), o in offsets.items()]
        with self._db.tx(durable=True) as conn:  # (one writer: the transaction coordinator's writes wait for it)
            found = conn.execute("SELECT * FROM transactions WHERE transactional_id = ?",
                                 (transactional_id,)).fetchone()
            record = None if found is None else transaction_record(*found)
            if record is None or not record.admits_offsets(group_id, producer_id, producer_epoch):
                return TxnOffsetStage(False, record)
            conn.executemany("INSERT OR REPLACE INTO txn_offsets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        return TxnOffsetStage(True, record)

    def pending_txn_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        pending: dict[str, dict[tuple[str, int], int]] = {}
        for group_id, topic, partition, producer_id in self._db.rows(
                "SELECT group_id, topic, partition, producer_id FROM txn_offsets ORDER BY 1, 2, 3"):
            pending.setdefault(group_id, {})[(topic, partition)] = producer_id
        return pending

    def complete_txn_offsets(
        self, producer_id: int, producer_epoch: int, commit: bool, groups: Callable[[str], bool],
        fence: ShardFence | None = None,
    ) -> dict[str, GroupOffsets] | None:
        if fence is not None:
            refuse()
        with self._db.tx(durable=True) as conn:
            rows = conn.execute(
                "SELECT o.group_id, o.topic, o.partition, o.committed_offset, o.metadata, o.commit_timestamp, t.* "
                "FROM txn_offsets o JOIN transactions t ON t.transactional_id = o.transactional_id "
                "WHERE o.producer_id = ? ORDER BY 1, 2, 3", (producer_id,)).fetchall()
            done: dict[str, GroupOffsets] = {}
            for group_id, topic, partition, offset, metadata, timestamp, *txn in rows:
                if groups(group_id) and transaction_record(*txn).completing(producer_id, producer_epoch, commit):
                    done.setdefault(group_id, {})[(topic, partition)] = CommittedOffset(offset, metadata, timestamp)
            ended = [(g, producer_id, t, p) for g, offsets in done.items() for t, p in offsets]
            conn.executemany("DELETE FROM txn_offsets WHERE group_id = ? AND producer_id = ? AND topic = ? "
                             "AND partition = ?", ended)
            if commit:
                conn.executemany(_UPSERT_OFFSETS, [(g, t, p, o.offset, o.metadata, o.commit_timestamp)
                                                   for g, offsets in done.items() for (t, p), o in offsets.items()])
        return done
