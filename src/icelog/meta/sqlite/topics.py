"""The TopicCatalog slice on SQLite: topics, their explicitly set configs and their partitions' rows."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable, Mapping

from icelog.errors import StoreError, TopicExistsError, UnknownTopicError
from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import PartitionRecord, TopicCatalog, TopicRecord

# A topic's rows in every table keyed by topic id, dropped with it.
_TOPIC_TABLES = ("topic_configs", "partitions", "intake_chunks", "archive_state", "producer_snapshots")


def _topic(conn: sqlite3.Connection, name: str) -> TopicRecord | None:
    row = conn.execute("SELECT topic_id, partitions FROM topics WHERE name = ?", (name,)).fetchone()
    if row is None:
        return None
    configs = dict(conn.execute("SELECT key, value FROM topic_configs WHERE topic_id = ?", (row[0],)))
    return TopicRecord(name, uuid.UUID(row[0]), row[1], configs)


def _require(conn: sqlite3.Connection, name: str) -> TopicRecord:
    topic = _topic(conn, name)
    if topic is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    return topic


class SqliteTopics(TopicCatalog):
    """TopicCatalog over the store's SqliteDatabase."""

    _db: SqliteDatabase

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> TopicRecord:
        if partitions < 1:
            raise StoreError("a topic needs at least one partition")
        with self._db.tx(durable=True) as conn:
            if _topic(conn, name) is not None:
                raise TopicExistsError(f"topic {name!r} already exists")
            topic_id = uuid.uuid4()
            conn.execute("INSERT INTO topics VALUES (?, ?, ?)", (name, str(topic_id), partitions))
            conn.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)", [(str(topic_id), k, v) for k, v in configs.items()]
            )
            conn.executemany(
                "INSERT INTO partitions (topic_id, partition) VALUES (?, ?)",
                [(str(topic_id), p) for p in range(partitions)],
            )
            return TopicRecord(name, topic_id, partitions, dict(configs))

    def delete_topic(self, name: str) -> TopicRecord:
        with self._db.tx(durable=True) as conn:
            topic = _require(conn, name)
            tid = str(topic.topic_id)
            conn.execute("DELETE FROM topics WHERE topic_id = ?", (tid,))
            for table in _TOPIC_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE topic_id = ?", (tid,))
            for offsets in ("group_offsets", "txn_offsets"):  # every group's, committed or pending, as Kafka
                conn.execute(f"DELETE FROM {offsets} WHERE topic = ?", (name,))
            return topic

    def add_partitions(self, name: str, total: int) -> TopicRecord:
        with self._db.tx(durable=True) as conn:
            topic = _require(conn, name)
            if total <= topic.partitions:
                raise StoreError(f"topic {name!r} has {topic.partitions} partitions; {total} is not more")
            conn.execute("UPDATE topics SET partitions = ? WHERE name = ?", (total, name))
            conn.executemany(
                "INSERT INTO partitions (topic_id, partition) VALUES (?, ?)",
                [(str(topic.topic_id), p) for p in range(topic.partitions, total)],
            )
            return _require(conn, name)

    def alter_topic_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str] = ()
    ) -> TopicRecord:
        with self._db.tx(durable=True) as conn:
            topic = _require(conn, name)
            tid = str(topic.topic_id)
            conn.executemany(
                "DELETE FROM topic_configs WHERE topic_id = ? AND key = ?", [(tid, k) for k in delete_keys]
            )
            conn.executemany(
                "INSERT OR REPLACE INTO topic_configs VALUES (?, ?, ?)",
                [(tid, k, v) for k, v in set_configs.items()],
            )
            return _require(conn, name)

    def get_topic(self, name: str) -> TopicRecord | None:
        with self._db.lock:
            return _topic(self._db.conn, name)

    def list_topics(self) -> list[TopicRecord]:
        with self._db.lock:  # one view of every topic: no write of this process in between
            names = [r[0] for r in self._db.conn.execute("SELECT name FROM topics ORDER BY name")]
            return [_require(self._db.conn, n) for n in names]

    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        rows = self._db.rows(
            "SELECT partition, log_start_offset, high_watermark, intake_chunks, intake_bytes, "
            "retention_start_offset FROM partitions WHERE topic_id = ? ORDER BY partition",
            (str(topic_id),),
        )
        return [PartitionRecord(topic_id, *row) for row in rows]
