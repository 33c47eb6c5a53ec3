"""Table topics (icelog.archive.layout=table): Fluss's layout, partition and bucket rules, forwarded properties.

Real broker, confluent-kafka clients (its own ProtobufSerializer and AdminClient), real Spark archiver, the
tables read back with Spark SQL and pyiceberg. The bucket rule is checked against Spark's `system.bucket`.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.meta.store import MetadataStore
from icelog.table.rules import bucket_of
from tests.support.archive import create_topic, produce, table, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

# The produced message is the second: the table's columns must be Order's, not Helper's.
PROTO = """
syntax = "proto3";
package tl;
message Helper { string note = 1; }
message Order {
  int64 order_id = 1;
  string customer = 2;
  int32 amount = 3;
  bytes tag = 4;
  double ratio = 5;
}
message OrderKey { string region = 1; int64 shop = 2; }
"""
PROTO_V2 = PROTO.replace("  double ratio = 5;\n", "  double ratio = 5;\n  string region = 6;\n")
SYSTEM_TAIL = ["__key", "__value", "__value_prefix", "__value_err", "__headers", "__batch_start", "__bucket",
               "__offset", "__timestamp"]


@pytest.fixture(scope="module")
def tl_pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The application's generated module, compiled with grpcio-tools' protoc at test time."""
    out = tmp_path_factory.mktemp("tl_pb")
    (out / "tl_order.proto").write_text(PROTO)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}", "tl_order.proto"],
                   check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("tl_order_pb2")
    finally:
        sys.path.remove(str(out))


def catalog_table(settings: Settings, topic: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    return catalog.load_table(("icelog", topic))


def spec_of(iceberg_table: Any) -> list[tuple[str, str]]:
    schema = iceberg_table.schema()
    return [(str(f.transform), schema.find_column_name(f.source_id)) for f in iceberg_table.spec().fields]


def sort_of(iceberg_table: Any) -> list[tuple[str, str]]:
    schema = iceberg_table.schema()
    return [(schema.find_column_name(f.source_id), str(f.direction).lower()) for f in iceberg_table.sort_order().fields]


def orders(tl_pb: ModuleType, n: int, start: int = 0) -> list[Any]:
    return [tl_pb.Order(order_id=start + i * 7919, customer=f"c{i % 3}", amount=i, tag=bytes([i % 256]),
                        ratio=i / 4) for i in range(n)]


def serializer(lake_broker: BrokerProcess, tl_pb: ModuleType, topic: str) -> Any:
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    serialize = ProtobufSerializer(tl_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda order: serialize(order, ctx)


def send(lake_broker: BrokerProcess, topic: str, records: list[tuple[bytes | None, bytes | None, int]]) -> list[Any]:
    """Produce (key, value, partition) records; the delivery errors (None for each delivered record)."""
    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 5})
    for key, value, partition in records:
        producer.produce(topic, key=key, value=value, partition=partition,
                         on_delivery=lambda err, _msg: outcomes.append(err))
    assert producer.flush(30) == 0
    return outcomes


def produce_error_message(lake_broker: BrokerProcess, topic: str, partition: int, value: bytes) -> str:
    """The error message of a Produce v8 of one record (kafka-python's protocol classes over TCP)."""
    from kafka.protocol.producer import ProduceRequest, ProduceResponse
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from tests.support.wire_client import RawClient

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, 1_700_000_000_000, None, value, [])
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=bytes(builder.build()))])])
    client = RawClient(lake_broker.bootstrap)
    try:
        part = client.request(request, 8, ProduceResponse).responses[0].partition_responses[0]
    finally:
        client.close()
    assert part.error_code == KafkaError.INVALID_RECORD and part.base_offset == -1
    return str(part.error_message)


