"""Data enforcement on produce (icelog.schema.* topic configs) with real clients and the embedded registry."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.schema.protobuf_schema import encode_envelope, parse_envelope
from tests.support.broker import BrokerProcess

PROTO = """syntax = "proto3";
package enf.test;
message Click { string page = 1; int64 at = 2; }
message View { string page = 1; int32 ms = 2; }
"""


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The generated Python module of PROTO (protoc --python_out), as an application would have it."""
    out = tmp_path_factory.mktemp("pb")
    (out / "enf_click.proto").write_text(PROTO)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}", "enf_click.proto"],
                   check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("enf_click_pb2")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def enf_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("enforcement") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def registry(enf_broker: BrokerProcess) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": enf_broker.registry_url})


def create_topic(broker: BrokerProcess, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)


def produce(broker: BrokerProcess, topic: str, values: list[bytes], compression: str = "none",
            key: bytes | None = b"k") -> list[KafkaError | None]:
    """Produce values (one request's worth) and return each record's delivery error (None: stored)."""
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": compression,
                         "linger.ms": 50, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, key=key, headers=[("h", b"v")],
                         on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    return errors


def consume(broker: BrokerProcess, topic: str, count: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "enf", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    try:
        for _ in range(200):
            if len(out) >= count:
                break
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def high_watermark(broker: BrokerProcess, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "enf-hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_serializer_produce_consume_deserializer(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                                 pb: ModuleType) -> None:
    topic = "enf-roundtrip"
    # reject mode: the serializer's framed payloads must pass the broker's parse check.
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "reject"})
    serializer = ProtobufSerializer(pb.Click, registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [serializer(pb.Click(page=f"/p{i}", at=i), ctx) for i in range(5)]
    assert produce(enf_broker, topic, values, compression="zstd") == [None] * 5
    deserializer = ProtobufDeserializer(pb.Click, {}, SchemaRegistryClient({"url": enf_broker.registry_url}))
    got = [deserializer(m.value(), ctx) for m in consume(enf_broker, topic, 5)]
    assert [(c.page, c.at) for c in got] == [(f"/p{i}", i) for i in range(5)]
    assert registry.get_latest_version(f"{topic}-value").schema_id == parse_envelope(values[0])[0]  # type: ignore[index]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_coerce_adds_the_envelope(enf_broker: BrokerProcess, registry: SchemaRegistryClient, pb: ModuleType,
                                  compression: str) -> None:
    topic = f"enf-coerce-{compression}"
    schema_id = registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(enf_broker, topic, {"icelog.schema.value": "topic-name", "icelog.schema.value.coerce": "true",
                                     "icelog.schema.value.message": "enf.test.View"})
    plain = [pb.View(page=f"/v{i}", ms=i).SerializeToString() for i in range(3)]
    framed = encode_envelope(schema_id, [1]) + pb.View(page="/framed", ms=9).SerializeToString()
    assert produce(enf_broker, topic, [*plain, framed], compression=compression) == [None] * 4
    msgs = consume(enf_broker, topic, 4)
    # View is the second message of the file: message indexes [1].
    assert [m.value() for m in msgs] == [encode_envelope(schema_id, [1]) + p for p in plain] + [framed]
    assert all(m.key() == b"k" and m.headers() == [("h", b"v")] for m in msgs)  # the rest is kept
    assert [m.offset() for m in msgs] == [0, 1, 2, 3]
    # A consumer's own client: this one cached the .proto text form when registering, and the
    # deserializer asks for the serialized form (a client-side cache detail, same with Confluent's registry).
    deserializer = ProtobufDeserializer(pb.View, {}, SchemaRegistryClient({"url": enf_broker.registry_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert [deserializer(m.value(), ctx).page for m in msgs] == ["/v0", "/v1", "/v2", "/framed"]


def test_reject_mode_refuses_the_batch(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                       pb: ModuleType) -> None:
    topic = "enf-reject"
    schema_id = registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "reject",
                                     "icelog.schema.value.coerce": "true"})
    good = pb.Click(page="/ok", at=1).SerializeToString()
    assert produce(enf_broker, topic, [good]) == [None]
    assert high_watermark(enf_broker, topic) == 1
    bad = b"\x0a\xff\x01broken"  # field 1 claims 255 bytes that are not there
    errors = produce(enf_broker, topic, [bad])
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    # A framed payload whose body does not parse is refused too; nothing of either reached the log.
    errors = produce(enf_broker, topic, [encode_envelope(schema_id, [0]) + bad])
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    assert high_watermark(enf_broker, topic) == 1
    stored = consume(enf_broker, topic, 1)
    assert [m.value() for m in stored] == [encode_envelope(schema_id, [0]) + good]


def test_pass_mode_stores_bad_payloads(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                       pb: ModuleType) -> None:
    topic = "enf-pass"
    schema_id = registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "pass",
                                     "icelog.schema.value.coerce": "true"})
    bad = b"\x0a\xff\x01broken"
    assert produce(enf_broker, topic, [bad]) == [None]
    # pass: stored (coerce still frames it; the archive marks it with __err__)
    assert [m.value() for m in consume(enf_broker, topic, 1)] == [encode_envelope(schema_id, [0]) + bad]


