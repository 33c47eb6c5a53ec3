"""The archive's promise, over every path at once: each row rebuilds the key, value and headers a consumer reads.

Records go in with confluent-kafka over TCP (its own ProtobufSerializer for a .proto whose produced message
is NOT the file's first), through every path of the archive: a raw topic; a schema topic with lossless rows,
rows that must keep `__raw__` (unknown fields, no envelope), a payload of another message than the table's,
payloads that do not decode, a schema id nobody can fetch (`on.parse.error=pass`); a `coerce` topic (the
broker adds the envelope). The real Spark archiver writes them; every row read back with Spark must rebuild,
byte for byte, what a confluent-kafka consumer reads from the broker at the same partition and offset.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.archive.archiver import Archiver
from icelog.archive.table_schema import message_property
from icelog.config import Settings
from icelog.lake import iceberg_java
from icelog.meta.store import MetadataStore
from icelog.schema.codec.rebuild import Rebuilder, rebuild_headers, rebuild_table_row
from icelog.schema.codec.registry_source import StoreSchemaSource
from icelog.schema.protobuf_schema import encode_envelope
from icelog.schema.registry_client import RegistryClient, SchemaNotFoundError
from tests.support.archive import create_topic, produce, table
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

# The produced message is the second one: an archiver following "the file's first message" would give the
# table Inner's columns and lose every Order field.
PROTO = """
syntax = "proto3";
package inv;
message Inner { string name = 1; int32 n = 2; }
message Order {
  int64 id = 1;
  string customer = 2;
  uint64 cents = 3;
  repeated string tags = 4;
  bool paid = 5;
  optional int32 priority = 6;
  bytes note = 7;
  Inner inner = 8;
}
"""

Read = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@pytest.fixture(scope="module")
def inv_pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The application's generated module, compiled with grpcio-tools' protoc at test time."""
    out = tmp_path_factory.mktemp("inv_pb")
    (out / "inv_order.proto").write_text(PROTO)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}", "inv_order.proto"],
                   check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("inv_order_pb2")
    finally:
        sys.path.remove(str(out))


