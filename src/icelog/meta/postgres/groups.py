"""The ConsumerOffsets slice on PostgreSQL: consumer groups' committed offsets (Kafka's `__consumer_offsets`), and the
transactional ones pending until their transaction ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.postgres.transactions import TRANSACTION_COLUMNS, holds_shard, transaction_record
from icelog.meta.store import CommittedOffset, ConsumerOffsets, GroupOffsets, ShardFence, TxnOffsetStage

_UPSERT_OFFSETS = (
    "INSERT INTO group_offsets VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) "
    "DO UPDATE SET committed_offset = excluded.committed_offset, metadata = excluded.metadata, "
    "commit_timestamp = excluded.commit_timestamp"
)


class PostgresGroups(ConsumerOffsets):
    """ConsumerOffsets over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def commit_offsets(self, group_id: str, offsets: GroupOffsets, fence: ShardFence | None = None) -> bool:
        rows = [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()]

        def work(conn: Connection) -> bool:
            if fence is not None and not holds_shard(conn, fence):
                return False
            with conn.cursor() as cur:
                cur.executemany(_UPSERT_OFFSETS, rows)
            return True

        return self._db.run(work, idempotent=True)

    def committed_offsets(self, group_id: str) -> GroupOffsets:
        rows = self._db.rows(
            "SELECT topic, partition, committed_offset, metadata, commit_timestamp FROM group_offsets "
            "WHERE group_id = %s ORDER BY topic, partition",
            (group_id,),
        )
        return {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in rows}

    def offset_groups(self) -> list[str]:
        return [r[0] for r in self._db.rows("SELECT DISTINCT group_id FROM group_offsets ORDER BY 1")]

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        if partitions is None:
            self._db.statement("DELETE FROM group_offsets WHERE group_id = %s", (group_id,))
            return
        self._db.many(
            "DELETE FROM group_offsets WHERE group_id = %s AND topic = %s AND partition = %s",
            [(group_id, t, p) for t, p in partitions],
        )

    # -- KIP-848 consumer groups' state ----------------------------------------------------------------------
    def save_consumer_group_state(self, group_id: str, shard: int, state: str | None,
                                  fence: ShardFence | None = None) -> bool:
        def work(conn: Connection) -> bool:
            if fence is not None and not holds_shard(conn, fence):
                return False
            if state is None:
                conn.execute("DELETE FROM consumer_group_states WHERE group_id = %s", (group_id,))
            else:
                conn.execute("INSERT INTO consumer_group_states VALUES (%s, %s, %s) ON CONFLICT (group_id) "
                             "DO UPDATE SET shard = excluded.shard, state = excluded.state", (group_id, shard, state))
            return True

        return self._db.run(work, idempotent=True)

    def consumer_group_states(self, shard: int | None = None) -> dict[str, str]:
        if shard is None:
            rows = self._db.rows("SELECT group_id, state FROM consumer_group_states ORDER BY 1")
        else:
            rows = self._db.rows("SELECT group_id, state FROM consumer_group_states WHERE shard = %s ORDER BY 1",
                                 (shard,))
        return {group_id: state for group_id, state in rows}

    # -- transactional offsets -------------------------------------------------------------------------------
    def stage_txn_offsets(
        self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int, offsets: GroupOffsets,
        fence: ShardFence | None = None,
    ) -> TxnOffsetStage:
        rows = [(group_id, producer_id, t, p, producer_epoch, transactional_id, o.offset, o.metadata,
                 o.commit_timestamp) for (t, p), o in offsets.items()]

        def work(conn: Connection) -> TxnOffsetStage:
            if fence is not None and not holds_shard(conn, fence):
                return TxnOffsetStage(False, coordinated=False)
            # Locked shared: the coordinator's next write of the id (PrepareAbort at a timeout, say) waits for this
            # stage, so the markers it then sends find these offsets; or it came first and the stage is refused.
            found = conn.execute(f"SELECT {TRANSACTION_COLUMNS} FROM transactions WHERE transactional_id = %s "
                                 "FOR SHARE", (transactional_id,)).fetchone()
            record = None if found is None else transaction_record(*found)
            if record is None or not record.admits_offsets(group_id, producer_id, producer_epoch):
                return TxnOffsetStage(False, record)
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO txn_offsets VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (group_id, producer_id, topic, partition) DO UPDATE SET "
                    "producer_epoch = excluded.producer_epoch, transactional_id = excluded.transactional_id, "
                    "committed_offset = excluded.committed_offset, metadata = excluded.metadata, "
                    "commit_timestamp = excluded.commit_timestamp", rows)
            return TxnOffsetStage(True, record)

        return self._db.run(work, idempotent=True)

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
        columns = ", ".join(f"t.{c}" for c in TRANSACTION_COLUMNS.split(", "))

        def work(conn: Connection) -> dict[str, GroupOffsets] | None:
            if fence is not None and not holds_shard(conn, fence):
                return None
            rows = conn.execute(
                "SELECT o.group_id, o.topic, o.partition, o.committed_offset, o.metadata, o.commit_timestamp, "
                f"{columns} FROM txn_offsets o JOIN transactions t ON t.transactional_id = o.transactional_id "
                "WHERE o.producer_id = %s ORDER BY 1, 2, 3", (producer_id,)).fetchall()
            done: dict[str, GroupOffsets] = {}
            for group_id, topic, partition, offset, metadata, timestamp, *txn in rows:
                if groups(group_id) and transaction_record(*txn).completing(producer_id, producer_epoch, commit):
                    done.setdefault(group_id, {})[(topic, partition)] = CommittedOffset(offset, metadata, timestamp)
            with conn.cursor() as cursor:
                ended = [(g, producer_id, t, p) for g, offsets in done.items() for t, p in offsets]
                if ended:
                    cursor.executemany("DELETE FROM txn_offsets WHERE group_id = %s AND producer_id = %s "
                                       "AND topic = %s AND partition = %s", ended)
                if commit and ended:
                    cursor.executemany(_UPSERT_OFFSETS, [(g, t, p, o.offset, o.metadata, o.commit_timestamp)
                                                         for g, offsets in done.items()
                                                         for (t, p), o in offsets.items()])
            return done

        return self._db.run(work, idempotent=True)