def test_topics_without_schema_configs_are_untouched(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                                     pb: ModuleType) -> None:
    topic = "enf-plain"
    registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))  # a subject, but no enforcement set
    create_topic(enf_broker, topic, {})
    assert produce(enf_broker, topic, [b"\x0a\xff\x01broken", b"raw"]) == [None, None]
    assert [m.value() for m in consume(enf_broker, topic, 2)] == [b"\x0a\xff\x01broken", b"raw"]


def test_required_subject_missing_rejects(enf_broker: BrokerProcess, pb: ModuleType) -> None:
    topic = "enf-missing-subject"
    create_topic(enf_broker, topic, {"icelog.schema.value": "subject:nobody-registered-this",
                                     "icelog.schema.value.on.parse.error": "reject"})
    errors = produce(enf_broker, topic, [pb.Click(page="/x").SerializeToString()])
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    assert high_watermark(enf_broker, topic) == 0


def produce_v8(broker: BrokerProcess, topic: str, values: list[bytes]) -> Any:
    """One Produce v8 request of one batch (partition 0); the partition's response (error, record_errors)."""
    from kafka.protocol.producer import ProduceRequest, ProduceResponse
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from tests.support.wire_client import RawClient

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000, None, value, [])
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(builder.build()))])])
    client = RawClient(broker.bootstrap)
    try:
        return client.request(request, 8, ProduceResponse).responses[0].partition_responses[0]
    finally:
        client.close()


def test_record_errors_in_the_produce_response(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                                pb: ModuleType) -> None:
    """Produce v8 answers INVALID_RECORD with record_errors (index of each bad record) and error_message."""
    topic = "enf-record-errors"
    registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "reject"})
    part = produce_v8(enf_broker, topic, [pb.Click(page="/ok").SerializeToString(), b"\x0a\xff\x01broken"])
    assert part.error_code == 87 and part.base_offset == -1
    assert [e.batch_index for e in part.record_errors] == [1]
    assert "enf.test.Click" in part.record_errors[0].batch_index_error_message
    assert part.error_message
    assert high_watermark(enf_broker, topic) == 0


def test_plain_produce_path_unchanged(enf_broker: BrokerProcess, tmp_path: Path) -> None:
    # Sanity: an ordinary topic (no schema configs, no subject) still round-trips bytes exactly.
    topic = "enf-ordinary"
    create_topic(enf_broker, topic, {})
    assert produce(enf_broker, topic, [b"a", b"\x00\x00\x00\x00\x01\x00zz"], compression="gzip") == [None, None]
    assert [m.value() for m in consume(enf_broker, topic, 2)] == [b"a", b"\x00\x00\x00\x00\x01\x00zz"]


MONEY = """syntax = "proto3";
package enf.money;
message Money { string currency = 1; int64 units = 2; }
"""
ORDER = """syntax = "proto3";
package enf.order;
import "enf_money.proto";
import "google/protobuf/timestamp.proto";
message Order { string id = 1; enf.money.Money total = 2; google.protobuf.Timestamp at = 3; }
"""


@pytest.fixture(scope="module")
def pb_order(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """Generated modules of a schema that imports another file and a well-known type."""
    out = tmp_path_factory.mktemp("pb_order")
    (out / "enf_money.proto").write_text(MONEY)
    (out / "enf_order.proto").write_text(ORDER)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                    "enf_money.proto", "enf_order.proto"], check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("enf_order_pb2")
    finally:
        sys.path.remove(str(out))


def test_serializer_registers_references(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                         pb_order: ModuleType) -> None:
    topic = "enf-orders"
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "reject"})
    serializer = ProtobufSerializer(pb_order.Order, registry)  # registers enf_money.proto, then enf-orders-value
    ctx = SerializationContext(topic, MessageField.VALUE)
    order = pb_order.Order(id="o1")
    order.total.currency, order.total.units = "EUR", 42
    order.at.seconds = 1_700_000_000
    assert produce(enf_broker, topic, [serializer(order, ctx)]) == [None]
    latest = registry.get_latest_version(f"{topic}-value")
    assert [(r.name, r.subject) for r in latest.schema.references] == [("enf_money.proto", "enf_money.proto")]
    deserializer = ProtobufDeserializer(pb_order.Order, {}, SchemaRegistryClient({"url": enf_broker.registry_url}))
    got = deserializer(consume(enf_broker, topic, 1)[0].value(), ctx)
    assert (got.id, got.total.units, got.at.seconds) == ("o1", 42, 1_700_000_000)