def consume_all(broker: BrokerProcess, topic: str, partitions: int) -> dict[tuple[int, int], Read]:
    """What a consumer reads: (partition, offset) → (key, value, headers)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"inv-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: dict[tuple[int, int], Read] = {}
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "consumer timed out"
            if msg.error():
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            got[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), list(msg.headers() or []))
    finally:
        consumer.close()
    return got


def table_rows(spark: Any, topic: str) -> list[dict[str, Any]]:
    rows = spark.sql(f"SELECT key, value, headers, kafka.partition AS p, kafka.offset AS o FROM {table(topic)}")
    return [r.asDict(recursive=True) for r in rows.collect()]


def rebuilt(rows: list[dict[str, Any]], store: MetadataStore) -> dict[tuple[int, int], Read]:
    schemas = StoreSchemaSource(store)
    keys, values = Rebuilder(schemas), Rebuilder(schemas)
    return {
        (r["p"], r["o"]): (keys.payload(r["key"]), values.payload(r["value"]), rebuild_headers(r["headers"]))
        for r in rows
    }


def send(broker: BrokerProcess, topic: str, records: list[tuple[bytes | None, bytes | None, Any]],
         partition: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def test_every_archived_row_rebuilds_what_consumers_read(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_store: MetadataStore,
    inv_pb: ModuleType,
) -> None:
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    raw_topic, order_topic, coerce_topic = "inv-raw", "inv-orders", "inv-coerce"
    create_topic(lake_broker, raw_topic, 3)
    create_topic(lake_broker, order_topic, 2, {"icelog.schema.value.on.parse.error": "pass"})
    create_topic(lake_broker, coerce_topic, 1, {"icelog.schema.value.coerce": "true",
                                               "icelog.schema.value.message": "inv.Order"})

    # Raw topic: every codec, null keys and values, headers (tests/support/archive.py produce).
    produce(lake_broker, raw_topic, 200, partitions=3)

    # Schema topic, partition 0 first: Orders through confluent-kafka's own serializer (envelope indexes [1]).
    serialize = ProtobufSerializer(inv_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(order_topic, MessageField.VALUE)
    orders = []
    for i in range(40):
        order = inv_pb.Order(id=i - 20, customer=f"c{i} é", cents=2**64 - 1 - i, tags=[f"t{j}" for j in range(i % 3)],
                             paid=i % 2 == 0, note=bytes([i, 0, 255]))
        if i % 3:
            order.inner.name, order.inner.n = f"in{i}", i
        if i % 4 == 0:
            order.priority = 0  # proto3 optional set to its default: must stay set
        orders.append(order)
    send(lake_broker, order_topic, [(f"k{i}".encode(), serialize(o, ctx), [("i", str(i).encode())])
                                    for i, o in enumerate(orders)], partition=0)
    schema_id = registry.get_latest_version(f"{order_topic}-value").schema_id
    envelope = encode_envelope(schema_id, [1])
    body = orders[5].SerializeToString()
    odd = [
        (b"unknown-field", envelope + body + b"\xf8\x07\x2a", None),  # field 127: no column holds it
        (b"no-envelope", body, None),  # decoded with the table's message; schema id unknown later
        (b"inner", encode_envelope(schema_id, [0]) + inv_pb.Inner(name="x", n=1).SerializeToString(), None),
        (b"garbage", envelope + b"\xff\xff\xff", None),  # does not decode
        (b"no-such-schema", encode_envelope(987654, [0]) + body, None),  # nobody can fetch this id
        (None, None, [("tombstone", None)]),
        (b"empty-order", envelope, None),  # an Order with no field set
    ]
    send(lake_broker, order_topic, odd, partition=1)

    # coerce: plain Order bytes in; the broker adds the envelope, and that is what consumers read.
    registry.register_schema(f"{coerce_topic}-value", Schema(PROTO, "PROTOBUF"))
    send(lake_broker, coerce_topic, [(None, o.SerializeToString(), None) for o in orders[:10]], partition=0)

    results = lake_archiver.run_pass(force=True, topics={raw_topic, order_topic, coerce_topic})
    assert [r.error for r in results] == ["", "", ""], results

    for topic, partitions, count in ((raw_topic, 3, 200), (order_topic, 2, 40 + len(odd)), (coerce_topic, 1, 10)):
        read = consume_all(lake_broker, topic, partitions)
        rows = table_rows(lake_spark, topic)
        assert len(read) == count and len(rows) == count
        assert rebuilt(rows, lake_store) == read, topic

    # The table follows the produced message (Order), and lossless rows do not store the payload twice.
    order_rows = {(r["p"], r["o"]): r for r in table_rows(lake_spark, order_topic)}
    first = order_rows[(0, 1)]["value"]
    assert first["customer"] == "c1 é" and first["inner"] == {"name": "in1", "n": 1} and first["__raw__"] is None
    assert "name" not in first  # Inner's columns are not the table's
    by_key = {bytes(r["key"]["__raw__"]): r["value"] for r in order_rows.values() if r["key"] is not None}
    assert by_key[b"unknown-field"]["__raw__"] is not None and by_key[b"no-envelope"]["__raw__"] is not None
    assert "inv.Inner" in by_key[b"inner"]["__err__"] and by_key[b"inner"]["__raw__"] is not None
    assert by_key[b"garbage"]["__err__"] and by_key[b"no-such-schema"]["__err__"]
    # The choice is remembered on the table, so later payloads of other messages cannot flip its columns.
    order_table = lake_archiver.table_name(lake_archiver.topic_config(lake_store.get_topic(order_topic)))
    properties = iceberg_java.table_properties(iceberg_java.load_table(lake_spark, order_table))
    assert properties[message_property("value")] == "inv.Order"
    coerced = table_rows(lake_spark, coerce_topic)
    assert all(r["value"]["__prefix__"] is not None and r["value"]["__raw__"] is None for r in coerced)

    # The two schema sources agree: the store (embedded registry, what the archiver reads) and HTTP
    # (what it reads with registry_url), here against the broker's embedded registry.
    http, local = RegistryClient(lake_broker.registry_url), StoreSchemaSource(lake_store)
    for subject in (f"{order_topic}-value", f"{coerce_topic}-value"):
        over_http, in_store = http.latest(subject), local.latest(subject)
        assert over_http is not None and over_http == in_store
        assert http.versions(subject) == local.versions(subject) == [over_http.schema_id]
    assert http.latest("inv-no-such-subject") is None and local.latest("inv-no-such-subject") is None
    with pytest.raises(SchemaNotFoundError):
        http.by_id(987654)
    with pytest.raises(SchemaNotFoundError):
        local.by_id(987654)


def test_every_table_layout_row_rebuilds_what_consumers_read(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_store: MetadataStore,
    inv_pb: ModuleType,
) -> None:
    """The same promise for the table layout (top-level columns): raw, schema (odd payloads too), coerce."""
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    layout = {"icelog.archive.layout": "table"}
    raw_topic, order_topic, coerce_topic = "invt-raw", "invt-orders", "invt-coerce"
    create_topic(lake_broker, raw_topic, 3, layout)
    create_topic(lake_broker, order_topic, 2, {**layout, "icelog.schema.value.on.parse.error": "pass"})
    create_topic(lake_broker, coerce_topic, 1, {**layout, "icelog.schema.value.coerce": "true",
                                                "icelog.schema.value.message": "inv.Order"})
    produce(lake_broker, raw_topic, 150, partitions=3)

    serialize = ProtobufSerializer(inv_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(order_topic, MessageField.VALUE)
    orders = []
    for i in range(30):
        order = inv_pb.Order(id=i - 15, customer=f"c{i} é", cents=2**64 - 1 - i, tags=[f"t{j}" for j in range(i % 3)],
                             paid=i % 2 == 0, note=bytes([i, 0, 255]))
        if i % 3:
            order.inner.name, order.inner.n = f"in{i}", i
        if i % 4 == 0:
            order.priority = 0
        orders.append(order)
    send(lake_broker, order_topic, [(f"k{i}".encode(), serialize(o, ctx), [("i", str(i).encode())])
                                    for i, o in enumerate(orders)], partition=0)
    schema_id = registry.get_latest_version(f"{order_topic}-value").schema_id
    envelope = encode_envelope(schema_id, [1])
    body = orders[5].SerializeToString()
    odd = [
        (b"unknown-field", envelope + body + b"\xf8\x07\x2a", None),
        (b"no-envelope", body, None),
        (b"inner", encode_envelope(schema_id, [0]) + inv_pb.Inner(name="x", n=1).SerializeToString(), None),
        (b"garbage", envelope + b"\xff\xff\xff", None),
        (b"no-such-schema", encode_envelope(987654, [0]) + body, None),
        (None, None, [("tombstone", None)]),
        (b"empty-order", envelope, None),
    ]
    send(lake_broker, order_topic, odd, partition=1)
    registry.register_schema(f"{coerce_topic}-value", Schema(PROTO, "PROTOBUF"))
    send(lake_broker, coerce_topic, [(None, o.SerializeToString(), None) for o in orders[:10]], partition=0)

    results = lake_archiver.run_pass(force=True, topics={raw_topic, order_topic, coerce_topic})
    assert [r.error for r in results] == ["", "", ""], results

    schemas = StoreSchemaSource(lake_store)
    for topic, partitions, count in ((raw_topic, 3, 150), (order_topic, 2, 30 + len(odd)), (coerce_topic, 1, 10)):
        read = consume_all(lake_broker, topic, partitions)
        rows = [r.asDict(recursive=True) for r in lake_spark.sql(f"SELECT * FROM {table(topic)}").collect()]
        assert len(read) == count and len(rows) == count
        keys, values = Rebuilder(schemas), Rebuilder(schemas)
        assert {(r["__bucket"], r["__offset"]): rebuild_table_row(r, keys, values) for r in rows} == read, topic

    # The produced message's fields are top-level columns; lossless rows keep no __value.
    by_key = {bytes(r["__key"]): r for r in lake_spark.sql(f"SELECT * FROM {table(order_topic)}").collect()
              if r["__key"] is not None}
    first = by_key[b"k1"]
    assert first["customer"] == "c1 é" and first["inner"].asDict() == {"name": "in1", "n": 1}
    assert first["__value"] is None and first["__value_prefix"] is not None
    assert by_key[b"unknown-field"]["__value"] is not None and "inv.Inner" in by_key[b"inner"]["__value_err"]


def test_a_table_waits_for_payloads_to_name_their_message(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, inv_pb: ModuleType,
) -> None:
    """A topic whose subject exists before any record (schema registered, topic created, the archiver looks):
    the table is not made from the file's first message (Inner, a helper) but from the produced one (Order)."""
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    topic = "inv-early"
    registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(lake_broker, topic, 2, {"icelog.archive.layout": "table", "icelog.table.primary.key": "id"})
    [empty] = lake_archiver.run_pass(force=True, topics={topic})
    assert empty.error == "" and not lake_spark.catalog.tableExists(table(topic))

    serialize = ProtobufSerializer(inv_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    orders = [inv_pb.Order(id=i, customer=f"c{i}", cents=i) for i in range(4)]
    send(lake_broker, topic, [(None, serialize(o, ctx), None) for o in orders], partition=0)
    [result] = lake_archiver.run_pass(force=True, topics={topic})
    assert result.error == "" and result.records == 4
    columns = lake_spark.table(table(topic)).columns
    assert {"id", "customer", "cents", "inner"} <= set(columns) and not {"name", "n"} & set(columns), columns
    rows = {r["id"]: r["customer"] for r in lake_spark.sql(f"SELECT id, customer FROM {table(topic)}").collect()}
    assert rows == {i: f"c{i}" for i in range(4)}
    properties = iceberg_java.table_properties(iceberg_java.load_table(lake_spark, table(topic)))
    assert properties[message_property("value")] == "inv.Order"


@pytest.mark.parametrize("layout", ["record", "table"])
def test_tombstones_before_any_payload_do_not_choose_the_message(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, inv_pb: ModuleType, layout: str,
) -> None:
    """A compacted topic whose first records are tombstones (more than the peek's 100 payloads): no payload names
    the message, so the table must not be made with the file's first message (Inner, a helper): it waits as
    bytes, and the first pass whose payloads say Order gives it Order's columns, with no stray Inner ones."""
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    topic = f"inv-tomb-{layout}"
    registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(lake_broker, topic, 1, {"cleanup.policy": "compact", "icelog.archive.layout": layout})
    send(lake_broker, topic, [(f"gone{i}".encode(), None, None) for i in range(120)], partition=0)
    [first] = lake_archiver.run_pass(force=True, topics={topic})
    assert first.error == "" and first.records == 120

    serialize = ProtobufSerializer(inv_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    orders = [(f"k{i}".encode(), serialize(inv_pb.Order(id=i, customer=f"c{i}", cents=i), ctx), None)
              for i in range(4)]
    tombstones = [(f"again{i}".encode(), None, None) for i in range(120)]
    send(lake_broker, topic, tombstones + orders + [(b"k0", None, None)], partition=0)
    [second] = lake_archiver.run_pass(force=True, topics={topic})
    assert second.error == "" and second.records == 125

    columns = lake_spark.table(table(topic)).columns
    fields = set(columns) if layout == "table" else set(lake_spark.table(table(topic)).select("value.*").columns)
    assert {"id", "customer", "cents", "inner"} <= fields and not {"name", "n"} & fields, fields
    select = "__key AS k, id, customer" if layout == "table" else "key.__raw__ AS k, value.id, value.customer"
    rows = {bytes(r["k"]): (r["id"], r["customer"]) for r in lake_spark.sql(f"SELECT {select} FROM {table(topic)}")
            .collect()}
    assert rows == {f"k{i}".encode(): (i, f"c{i}") for i in (1, 2, 3)}
    properties = iceberg_java.table_properties(iceberg_java.load_table(lake_spark, table(topic)))
    assert properties[message_property("value")] == "inv.Order"


def test_every_upsert_table_row_rebuilds_the_latest_record_of_its_key(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_store: MetadataStore,
    inv_pb: ModuleType,
) -> None:
    """A compacted topic's table (workers write its files, lake/data_files.py) holds one row per live key: the
    record of the key's highest offset, rebuilt exactly as a consumer reads it (nested, repeated, optional,
    bytes, uint64 and header columns; odd payloads keep their bytes); a key whose latest record is a
    tombstone has no row."""
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    topic = "invt-compacted"
    create_topic(lake_broker, topic, 2, {"icelog.archive.layout": "table", "cleanup.policy": "compact",
                                         "icelog.schema.value.on.parse.error": "pass"})
    serialize = ProtobufSerializer(inv_pb.Order, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    for step in range(2):
        for partition in (0, 1):
            records: list[tuple[bytes | None, bytes | None, Any]] = []
            for i in range(12):
                order = inv_pb.Order(id=i + step, customer=f"c{i}-{step} é", cents=2**64 - 1 - i,
                                     tags=[f"t{j}" for j in range((i + step) % 3)], paid=i % 2 == 0,
                                     note=bytes([i, step, 255]))
                if (i + step) % 3:
                    order.inner.name, order.inner.n = f"in{i}", i
                key = f"p{partition}-k{(i + 6 * step) % 14}".encode()  # the second pass updates half the keys
                records.append((key, serialize(order, ctx), [("step", str(step).encode())]))
            schema_id = registry.get_latest_version(f"{topic}-value").schema_id
            records += [
                (f"p{partition}-k0".encode(), encode_envelope(schema_id, [1]) + b"\xff\xff\xff", None),  # garbage
                (f"p{partition}-k{1 + step}".encode(), None, [("tombstone", None)]),
                (f"p{partition}-odd{step}".encode(), encode_envelope(schema_id, [1]) + b"\xf8\x07\x2a", None),
            ]
            send(lake_broker, topic, records, partition=partition)
        [result] = lake_archiver.run_pass(force=True, topics={topic})
        assert result.error == "", result

    read = consume_all(lake_broker, topic, 2)
    latest: dict[bytes, tuple[int, int]] = {}
    for (partition, offset), (key, _value, _headers) in sorted(read.items()):
        assert key is not None
        latest[key] = (partition, offset)
    live = {at for key, at in latest.items() if read[at][1] is not None}
    rows = [r.asDict(recursive=True) for r in lake_spark.sql(f"SELECT * FROM {table(topic)}").collect()]
    schemas = StoreSchemaSource(lake_store)
    keys, values = Rebuilder(schemas), Rebuilder(schemas)
    assert {(r["__bucket"], r["__offset"]): rebuild_table_row(r, keys, values) for r in rows} == {
        at: read[at] for at in live}


AVRO_ORDER = {
    "type": "record", "name": "Order", "namespace": "inv.avro",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}}]}}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {"name": "pay", "type": ["null", "string", "double"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}
AVRO_KEY = {"type": "record", "name": "OrderKey", "namespace": "inv.avro", "fields": [
    {"name": "region", "type": "string"}, {"name": "n", "type": "int"}]}
JSON_ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "customer": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "qty": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}