def test_table_layout_with_protobuf_schema(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    tl_pb: ModuleType,
) -> None:
    topic = "tl-orders"
    create_topic(lake_broker, topic, 3, {"icelog.archive.layout": "table"})
    value_of = serializer(lake_broker, tl_pb, topic)
    sent = orders(tl_pb, 30)
    assert send(lake_broker, topic, [(f"k{i}".encode(), value_of(o), i % 3) for i, o in enumerate(sent)]) == [None] * 30
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 30

    frame = lake_spark.sql(f"SELECT * FROM {table(topic)}")
    assert frame.columns == ["order_id", "customer", "amount", "tag", "ratio", *SYSTEM_TAIL]
    rows = frame.orderBy("order_id").collect()
    assert [(r.order_id, r.customer, r.amount, bytes(r.tag), r.ratio, bytes(r["__key"])) for r in rows] == [
        (o.order_id, o.customer, o.amount, o.tag, o.ratio, f"k{i}".encode()) for i, o in enumerate(sent)
    ]
    assert {r["__bucket"] for r in rows} == {0, 1, 2} and all(r["__value_err"] is None for r in rows)
    # Lossless rows do not keep the payload twice: the columns and __value_prefix rebuild it (invariant test).
    assert all(r["__value"] is None and r["__value_prefix"] is not None for r in rows)

    iceberg_table = catalog_table(lake_settings, topic)
    names = [f.name for f in iceberg_table.schema().fields]
    assert names[-3:] == ["__bucket", "__offset", "__timestamp"]
    assert str(iceberg_table.schema().find_field("__timestamp").field_type) == "timestamptz"
    assert spec_of(iceberg_table) == [("identity", "__bucket")]
    assert sort_of(iceberg_table) == [("__offset", "asc")]
    assert iceberg_table.properties["icelog.layout"] == "table-v1"
    assert iceberg_table.scan(selected_fields=("order_id",)).to_arrow().num_rows == 30
    ids_before = {f.name: f.field_id for f in iceberg_table.schema().fields}

    # Evolution: a new field becomes a column before the layout's own; every id stays.
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    registry.register_schema(f"{topic}-value", Schema(PROTO_V2, "PROTOBUF"))
    assert send(lake_broker, topic, [(b"late", value_of(sent[0]), 0)]) == [None]
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 1
    evolved = catalog_table(lake_settings, topic).schema()
    assert [f.name for f in evolved.fields] == ["order_id", "customer", "amount", "tag", "ratio", "region",
                                                *SYSTEM_TAIL]
    assert {f.name: f.field_id for f in evolved.fields if f.name != "region"} == ids_before
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)}").collect()[0].n == 31