def test_external_registry_url(enf_broker: BrokerProcess, registry: SchemaRegistryClient, pb: ModuleType,
                               tmp_path: Path) -> None:
    """With registry_url set, a broker serves no registry of its own and enforces with the external one."""
    import requests

    topic = "enf-external"
    schema_id = registry.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    other = BrokerProcess(tmp_path / "data", env={"ICELOG_REGISTRY_URL": enf_broker.registry_url}).start()
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(other.registry_url + "/subjects", timeout=5)
        create_topic(other, topic, {"icelog.schema.value.coerce": "true",
                                    "icelog.schema.value.on.parse.error": "reject"})
        value = pb.Click(page="/ext").SerializeToString()
        assert produce(other, topic, [value, b"\x0a\xff\x01broken"])[0] is not None  # one request: all refused
        assert produce(other, topic, [value]) == [None]
        assert [m.value() for m in consume(other, topic, 1)] == [encode_envelope(schema_id, [0]) + value]
    finally:
        other.stop()


@pytest.mark.parametrize("indexes", [[0], [1], [0, 2], [3, 1, 4], [70]])
def test_envelope_matches_confluent(indexes: list[int]) -> None:
    """encode/parse_envelope agree byte for byte with confluent-kafka's own framing."""
    from confluent_kafka.schema_registry.common.serde import SchemaId

    theirs = SchemaId("PROTOBUF", 123456, None, indexes).id_to_bytes()
    assert encode_envelope(123456, indexes) == theirs
    assert parse_envelope(theirs + b"\x08\x01") == (123456, indexes, len(theirs))
    assert parse_envelope(b"\x08\x01") is None and parse_envelope(b"") is None


AVRO_CLICK = '{"type": "record", "name": "Click", "namespace": "enf", "fields": [{"name": "page", "type": "string"},' \
             ' {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}'
JSON_CLICK = '{"type": "object", "properties": {"page": {"type": "string"}, "at": {"type": "integer"}},' \
             ' "required": ["page"]}'


@pytest.mark.parametrize("schema_type", ["AVRO", "JSON"])
def test_avro_and_json_reject_coerce_and_record_errors(enf_broker: BrokerProcess, registry: SchemaRegistryClient,
                                                       schema_type: str) -> None:
    """reject: a payload that is not a value of its schema → INVALID_RECORD naming the record (its index) and
    why, nothing stored; coerce: bodies produced without an envelope get the latest schema's (magic + id)."""
    import json

    topic = f"enf-{schema_type.lower()}"
    schema_id = registry.register_schema(f"{topic}-value", Schema(AVRO_CLICK if schema_type == "AVRO" else JSON_CLICK,
                                                                  schema_type))
    create_topic(enf_broker, topic, {"icelog.schema.value.on.parse.error": "reject",
                                     "icelog.schema.value.coerce": "true"})
    if schema_type == "AVRO":
        import io

        import fastavro

        def body(page: str) -> bytes:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(AVRO_CLICK)), {"page": page, "at": 5})
            return out.getvalue()

        bad = [body("/ok") + b"\x00", b"\x07"]  # trailing bytes; a string length past the end
    else:
        def body(page: str) -> bytes:
            return json.dumps({"page": page, "at": 5}).encode()

        bad = [b'{"page": 7}', b'{"page": "/x"']  # wrong type; not JSON
    envelope = b"\x00" + schema_id.to_bytes(4, "big")
    # One request: good (with and without envelope), then the bad ones: the batch is refused, nothing stored.
    part = produce_v8(enf_broker, topic, [envelope + body("/a"), body("/b"), *bad])
    assert part.error_code == 87 and [e.batch_index for e in part.record_errors] == [2, 3]
    assert all(e.batch_index_error_message for e in part.record_errors)
    assert high_watermark(enf_broker, topic) == 0
    # Good ones alone: stored, the plain body with the envelope added (what the deserializer needs).
    assert produce(enf_broker, topic, [envelope + body("/a"), body("/b")]) == [None, None]
    got = [m.value() for m in consume(enf_broker, topic, 2)]
    assert got == [envelope + body("/a"), envelope + body("/b")]