def avro_order(i: int) -> dict[str, Any]:
    import datetime
    import decimal

    return {
        "id": i - 10, "customer": f"c{i} é", "lines": [{"sku": f"s{j}", "price": decimal.Decimal(f"-{i}.{j}05")}
                                                      for j in range(i % 3)],
        "attrs": {f"a{j}": None if j == 1 else j for j in range(i % 3)},
        "at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=i * 1_000_001),
        "day": None if i % 2 else datetime.date(2026, 1, 1 + i % 28), "pay": [None, f"card{i}", i / 8][i % 3],
        "kind": "AB"[i % 2],
    }


def iceberg_rows(settings: Settings, topic: str) -> list[dict[str, Any]]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    return catalog.load_table(("icelog", topic)).scan().to_arrow().to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("layout", ["record", "table"])
def test_every_avro_and_json_row_rebuilds_what_consumers_read(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_store: MetadataStore,
    lake_settings: Settings, layout: str,
) -> None:
    """The promise for Avro and JSON Schema topics, on every path: Confluent's serializers (keys too), payloads
    without an envelope, of an older schema version, with trailing bytes, garbage, an unknown schema id,
    tombstones, and `coerce`; every row rebuilds what a consumer reads, in both layouts."""
    import json

    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    configs = {"icelog.archive.layout": layout} if layout == "table" else {}
    avro_topic, json_topic = f"inv-avro-{layout}", f"inv-json-{layout}"
    avro_coerce, json_coerce = f"inv-avro-coerce-{layout}", f"inv-json-coerce-{layout}"
    for topic, extra in ((avro_topic, {}), (json_topic, {}), (avro_coerce, {"icelog.schema.value.coerce": "true"}),
                         (json_coerce, {"icelog.schema.value.coerce": "true"})):
        create_topic(lake_broker, topic, 2 if extra == {} else 1, {**configs, **extra})

    # Avro: keys and values through AvroSerializer; an older version of the value schema first.
    ctx = SerializationContext(avro_topic, MessageField.VALUE)
    key_ctx = SerializationContext(avro_topic, MessageField.KEY)
    older = {**AVRO_ORDER, "fields": AVRO_ORDER["fields"][:2]}  # type: ignore[index]
    registry.set_compatibility(f"{avro_topic}-value", "NONE")  # the older version lacks fields without defaults
    old_value = AvroSerializer(registry, json.dumps(older))({"id": 1, "customer": "old"}, ctx)
    values = AvroSerializer(registry, json.dumps(AVRO_ORDER))
    keys = AvroSerializer(registry, json.dumps(AVRO_KEY))
    send(lake_broker, avro_topic, [(keys({"region": "eu", "n": i}, key_ctx), values(avro_order(i), ctx),
                                    [("i", str(i).encode())]) for i in range(30)], partition=0)
    good = values(avro_order(7), ctx)
    assert good is not None and old_value is not None
    send(lake_broker, avro_topic, [
        (b"older-version", old_value, None),
        (b"no-envelope", good[5:], None),  # decoded with the latest schema
        (b"trailing-bytes", good + b"\x00", None),
        (b"garbage", good[:5] + b"\xff\xff\xff", None),
        (b"no-such-schema", b"\x00" + (987654).to_bytes(4, "big") + good[5:], None),
        (None, None, [("tombstone", None)]),
    ], partition=1)

    # JSON: the serializer's text, and spellings it would not write (whitespace, key order, 1.0, escapes).
    jctx = SerializationContext(json_topic, MessageField.VALUE)
    serialize = JSONSerializer(json.dumps(JSON_ORDER), registry)
    docs = [{"id": i, "customer": f"c{i} ü", "at": f"2026-01-01T00:00:{i % 60:02d}Z", "tags": ["x"] * (i % 3),
             "qty": {"a": i}, **({"extra": [i, None]} if i % 4 == 0 else {})} for i in range(30)]
    send(lake_broker, json_topic, [(f"k{i}".encode(), serialize(d, jctx), None) for i, d in enumerate(docs)], 0)
    envelope = b"\x00" + registry.get_latest_version(f"{json_topic}-value").schema_id.to_bytes(4, "big")
    send(lake_broker, json_topic, [
        (b"spaced", envelope + b'{ "customer" : "x",\n "id" : 1.0 , "tags":["\\u00fc"] }', None),
        (b"no-envelope", b'{"id": 2}', None),
        (b"not-json", envelope + b"{nope", None),
        (b"wrong-type", envelope + b'{"id": "two", "qty": {"a": "b"}}', None),
        (None, None, [("tombstone", None)]),
    ], partition=1)

    # coerce: bodies without an envelope in; the broker adds the latest schema's.
    registry.register_schema(f"{avro_coerce}-value", Schema(json.dumps(AVRO_ORDER), "AVRO"))
    registry.register_schema(f"{json_coerce}-value", Schema(json.dumps(JSON_ORDER), "JSON"))
    send(lake_broker, avro_coerce, [(None, values(avro_order(i), ctx)[5:], None) for i in range(10)],  # type: ignore[index]
         partition=0)
    send(lake_broker, json_coerce, [(None, json.dumps(d).encode(), None) for d in docs[:10]], partition=0)

    topics = {avro_topic: 2, json_topic: 2, avro_coerce: 1, json_coerce: 1}
    results = lake_archiver.run_pass(force=True, topics=set(topics))
    assert [r.error for r in results] == [""] * 4, results
    schemas = StoreSchemaSource(lake_store)
    for topic, partitions in topics.items():
        read = consume_all(lake_broker, topic, partitions)
        # Read with pyiceberg (Arrow): a map's entries in their stored order, which Avro's bytes depend on.
        # (Spark's collect() hands maps to Python through a java.util.HashMap, in another order.)
        rows = iceberg_rows(lake_settings, topic)
        keys_, values_ = Rebuilder(schemas), Rebuilder(schemas)
        if layout == "record":
            got = {(r["kafka"]["partition"], r["kafka"]["offset"]): (
                keys_.payload(r["key"]), values_.payload(r["value"]), rebuild_headers(r["headers"])) for r in rows}
        else:
            got = {(r["__bucket"], r["__offset"]): rebuild_table_row(r, keys_, values_) for r in rows}
        assert got == read and len(rows) == len(read), topic

    # Avro rows with an envelope are stored once, as columns; JSON rows keep their text; odd ones say why.
    raw = "value.__raw__" if layout == "record" else "__value"
    err = "value.__err__" if layout == "record" else "__value_err"
    key = "key.__raw__" if layout == "record" else "__key"

    def looked_up(topic: str) -> dict[bytes, tuple[bool, str | None]]:
        found = lake_spark.sql(f"SELECT {key} AS k, {raw} IS NOT NULL AS kept, {err} AS err FROM {table(topic)}")
        return {bytes(r.k): (r.kept, r.err) for r in found.collect() if r.k is not None}

    avro_rows = looked_up(avro_topic)
    assert sum(1 for kept, _ in avro_rows.values() if not kept) >= 29  # lossless rows: no second copy
    # An older version whose fields all have columns rebuilds too; a body without envelope keeps its bytes.
    assert avro_rows[b"no-envelope"] == (True, None) and avro_rows[b"older-version"] == (False, None)
    for odd in (b"trailing-bytes", b"garbage", b"no-such-schema"):
        assert avro_rows[odd][0] and avro_rows[odd][1], odd
    json_rows = looked_up(json_topic)
    assert all(kept for kept, _ in json_rows.values())
    assert json_rows[b"not-json"][1] and json_rows[b"spaced"][1] is None and json_rows[b"wrong-type"][1] is None
