"""Read-back of table topics (Fluss's layout) and primary-key (upsert) tables, and of a re-created topic.

A real broker, the real Spark archiver, the intake trimmed once archived (icelog.intake.retention.ms=0), then real
clients consuming from offset 0 over TCP: table-layout topics come back byte for byte (with and without a schema,
Protobuf values rebuilt from their columns, a Kafka partition spread over several Iceberg partitions or found
through a bucket key); a compacted topic comes back as after Kafka's log compaction (the latest record per key at
its original offset, tombstoned keys gone); a topic deleted and re-created under the same name never serves the
old topic's table.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.archive.archiver import Archiver
from icelog.meta.store import MetadataStore
from icelog.table.rules import bucket_of
from tests.archive.test_pk_tables import latest, send, three_passes
from tests.readback.test_readback import TRIM, archive_and_trim, produce_codecs, topic_id, wait_trimmed
from tests.support.archive import ARCHIVE_ENV, wait_for
from tests.support.broker import BrokerProcess
from tests.support.clients_util import CLIENTS, ConfluentClient, Rec, comparable, create_topic, now_ms, sample_records
from tests.table.test_table_layout import PROTO, orders, tl_pb  # noqa: F401  (tl_pb: the module's fixture)

pytestmark = pytest.mark.slow

TABLE = {**TRIM, "icelog.archive.layout": "table"}


def status_rows(broker: BrokerProcess, topic: str) -> list[dict[str, str]]:
    status = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(broker.data_dir)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **ARCHIVE_ENV})
    assert status.returncode == 0, status.stderr
    header = status.stdout.splitlines()[0].split()
    # zip stops at the header's end: a last error's words (the last column) are not compared
    return [dict(zip(header, line.split(), strict=False)) for line in status.stdout.splitlines()[1:]
            if line.split()[0] == topic]


def test_table_layout_without_a_schema_reads_back_byte_for_byte(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any
) -> None:
    topic = "rbt-raw"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs=TABLE)
    expected = produce_codecs(lake_broker, topic, 30, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    columns = lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`").columns
    assert columns[:2] == ["__key", "__value"] and "key" not in columns  # Fluss's layout, no schema
    for name in CLIENTS:
        got = CLIENTS[name].consume(lake_broker.bootstrap, topic, [0, 1], "earliest", len(expected))
        assert comparable([replace(r, log_append_time=False) for r in got]) == comparable(expected), name
    for row in status_rows(lake_broker, topic):
        end = max(r.offset for r in expected if r.partition == int(row["PARTITION"])) + 1
        assert (row["TABLE-OFFSETS"], row["INTAKE-START"], row["INTAKE-BYTES"]) == (f"0-{end - 1}", str(end), "0")


def produce_orders(broker: BrokerProcess, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for i, (key, value, partition) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=partition, headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0


def consume_all(broker: BrokerProcess, topic: str, partitions: list[int], count: int) -> list[Rec]:
    got = ConfluentClient().consume(broker.bootstrap, topic, partitions, "earliest", count)
    assert len(got) == count
    return sorted(got, key=lambda r: (r.partition, r.offset))


def test_protobuf_table_layout_with_a_bucket_key_rebuilds_keys_and_values(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    tl_pb: ModuleType,  # noqa: F811
) -> None:
    """Key and value with schemas, bucket(shop): values rebuilt from their columns, also after evolution."""
    topic = "rbt-proto"
    create_topic(lake_broker.bootstrap, topic, partitions=3, configs={**TABLE, "icelog.table.bucket.key": "shop"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    serialize_key = ProtobufSerializer(tl_pb.OrderKey, registry, {"use.deprecated.format": False})
    serialize_value = ProtobufSerializer(tl_pb.Order, registry, {"use.deprecated.format": False})
    key_ctx, value_ctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)

    def records(n: int, start: int) -> list[tuple[bytes | None, bytes, int]]:
        keys = [tl_pb.OrderKey(region=f"r{i % 2}", shop=start + i) for i in range(n)]
        return [(serialize_key(k, key_ctx), serialize_value(o, value_ctx), bucket_of("long", k.shop, 3))
                for k, o in zip(keys, orders(tl_pb, n, start), strict=True)]

    produce_orders(lake_broker, topic, records(45, 1000))
    before = consume_all(lake_broker, topic, [0, 1, 2], 45)
    archive_and_trim(lake_archiver, lake_store, topic, before)
    stored = lake_spark.sql(f"SELECT __value, __value_prefix FROM lake.icelog.`{topic}`").collect()
    assert all(r["__value"] is None and r["__value_prefix"] is not None for r in stored)  # stored once, as columns
    for name in ("confluent", "kafka-python", "kcat"):
        got = CLIENTS[name].consume(lake_broker.bootstrap, topic, [0, 1, 2], "earliest", 45)
        assert comparable(got) == comparable(before), name

    # The value schema evolves (a column is added); old rows rebuild with their own schema id, new ones too.
    # (Not PROTO_V2: its `region` would clash with the key's `region` column.)
    evolved = PROTO.replace("  double ratio = 5;\n", "  double ratio = 5;\n  string note = 6;\n")
    registry.register_schema(f"{topic}-value", Schema(evolved, "PROTOBUF"))
    produce_orders(lake_broker, topic, records(15, 5000))
    before = consume_all(lake_broker, topic, [0, 1, 2], 60)
    archive_and_trim(lake_archiver, lake_store, topic, before)
    assert "note" in lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`").columns
    assert comparable(consume_all(lake_broker, topic, [0, 1, 2], 60)) == comparable(before)


def test_partition_by_spreads_a_kafka_partition_over_files_read_back_in_order(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    tl_pb: ModuleType,  # noqa: F811
) -> None:
    """identity(customer), identity(__bucket): one producer batch's records land in three files; they merge back."""
    topic = "rbt-by-customer"
    create_topic(lake_broker.bootstrap, topic, partitions=2,
                 configs={**TABLE, "icelog.table.partition.by": "customer"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    serialize = ProtobufSerializer(tl_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce_orders(lake_broker, topic, [(f"k{i}".encode() if i % 4 else None, serialize(o, ctx), i % 2)
                                        for i, o in enumerate(orders(tl_pb, 60))])
    before = consume_all(lake_broker, topic, [0, 1], 60)
    archive_and_trim(lake_archiver, lake_store, topic, before)
    files = lake_spark.sql(f"SELECT partition.__bucket AS b FROM lake.icelog.`{topic}`.files").collect()
    assert sorted(r.b for r in files) == [0, 0, 0, 1, 1, 1]  # each Kafka partition's rows in three files
    for name in ("confluent", "aiokafka"):
        got = CLIENTS[name].consume(lake_broker.bootstrap, topic, [0, 1], "earliest", 60)
        assert comparable(got) == comparable(before), name
    # A seek into the middle of the table starts at the record asked for.
    middle = ConfluentClient().consume(lake_broker.bootstrap, topic, [1], 17, 5)
    assert comparable(middle) == comparable([r for r in before if r.partition == 1 and r.offset >= 17][:5])


def compacted(records: list[tuple[int, int, bytes, bytes | None]]) -> list[tuple[int, int, bytes, bytes]]:
    """What a consumer of a compacted log reads: the latest record per key, at its offset, in offset order."""
    return sorted((p, o, k, v) for k, (v, p, o) in latest(records).items())


@pytest.mark.parametrize("layout", ["table", "record"])
def test_compacted_topic_reads_back_as_after_log_compaction(
    layout: str, lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = f"rbt-compacted-{layout}"
    create_topic(lake_broker.bootstrap, topic, partitions=3,
                 configs={**TRIM, "cleanup.policy": "compact", "icelog.archive.layout": layout,
                          "delete.retention.ms": "0"})
    produced: list[tuple[int, int, bytes, bytes | None]] = []
    for batch in three_passes(lake_broker, topic):
        produced += send(lake_broker, topic, batch)
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert result.error == "", result.error
    # Trimmed through the last record, tombstones included: the table's commits cover them.
    wait_trimmed(lake_store, topic, {p: max(o for q, o, *_ in produced if q == p) + 1 for p in range(3)})
    expected = compacted(produced)
    assert len(expected) < len(produced)
    for name in ("confluent", "kcat"):
        got = CLIENTS[name].consume(lake_broker.bootstrap, topic, [0, 1, 2], "earliest", len(expected))
        assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == expected, name
    # A consumer positioned on a replaced record's offset is served the next live one.
    live = [o for p, o, *_ in expected if p == 0]
    gap = min(o for p, o, *_ in produced if p == 0 and o not in live and o < live[-1])
    got = ConfluentClient().consume(lake_broker.bootstrap, topic, [0], gap, 1)
    assert [r.offset for r in got] == [min(o for o in live if o > gap)]

def test_retention_keeps_a_compacted_topics_keys_and_applies_with_compact_delete(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """Kafka ignores retention.ms on a topic whose cleanup.policy is compact alone: a key's latest record stays
    readable whatever its age. With compact,delete, retention drops old records too (here: whole table files)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    topics = {"compact": "rbt-retention-compact", "compact,delete": "rbt-retention-compact-delete"}
    old_ms = now_ms() - 3 * 3600_000
    for policy, topic in topics.items():
        create_topic(lake_broker.bootstrap, topic, partitions=1,
                     configs={**TRIM, "cleanup.policy": policy, "icelog.archive.layout": "table",
                              "delete.retention.ms": "0"})
        producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 5})
        for i in range(10):  # three hours old: offsets 0-9
            producer.produce(topic, key=b"k%d" % i, value=b"old-%d" % i, partition=0, timestamp=old_ms + i)
        assert producer.flush(30) == 0
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert result.error == "", result.error
        for i in range(5):  # keys k0-k4 again, now: offsets 10-14
            producer.produce(topic, key=b"k%d" % i, value=b"new-%d" % i, partition=0)
        assert producer.flush(30) == 0
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert result.error == "", result.error
        wait_trimmed(lake_store, topic, {0: 15})
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    for topic in topics.values():  # one hour: the first pass's file holds only older records
        entry = ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource("topic", topic, incremental_configs=[entry])
        admin.incremental_alter_configs([resource])[resource].result(30)

    # compact,delete: retention drops the old file, so k5-k9 are gone as Kafka's delete policy drops old segments.
    wait_for(lambda: ConfluentClient().watermarks(lake_broker.bootstrap, topics["compact,delete"], 0) == (10, 15), 30)
    got = ConfluentClient().consume(lake_broker.bootstrap, topics["compact,delete"], [0], "earliest", 5)
    assert [(r.offset, r.key, r.value) for r in got] == [(10 + i, b"k%d" % i, b"new-%d" % i) for i in range(5)]
    # compact alone: the same retention passes left the log start where it was; every key's latest record is read.
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topics["compact"], 0) == (0, 15)
    got = ConfluentClient().consume(lake_broker.bootstrap, topics["compact"], [0], "earliest", 10)
    assert [(r.offset, r.key, r.value) for r in got] == (
        [(i, b"k%d" % i, b"old-%d" % i) for i in range(5, 10)] + [(10 + i, b"k%d" % i, b"new-%d" % i) for i in range(5)]
    )


def test_a_compacted_topics_tombstones_stay_readable_for_delete_retention_ms(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """The table holds no tombstones, so a compacted topic's archived intake stays for delete.retention.ms (Kafka
    keeps a tombstone that long after compaction): a consumer catching up within it still sees the delete."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    kept, sentinel = "rbt-tombstones-kept", "rbt-tombstones-sentinel"
    for topic, delete_retention in ((kept, "86400000"), (sentinel, "0")):
        create_topic(lake_broker.bootstrap, topic, partitions=1,
                     configs={**TRIM, "cleanup.policy": "compact", "delete.retention.ms": delete_retention})
        producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 5})
        for key, value in ((b"k1", b"v1"), (b"k2", b"v2"), (b"k1", None)):
            producer.produce(topic, key=key, value=value, partition=0)
        assert producer.flush(30) == 0
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert result.error == "", result.error
    wait_trimmed(lake_store, sentinel, {0: 3})  # retention passes ran: the sentinel's intake is gone
    got = ConfluentClient().consume(lake_broker.bootstrap, sentinel, [0], "earliest", 1)
    assert [(r.offset, r.key, r.value) for r in got] == [(1, b"k2", b"v2")]  # from the table: no tombstone

    # Within delete.retention.ms (a day): the intake is kept, and a consumer from the beginning reads the delete.
    assert lake_store.partitions(topic_id(lake_store, kept))[0].log_start_offset == 0
    got = ConfluentClient().consume(lake_broker.bootstrap, kept, [0], "earliest", 3)
    assert [(r.offset, r.key, r.value) for r in got] == [(0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k1", None)]

    # Past it (here: set to 0), the intake goes and the table serves the compacted log, tombstone gone.
    entry = ConfigEntry("delete.retention.ms", "0", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", kept, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)
    wait_trimmed(lake_store, kept, {0: 3})
    got = ConfluentClient().consume(lake_broker.bootstrap, kept, [0], "earliest", 1)
    assert [(r.offset, r.key, r.value) for r in got] == [(1, b"k2", b"v2")]


def test_a_re_created_topic_never_reads_the_old_topics_table(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "rbt-recreated"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    old = produce_codecs(lake_broker, topic, 6, 1)
    archive_and_trim(lake_archiver, lake_store, topic, old)
    old_id = topic_id(lake_store, topic)
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: lake_store.get_topic(topic) is None, 30)
    # Same name: the old table (kept: rows are never deleted by surprise) is not its log.
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    assert topic_id(lake_store, topic) != old_id
    records = sample_records(8, 1, seed=21, base_ts=now_ms() - 3_600_000)  # older than every old record
    ConfluentClient().produce(lake_broker.bootstrap, topic, records, codec="zstd")
    new = [replace(r, offset=i) for i, r in enumerate(records)]
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert f"holds the archive of a deleted topic (perhaps an older '{topic}')" in result.error  # archiver too
    # Nor does `icelog status` show the old table's offsets and bytes on the new topic's rows.
    [row] = status_rows(lake_broker, topic)
    assert (row["LOG-START"], row["TABLE-OFFSETS"], row["TABLE-BYTES"]) == ("0", "-", "-"), row
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (0, len(new))
    got = ConfluentClient().consume(lake_broker.bootstrap, topic, [0], "earliest", len(new))
    assert comparable(got) == comparable(new)
    # By timestamp: no record of the new topic is as late as the old ones (the old table would answer one).
    late = min(r.timestamp or 0 for r in old)
    assert CLIENTS["confluent"].offsets_for_times(lake_broker.bootstrap, topic, 0, [late, 0]) == [None, 0]


def test_a_topic_pointed_at_another_live_topics_table_is_refused_naming_that_topic(
    lake_broker: BrokerProcess, lake_archiver: Archiver
) -> None:
    owner, borrower = "rbt-owner", "rbt-borrower"
    create_topic(lake_broker.bootstrap, owner, partitions=1)
    produce_codecs(lake_broker, owner, 3, 1)
    [result] = lake_archiver.run_pass(force=True, topics=[owner])
    assert not result.error, result.error
    create_topic(lake_broker.bootstrap, borrower, partitions=1,
                 configs={"icelog.archive.iceberg.table": f"icelog.{owner}"})
    produce_codecs(lake_broker, borrower, 2, 1)
    [result] = lake_archiver.run_pass(force=True, topics=[borrower])
    assert f"holds the archive of topic '{owner}', which archives there" in result.error, result.error
    assert f"not of '{borrower}'" in result.error
    [row] = status_rows(lake_broker, borrower)
    assert (row["TABLE-OFFSETS"], row["TABLE-BYTES"]) == ("-", "-"), row  # not the owner's offsets
    [row] = status_rows(lake_broker, owner)
    assert row["TABLE-OFFSETS"] == f"0-{int(row['HIGH-WATERMARK']) - 1}", row


def test_max_timestamp_offset_spans_table_and_intake(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """ListOffsets MAX_TIMESTAMP (-3) over the whole log: the record with the largest timestamp is in the table."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    topic = "rbt-max-time"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    base = now_ms() - 600_000
    deltas = [0, 40, 90, 90, 10, 30]  # the largest timestamp twice: the first of them is the answer
    ConfluentClient().produce(lake_broker.bootstrap, topic, [Rec(0, None, b"v", (), base + d) for d in deltas])
    archive_and_trim(lake_archiver, lake_store, topic, [Rec(0, None, b"v", (), base + d, i) for i, d in
                                                         enumerate(deltas)])
    ConfluentClient().produce(lake_broker.bootstrap, topic, [Rec(0, None, b"w", (), base + 50)] * 3)  # intake
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})

    def max_timestamp() -> tuple[int, int]:
        (future,) = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.max_timestamp()}).values()
        result = future.result(30)
        return result.offset, result.timestamp

    assert max_timestamp() == (2, base + 90)
    ConfluentClient().produce(lake_broker.bootstrap, topic, [Rec(0, None, b"x", (), base + 95)])
    assert max_timestamp() == (9, base + 95)  # now in the intake
