"""The TopicCatalog slice on PostgreSQL: topics, their explicitly set configs and their partitions' rows.

Changes of one topic lock its row (`FOR UPDATE`), so concurrent callers serialise as behind SQLite's one writer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from icelog.errors import StoreError, TopicExistsError, UnknownTopicError
from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.store import PartitionRecord, TopicCatalog, TopicRecord

_TOPIC_QUERY = (
    "SELECT t.name, t.topic_id, t.partitions, "
    "COALESCE(json_object_agg(c.key, c.value) FILTER (WHERE c.key IS NOT NULL), '{}'::json) "
    "FROM topics t LEFT JOIN topic_configs c ON c.topic_id = t.topic_id"
)

# A topic's rows in every table keyed by topic id, dropped with it.
_TOPIC_TABLES = ("topic_configs", "partitions", "intake_chunks", "archive_state", "producer_snapshots")


def _topic(conn: Connection, name: str, lock: bool = False) -> TopicRecord | None:
    # lock: the topic row, so concurrent changes of one topic run one after the other
    if lock and conn.execute("SELECT 1 FROM topics WHERE name = %s FOR UPDATE", (name,)).fetchone() is None:
        return None
    row = conn.execute(f"{_TOPIC_QUERY} WHERE t.name = %s GROUP BY t.name, t.topic_id", (name,)).fetchone()
    return None if row is None else TopicRecord(row[0], row[1], row[2], dict(row[3]))


def _require(conn: Connection, name: str, lock: bool = False) -> TopicRecord:
    topic = _topic(conn, name, lock)
    if topic is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    return topic


class PostgresTopics(TopicCatalog):
    """TopicCatalog over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> TopicRecord:
        if partitions < 1:
            raise StoreError("a topic needs at least one partition")
        topic_id = uuid.uuid4()

        def work(conn: Connection) -> TopicRecord:
            inserted = conn.execute(
                "INSERT INTO topics VALUES (%s, %s, %s) ON CONFLICT (name) DO NOTHING", (name, topic_id, partitions)
            ).rowcount
            if not inserted:
                raise TopicExistsError(f"topic {name!r} already exists")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO topic_configs VALUES (%s, %s, %s)",
                                [(topic_id, k, v) for k, v in configs.items()])
                cur.executemany("INSERT INTO partitions (topic_id, partition) VALUES (%s, %s)",
                                [(topic_id, p) for p in range(partitions)])
            return TopicRecord(name, topic_id, partitions, dict(configs))

        return self._db.run(work)

    def delete_topic(self, name: str) -> TopicRecord:
        def work(conn: Connection) -> TopicRecord:
            topic = _require(conn, name, lock=True)
            conn.execute("DELETE FROM topics WHERE topic_id = %s", (topic.topic_id,))
            for table in _TOPIC_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE topic_id = %s", (topic.topic_id,))
            for offsets in ("group_offsets", "txn_offsets"):  # every group's, committed or pending, as Kafka
                conn.execute(f"DELETE FROM {offsets} WHERE topic = %s", (name,))
            return topic

        return self._db.run(work)

    def add_partitions(self, name: str, total: int) -> TopicRecord:
        def work(conn: Connection) -> TopicRecord:
            topic = _require(conn, name, lock=True)
            if total <= topic.partitions:
                raise StoreError(f"topic {name!r} has {topic.partitions} partitions; {total} is not more")
            conn.execute("UPDATE topics SET partitions = %s WHERE name = %s", (total, name))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO partitions (topic_id, partition) VALUES (%s, %s)",
                                [(topic.topic_id, p) for p in range(topic.partitions, total)])
            return _require(conn, name)

        return self._db.run(work)

    def alter_topic_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str] = ()
    ) -> TopicRecord:
        delete_keys = list(delete_keys)

        def work(conn: Connection) -> TopicRecord:
            topic = _require(conn, name, lock=True)
            with conn.cursor() as cur:
                cur.executemany("DELETE FROM topic_configs WHERE topic_id = %s AND key = %s",
                                [(topic.topic_id, k) for k in delete_keys])
                cur.executemany(
                    "INSERT INTO topic_configs VALUES (%s, %s, %s) ON CONFLICT (topic_id, key) "
                    "DO UPDATE SET value = excluded.value",
                    [(topic.topic_id, k, v) for k, v in set_configs.items()],
                )
            return _require(conn, name)

        return self._db.run(work)

    def get_topic(self, name: str) -> TopicRecord | None:
        return self._db.run(lambda conn: _topic(conn, name), transaction=False, idempotent=True)

    def list_topics(self) -> list[TopicRecord]:
        rows = self._db.rows(f"{_TOPIC_QUERY} GROUP BY t.name, t.topic_id ORDER BY t.name")
        return [TopicRecord(r[0], r[1], r[2], dict(r[3])) for r in rows]

    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        rows = self._db.rows(
            "SELECT partition, log_start_offset, high_watermark, intake_chunks, intake_bytes, retention_start_offset "
            "FROM partitions WHERE topic_id = %s ORDER BY partition",
            (topic_id,),
        )
        return [PartitionRecord(topic_id, *row) for row in rows]