def test_table_layout_without_schema(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = "tl-raw"
    create_topic(lake_broker, topic, 3, {"icelog.archive.layout": "table", "icelog.intake.retention.ms": "0"})
    sent = produce(lake_broker, topic, 120, partitions=3)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 120
    frame = lake_spark.sql(f"SELECT * FROM {table(topic)}")
    assert frame.columns == ["__key", "__value", "__headers", "__batch_start", "__bucket", "__offset", "__timestamp"]
    got = [
        (r["__bucket"], r["__offset"], r["__key"] and bytes(r["__key"]), r["__value"] and bytes(r["__value"]),
         tuple((h["key"], h["value"] and bytes(h["value"])) for h in r["__headers"]))
        for r in frame.orderBy("__bucket", "__offset").collect()
    ]
    assert got == [(p, o, k, v, h) for p, o, k, v, h, _ts in sent]
    iceberg_table = catalog_table(lake_settings, topic)
    assert spec_of(iceberg_table) == [("identity", "__bucket")] and sort_of(iceberg_table) == [("__offset", "asc")]

    # Read-back serves the table layout too: the archived intake goes, consumers read the table, byte for byte.
    ends = {p: max(o for q, o, *_ in sent if q == p) + 1 for p in range(3)}
    topic_id = lake_store.get_topic(topic).topic_id
    wait_for(lambda: [p.log_start_offset for p in lake_store.partitions(topic_id)] == [ends[p] for p in range(3)], 60)
    consumer = Consumer({"bootstrap.servers": lake_broker.bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    read: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while len(read) < len(sent) and time.monotonic() < deadline:
        msg = consumer.poll(1)
        if msg is not None and msg.error() is None:
            read.append((msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()),
                         msg.timestamp()[1] * 1000))
    consumer.close()
    assert sorted(read) == sorted(sent)

def test_partition_column_waits_for_its_schema(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, tl_pb: ModuleType,
) -> None:
    """Created before its schema: accepted; the archive pass says why it waits, then archives once it is there."""
    topic = "tl-early"
    # (The message is named: a raw payload first would leave the table's message to the schema's first one.)
    create_topic(lake_broker, topic, 1, {"icelog.archive.layout": "table", "icelog.table.partition.by": "customer",
                                         "icelog.schema.value.message": "tl.Order"})
    assert send(lake_broker, topic, [(None, b"not yet a schema", 0)]) == [None]
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert "icelog.table.partition.by names 'customer'" in result.error and result.records == 0
    value_of = serializer(lake_broker, tl_pb, topic)  # registers the subject
    assert send(lake_broker, topic, [(None, value_of(o), 0) for o in orders(tl_pb, 3)]) == [None] * 3
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 4
    rows = lake_spark.sql(f"SELECT customer, __value_err FROM {table(topic)} ORDER BY __offset").collect()
    assert [r.customer for r in rows[1:]] == ["c0", "c1", "c2"] and rows[0]["__value_err"] is not None


def test_key_with_a_schema_and_bucket_key_on_a_key_field(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    tl_pb: ModuleType,
) -> None:
    topic = "tl-keyed"
    create_topic(lake_broker, topic, 3, {"icelog.archive.layout": "table", "icelog.table.bucket.key": "shop"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    key_ctx = SerializationContext(topic, MessageField.KEY)
    serialize_key = ProtobufSerializer(tl_pb.OrderKey, registry, {"use.deprecated.format": False})
    value_of = serializer(lake_broker, tl_pb, topic)
    keys = [tl_pb.OrderKey(region=f"r{i % 2}", shop=1000 + i) for i in range(12)]
    records = [(serialize_key(k, key_ctx), value_of(o), bucket_of("long", k.shop, 3))
               for k, o in zip(keys, orders(tl_pb, 12), strict=True)]
    assert set(send(lake_broker, topic, records)) == {None}
    [refused] = send(lake_broker, topic, [(records[0][0], records[0][1], (records[0][2] + 1) % 3)])
    assert refused is not None and refused.code() == KafkaError.INVALID_RECORD
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 12
    frame = lake_spark.sql(f"SELECT * FROM {table(topic)}")
    assert frame.columns == ["region", "shop", "order_id", "customer", "amount", "tag", "ratio", "__key",
                             "__key_err", *SYSTEM_TAIL[1:]]
    got = sorted((r.shop, r.region, r.amount, r["__bucket"], bytes(r["__key"])) for r in frame.collect())
    assert got == [(k.shop, k.region, i, bucket_of("long", k.shop, 3), records[i][0]) for i, k in enumerate(keys)]
    assert spec_of(catalog_table(lake_settings, topic)) == [("bucket[3]", "shop")]


def test_partition_by_columns_then_bucket(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    tl_pb: ModuleType,
) -> None:
    topic = "tl-by-customer"
    create_topic(lake_broker, topic, 2, {"icelog.archive.layout": "table", "icelog.table.partition.by": "customer"})
    value_of = serializer(lake_broker, tl_pb, topic)
    sent = orders(tl_pb, 24)
    assert set(send(lake_broker, topic, [(None, value_of(o), i % 2) for i, o in enumerate(sent)])) == {None}
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 24
    iceberg_table = catalog_table(lake_settings, topic)
    assert spec_of(iceberg_table) == [("identity", "customer"), ("identity", "__bucket")]
    # One data file per (customer, bucket): three customers over two partitions.
    partitions = lake_spark.sql(f"SELECT partition.customer AS c, partition.__bucket AS b FROM {table(topic)}.files")
    assert {(r.c, r.b) for r in partitions.collect()} == {(f"c{j}", p) for j in range(3) for p in range(2)}
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)} WHERE customer = 'c1'").collect()[0].n == 8


def test_bucket_key_keeps_kafka_partitions_equal_to_iceberg_buckets(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    tl_pb: ModuleType,
) -> None:
    topic = "tl-bucketed"
    create_topic(lake_broker, topic, 4, {"icelog.archive.layout": "table", "icelog.table.bucket.key": "order_id"})
    value_of = serializer(lake_broker, tl_pb, topic)
    sent = orders(tl_pb, 40)
    # The partitioner of docs/table-layout.md: Iceberg's bucket of the column, computed by the producer.
    assert set(send(lake_broker, topic, [(None, value_of(o), bucket_of("long", o.order_id, 4)) for o in sent])) == {
        None
    }

    wrong = sent[0]
    right = bucket_of("long", wrong.order_id, 4)
    [refused] = send(lake_broker, topic, [(None, value_of(wrong), (right + 1) % 4)])
    assert refused is not None and refused.code() == KafkaError.INVALID_RECORD
    # (librdkafka does not surface the broker's message: read it from the Produce response itself.)
    message = produce_error_message(lake_broker, topic, (right + 1) % 4, value_of(wrong))
    assert f"order_id={wrong.order_id} belongs in partition {right}" in message

    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 40  # the refused record was not stored
    iceberg_table = catalog_table(lake_settings, topic)
    assert spec_of(iceberg_table) == [("bucket[4]", "order_id")]
    assert sort_of(iceberg_table) == [("__offset", "asc")]
    mismatched = lake_spark.sql(
        f"SELECT count(*) AS n FROM {table(topic)} WHERE lake.system.bucket(4, order_id) != __bucket"
    ).collect()[0].n
    assert mismatched == 0

    # The key's bytes, without any schema.
    keyed = "tl-bucketed-key"
    create_topic(lake_broker, keyed, 3, {"icelog.archive.layout": "table", "icelog.table.bucket.key": "__key",
                                         "icelog.schema.value": "none"})
    keys = [f"user-{i}".encode() for i in range(20)]
    assert set(send(lake_broker, keyed, [(k, b"v", bucket_of("binary", k, 3)) for k in keys])) == {None}
    [refused] = send(lake_broker, keyed, [(keys[0], b"v", (bucket_of("binary", keys[0], 3) + 1) % 3)])
    assert refused is not None and refused.code() == KafkaError.INVALID_RECORD
    [refused] = send(lake_broker, keyed, [(None, b"v", 0)])
    assert refused is not None and refused.code() == KafkaError.INVALID_RECORD  # a null key has no bucket
    [result] = lake_archiver.run_pass(force=True, topics=[keyed])
    assert result.error == "" and result.records == 20
    assert spec_of(catalog_table(lake_settings, keyed)) == [("bucket[3]", "__key")]

    # Partitions of a bucket-key topic cannot be added: they are the spec's buckets.
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    with pytest.raises(KafkaException) as info:
        admin.create_partitions([NewPartitions(topic, 8)])[topic].result(30)
    assert info.value.args[0].code() == KafkaError.INVALID_PARTITIONS


def test_bucket_function_is_sparks(lake_spark: Any) -> None:
    """pyiceberg's bucket function (produce-time check, docs/table-layout.md's partitioner) against system.bucket."""
    cases: list[tuple[str, str, Any]] = []
    for n in (-(2**31), -7, 0, 1, 34, 2**31 - 1):
        cases.append(("int", f"CAST({n} AS INT)", n))
    for n in (-(2**63), -1, 0, 34, 2**40 + 3, 2**63 - 1):
        cases.append(("long", f"CAST({n} AS BIGINT)", n))
    for text in ("", "iceberg", "é ünïcode", "x" * 300):
        cases.append(("string", "'" + text + "'", text))
    for data in (b"", b"\x00\x01\x02\x03", bytes(range(256))):
        cases.append(("binary", f"X'{data.hex()}'", data))
    for buckets in (1, 3, 16, 1000):
        expressions = ", ".join(f"lake.system.bucket({buckets}, {sql}) AS c{i}" for i, (_t, sql, _v) in
                                enumerate(cases))
        row = lake_spark.sql(f"SELECT {expressions}").collect()[0]
        assert [bucket_of(t, v, buckets) for t, _sql, v in cases] == list(row), buckets


def test_bad_table_configs_are_refused(lake_broker: BrokerProcess, tl_pb: ModuleType) -> None:
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    registry.register_schema("tl-bad-value", Schema(PROTO, "PROTOBUF"))
    table_layout = {"icelog.archive.layout": "table"}
    bad = {
        "several bucket keys": {**table_layout, "icelog.table.bucket.key": "order_id,customer"},
        "a type Iceberg cannot bucket": {**table_layout, "icelog.table.bucket.key": "ratio"},
        "a missing column": {**table_layout, "icelog.table.partition.by": "nope"},
        "a missing bucket column": {**table_layout, "icelog.table.bucket.key": "nope"},
        "the record layout": {"icelog.table.partition.by": "customer"},
        "an unknown layout": {"icelog.archive.layout": "columns"},
        "an icelog property": {"iceberg.icelog.layout": "x"},
    }
    for why, configs in bad.items():
        future = admin.create_topics([NewTopic("tl-bad", 2, config=configs)])["tl-bad"]
        with pytest.raises(KafkaException) as info:
            future.result(30)
        assert info.value.args[0].code() == KafkaError.INVALID_CONFIG, why
    message = info.value.args[0].str()
    assert "icelog" in message
    future = admin.create_topics([NewTopic("tl-bad", 2, config=bad["a type Iceberg cannot bucket"])])["tl-bad"]
    with pytest.raises(KafkaException, match="cannot bucket"):
        future.result(30)
    future = admin.create_topics([NewTopic("tl-bad", 2, config=bad["several bucket keys"])])["tl-bad"]
    with pytest.raises(KafkaException, match="one bucket key"):
        future.result(30)

    # Good configs are accepted; the layout cannot change once the topic exists.
    create_topic(lake_broker, "tl-bad", 2, {**table_layout, "icelog.table.bucket.key": "order_id"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "tl-bad", incremental_configs=[
        ConfigEntry("icelog.archive.layout", "record", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException, match="fixed when the topic is created"):
        admin.incremental_alter_configs([resource])[resource].result(30)


def test_iceberg_properties_follow_topic_configs(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_settings: Settings,
) -> None:
    topic = "tl-props"
    create_topic(lake_broker, topic, 1, {
        "icelog.archive.layout": "table", "iceberg.write.target-file-size-bytes": "1048576",
        "iceberg.commit.retry.num-retries": "7", "retention.ms": "3600000",
    })
    produce(lake_broker, topic, 10, partitions=1)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == ""
    properties = catalog_table(lake_settings, topic).properties
    assert properties["write.target-file-size-bytes"] == "1048576"
    assert properties["commit.retry.num-retries"] == "7"
    assert properties["icelog.retention.ms"] == "3600000"
    assert properties["icelog.icelog.archive.layout"] == "table"

    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("iceberg.commit.retry.num-retries", "9", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("iceberg.write.target-file-size-bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("iceberg.write.metadata.metrics.default", "full", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    admin.incremental_alter_configs([resource])[resource].result(30)
    produce(lake_broker, topic, 5, partitions=1, tag="more")
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.error == "" and result.records == 5
    properties = catalog_table(lake_settings, topic).properties
    assert properties["commit.retry.num-retries"] == "9"
    assert properties["write.metadata.metrics.default"] == "full"
    assert properties["write.target-file-size-bytes"] == str(1024**3)  # back to the layout's own value
    assert "icelog.retention.ms" not in properties
