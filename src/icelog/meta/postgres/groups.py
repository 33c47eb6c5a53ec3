"""The ConsumerOffsets slice on PostgreSQL: consumer groups' committed offsets (Kafka's `__consumer_offsets`)."""

from __future__ import annotations

from collections.abc import Iterable

from icelog.meta.postgres.database import PostgresDatabase
from icelog.meta.store import CommittedOffset, ConsumerOffsets, GroupOffsets


class PostgresGroups(ConsumerOffsets):
    """ConsumerOffsets over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def commit_offsets(self, group_id: str, offsets: GroupOffsets) -> None:
        self._db.many(
            "INSERT INTO group_offsets VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) "
            "DO UPDATE SET committed_offset = excluded.committed_offset, metadata = excluded.metadata, "
            "commit_timestamp = excluded.commit_timestamp",
            [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()],
        )

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
