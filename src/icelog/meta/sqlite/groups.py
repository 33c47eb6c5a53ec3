"""The ConsumerOffsets slice on SQLite: consumer groups' committed offsets (Kafka's `__consumer_offsets`)."""

from __future__ import annotations

from collections.abc import Iterable

from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import CommittedOffset, ConsumerOffsets, GroupOffsets


class SqliteGroups(ConsumerOffsets):
    """ConsumerOffsets over the store's SqliteDatabase; commits are durable (a client is answered about them)."""

    _db: SqliteDatabase

    def commit_offsets(self, group_id: str, offsets: GroupOffsets) -> None:
        rows = [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()]
        with self._db.tx(durable=True) as conn:
            conn.executemany("INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?, ?)", rows)

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
