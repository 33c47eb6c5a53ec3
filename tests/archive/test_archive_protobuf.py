"""Topics with a Protobuf schema, end to end: confluent-kafka's ProtobufSerializer and SchemaRegistryClient
against the broker's embedded registry, the Spark archiver, rows read back with Spark SQL.

Each row is turned back into a message (proto JSON via google.protobuf.json_format) and must equal the
message that was produced. Evolution v1 → v2 → v3 checks the table's schemas in its metadata file.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pool, duration_pb2, json_format, message_factory, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.meta.store import MetadataStore
from icelog.schema.codec.rebuild import Rebuilder
from icelog.schema.codec.registry_source import StoreSchemaSource
from icelog.schema.protobuf_schema import build_pool, compile_schema, encode_envelope
from icelog.table.protobuf_types import WRAPPERS, is_map
from tests.support.archive import create_topic, table
from tests.support.broker import BrokerProcess

EVERYTHING = (Path(__file__).parents[1] / "support" / "protos" / "everything.proto").read_text()


# -- messages ----------------------------------------------------------------------------------------------
def message_classes(text: str, *names: str) -> tuple[descriptor_pool.DescriptorPool, list[Any]]:
    """Message classes of a .proto compiled on its own pool (versions of one message coexist)."""
    pool = build_pool(compile_schema(text, {}))
    return pool, [message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names]


def everything(cls: Any, inner_cls: Any, i: int) -> Any:
    """A message that sets (or, by i, leaves unset) every kind of field."""
    m = cls(
        i32=-i, s32=-2 * i, sf32=3 * i, u32=2**32 - 1 - i, f32=i, i64=-(2**62) - i, s64=i, sf64=-i,
        u64=2**64 - 1 - i, f64=i, fl=0.5 * i, db=1.25 * i, b=i % 2 == 0, s=f"s-{i} é", by=bytes([i % 256, 0]),
        color=i % 3, nums=list(range(i % 4)), colors=[1, 2] if i % 2 else [],
    )
    if i % 3:
        m.inner.name, m.inner.n = f"inner-{i}", i
        m.inner.children.add(name="child", n=1).children.add(name="grandchild")
    for j in range(i % 3):
        m.inners.add(name=f"x{j}", n=j)
        m.counts[f"k{j}"] = j * 10**12
        m.by_id[j - 1].name = f"id{j}"
    if i % 3 == 0:
        m.text = f"text-{i}"
    elif i % 3 == 1:
        m.number = i
    else:
        m.nested.name = "nested"
    if i % 4:
        m.ts.FromMicroseconds(1_700_000_000_000_000 + i * 1_000_001)
        m.dur.FromMicroseconds(i * 1_500_000)
        m.w_i32.value = i % 2  # 0 on odd... a set wrapper holding 0 is not null
        m.w_s.value = f"w{i}"
        m.w_u64.value = 2**64 - 2
        m.st.update({"a": i, "b": [True, "x", None], "c": {"d": "e"}})
        m.val.string_value = f"v{i}"
        m.any.Pack(inner_cls(name=f"any-{i}", n=i))
    if i % 5 == 0:
        m.maybe = ""  # proto3 optional: set to the default is not the same as unset
    return m


# -- rows back to messages -----------------------------------------------------------------------------------
def _micros(value: Any) -> int:
    if isinstance(value, datetime.datetime):  # Spark hands back naive local time
        return int(value.replace(microsecond=0).timestamp()) * 1_000_000 + value.microsecond
    return int(value)


def _element_json(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            ts = timestamp_pb2.Timestamp()
            ts.FromMicroseconds(_micros(value))
            return ts.ToJsonString()
        if name == "google.protobuf.Duration":
            duration = duration_pb2.Duration()
            duration.FromMicroseconds(int(value))
            return duration.ToJsonString()
        if name in WRAPPERS:
            return _element_json(field.message_type.fields_by_name["value"], value)
        if isinstance(value, str):  # Struct / Value / Any, or a recursive message: JSON text
            return json.loads(value)
        return row_json(field.message_type, value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return int(value) if value.isdigit() else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, decimal.Decimal):
        return int(value)
    return value


def row_json(descriptor: Descriptor, row: dict[str, Any]) -> dict[str, Any]:
    """A row's struct as proto JSON of `descriptor` (null columns: unset fields)."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        value = row.get(field.name)
        if value is None:
            continue
        if is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _element_json(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_element_json(field, x) for x in value]
        else:
            out[field.name] = _element_json(field, value)
    return out


def as_message(cls: Any, pool: descriptor_pool.DescriptorPool, row: dict[str, Any]) -> Any:
    return json_format.ParseDict(row_json(cls.DESCRIPTOR, row), cls(), descriptor_pool=pool)


def rows(spark: Any, topic: str, columns: str = "key, value") -> list[dict[str, Any]]:
    query = f"SELECT {columns}, kafka.partition AS p, kafka.offset AS o FROM {table(topic)} ORDER BY p, o"
    return [r.asDict(recursive=True) for r in spark.sql(query).collect()]


def serializer(cls: Any, registry: SchemaRegistryClient) -> Any:
    return ProtobufSerializer(cls, registry, {"use.deprecated.format": False})


def produce_all(broker: BrokerProcess, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "zstd"})
    errors: list[Any] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)
    assert producer.flush(30) == 0 and not errors, errors


# -- tests ---------------------------------------------------------------------------------------------------
def test_every_type_round_trips_and_invalid_payloads_pass_through(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "pb-everything"
    create_topic(lake_broker, topic, partitions=1, configs={
        "icelog.schema.value": "topic-name", "icelog.schema.value.message": "icelog.test.Everything",
    })
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    pool, (cls, inner_cls) = message_classes(EVERYTHING, "icelog.test.Everything", "icelog.test.Inner")
    values, keys = serializer(cls, registry), serializer(inner_cls, registry)
    value_ctx = SerializationContext(topic, MessageField.VALUE)
    key_ctx = SerializationContext(topic, MessageField.KEY)

    messages = [everything(cls, inner_cls, i) for i in range(40)]
    produced: list[tuple[bytes | None, bytes | None]] = [
        (keys(inner_cls(name=f"k{i}", n=i), key_ctx), values(m, value_ctx)) for i, m in enumerate(messages)
    ]
    value_id = registry.get_latest_version(f"{topic}-value").schema_id
    plain = messages[7].SerializeToString()  # no envelope: decoded with icelog.schema.value.message
    invalid = [b"\xff\xff\xff", encode_envelope(value_id, [1]) + b"\x0a\xff", b"not protobuf at all"]
    produced += [(b"plain", plain), (b"tombstone", None)] + [(b"bad", payload) for payload in invalid]
    produce_all(lake_broker, topic, produced)

    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error and result.records == len(produced)
    got = rows(lake_spark, topic)
    assert [r["o"] for r in got] == list(range(len(produced)))

    for row, message, (key_bytes, value_bytes) in zip(got, messages, produced, strict=False):
        value = row["value"]
        # Maps, Timestamps and JSON columns are not exact images of their fields: __raw__ keeps the bytes.
        assert value["__err__"] is None and bytes(value["__raw__"]) == value_bytes
        assert value["__prefix__"] == value_bytes[: len(value["__prefix__"])]  # type: ignore[index]
        assert as_message(cls, pool, value) == message
        # The key has a schema too (<topic>-key): its fields, and __raw__ always.
        assert bytes(row["key"]["__raw__"]) == key_bytes
        assert row["key"]["name"] == f"k{row['o']}" and row["key"]["__err__"] is None
    plain_row, tombstone, *bad_rows = got[len(messages):]
    assert plain_row["value"]["__prefix__"] is None and as_message(cls, pool, plain_row["value"]) == messages[7]
    assert bytes(plain_row["key"]["__raw__"]) == b"plain"  # key.__raw__ is set whether or not it decodes
    assert tombstone["value"] is None
    for row, payload in zip(bad_rows, invalid, strict=True):
        value = row["value"]
        assert value["__err__"] and bytes(value["__raw__"]) == payload
        fields = {k: v for k, v in value.items() if k not in ("__err__", "__raw__")}
        assert all(v is None for v in fields.values()), {k: v for k, v in fields.items() if v is not None}


V1 = """syntax = "proto3"; package ev;
message M { string id = 1; int32 amount = 2; string note = 3; repeated int32 tags = 4; }"""
V2 = """syntax = "proto3"; package ev;
message M { string id = 1; int32 amount = 2; string note = 3; repeated int32 tags = 4; bool flag = 5; }"""
V3 = """syntax = "proto3"; package ev;
message M { string id = 1; string amount = 2; repeated string tags = 4; bool flag = 5; }"""


def value_field_ids(metadata: dict[str, Any], schema_id: int) -> dict[str, tuple[int, Any]]:
    [schema] = [s for s in metadata["schemas"] if s["schema-id"] == schema_id]
    [value] = [f for f in schema["fields"] if f["name"] == "value"]
    return {f["name"]: (f["id"], f["type"]) for f in value["type"]["fields"]}


def table_metadata(settings: Settings, topic: str) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    location = catalog.load_table(("icelog", topic)).metadata_location
    return json.loads(Path(location.removeprefix("file:")).read_text())  # type: ignore[no-any-return]


def test_evolution_keeps_field_ids_and_old_rows(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = "pb-evolution"
    subject = f"{topic}-value"
    create_topic(lake_broker, topic, partitions=1)  # icelog.schema.value=auto: <topic>-value if it exists
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    _, (m1,) = message_classes(V1, "ev.M")
    _, (m2,) = message_classes(V2, "ev.M")
    _, (m3,) = message_classes(V3, "ev.M")

    # v1: the table is created with schema id 0.
    v1 = serializer(m1, registry)
    produced: list[bytes] = [v1(m1(id=f"a{i}", amount=i, note="n", tags=[i]), ctx) for i in range(3)]
    produce_all(lake_broker, topic, [(None, p) for p in produced])
    registry.set_compatibility(subject_name=subject, level="NONE")  # v3 changes a type on purpose
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 3
    meta = table_metadata(lake_settings, topic)
    assert meta["current-schema-id"] == 0 and len(meta["schemas"]) == 1
    ids0 = value_field_ids(meta, 0)

    # v2 adds `flag`; a record still written with v1's schema id is decoded with v1 (fetched by id).
    v2 = serializer(m2, registry)
    produced += [v2(m2(id="b0", amount=10, note="n2", flag=True), ctx), v1(m1(id="a-late", amount=5, note="late"), ctx)]
    produce_all(lake_broker, topic, [(None, p) for p in produced[3:]])
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 2
    meta = table_metadata(lake_settings, topic)
    assert meta["current-schema-id"] == 1
    ids1 = value_field_ids(meta, 1)
    assert {k: ids1[k] for k in ids0} == ids0
    assert ids1["flag"][1] == "boolean" and ids1["flag"][0] > meta["schemas"][0]["fields"][-1]["id"]

    # v3 removes `note` and changes the types of `amount` and `tags`.
    v3 = serializer(m3, registry)
    produced.append(v3(m3(id="c0", amount="ten", tags=["t"], flag=False), ctx))
    produce_all(lake_broker, topic, [(None, produced[-1])])
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 1
    meta = table_metadata(lake_settings, topic)
    assert meta["current-schema-id"] == 2
    ids2 = value_field_ids(meta, 2)
    for name in ("id", "flag", "note", "__prefix__", "__err__", "__raw__"):
        assert ids2[name] == ids1[name]  # unchanged (and removed-but-kept) columns keep their ids
    assert ids2["amount__v1"] == ids0["amount"]  # the old column renamed, same id
    assert ids2["amount"][1] == "string" and ids2["amount"][0] not in {i for i, _ in ids1.values()}
    assert ids2["tags__v1"][0] == ids0["tags"][0] and ids2["tags"][1]["element"] == "string"
    stored = {c.path: c for c in lake_store.table_columns(f"icelog.{topic}")}
    assert stored["value.note"].deleted and stored["value.amount__v1"].deleted
    assert not stored["value.amount"].deleted

    # Every row still reads: old files resolve their columns by id, under the new names.
    got = rows(lake_spark, topic, "value.id AS id, value.amount AS amount, value.amount__v1 AS amount_v1, "
               "value.note AS note, value.flag AS flag, value.tags AS tags, value.tags__v1 AS tags_v1")
    assert [(r["id"], r["amount"], r["amount_v1"], r["note"], r["flag"], r["tags"], r["tags_v1"]) for r in got] == [
        ("a0", None, 0, "n", None, None, [0]),
        ("a1", None, 1, "n", None, None, [1]),
        ("a2", None, 2, "n", None, None, [2]),
        ("b0", None, 10, "n2", True, None, []),
        ("a-late", None, 5, "late", None, None, []),
        ("c0", "ten", None, None, False, ["t"], None),
    ]
    # ...and rebuilds the bytes produced, also the rows whose columns were renamed since (amount__v1, tags__v1).
    values = [r["value"] for r in rows(lake_spark, topic)]
    assert values[0]["__raw__"] is None  # a lossless v1 row: rebuilt from its columns only
    rebuild = Rebuilder(StoreSchemaSource(lake_store))
    assert [rebuild.payload(v) for v in values] == produced


def test_registry_outage_spares_raw_topics_fails_required_ones_then_a_raw_table_gains_a_schema(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    from tests.support.broker import free_port

    topic, strict = "pb-late-schema", "pb-late-strict"
    create_topic(lake_broker, topic, partitions=1)
    create_topic(lake_broker, strict, partitions=1, configs={"icelog.schema.value": "topic-name"})
    produce_all(lake_broker, topic, [(None, f"raw-{i}".encode()) for i in range(3)])
    produce_all(lake_broker, strict, [(None, b"x")])
    strict_id = lake_store.get_topic(strict).topic_id

    # An external registry that nothing answers: a topic without a schema still archives (raw bytes)...
    down = lake_settings.model_copy(update={"registry_url": f"http://127.0.0.1:{free_port()}"})
    [raw] = Archiver(down, lake_spark, lake_store).run_pass(force=True, topics=[topic])
    assert not raw.error and raw.records == 3
    # ...while one that requires its subject fails cleanly (retried next pass), nothing archived.
    [failed] = Archiver(down, lake_spark, lake_store).run_pass(force=True, topics=[strict])
    assert "unreachable" in failed.error and failed.records == 0
    assert all(s.archived_offset == 0 and s.last_error for s in lake_store.archive_states(strict_id))

    # No subject yet: the raw layout, exactly as for any raw topic.
    raw_ids = {c.path: c.field_id for c in records_of(lake_settings, topic)}
    assert set(raw_ids) >= {"value.__raw__", "key.__raw__"} and "value.id" not in raw_ids
    assert lake_store.table_columns(f"icelog.{topic}") == []

    # A schema appears: the table keeps its columns and ids, and gains the message's.
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    _, (m1,) = message_classes(V1, "ev.M")
    v1 = serializer(m1, registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce_all(lake_broker, topic, [(None, v1(m1(id="p0", amount=7), ctx))])
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 1
    ids = {c.path: c.field_id for c in records_of(lake_settings, topic)}
    assert {p: ids[p] for p in raw_ids} == raw_ids and ids["value.id"] > max(raw_ids.values())
    got = rows(lake_spark, topic, "value.id AS id, value.amount AS amount, value.__raw__ AS raw")
    assert [(r["id"], r["amount"], None if r["raw"] is None else bytes(r["raw"])) for r in got] == [
        (None, None, b"raw-0"), (None, None, b"raw-1"), (None, None, b"raw-2"), ("p0", 7, None),
    ]


def records_of(settings: Settings, topic: str) -> list[Any]:
    """Column records (path, field id) of the table's current schema, from its metadata file."""
    from pyiceberg.schema import Schema

    from icelog.table.iceberg_types import records_from_schema

    meta = table_metadata(settings, topic)
    [schema] = [s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"]]
    return records_from_schema(Schema.model_validate(schema))


RESERVED = """syntax = "proto3"; package rs;
message Inner { string amount__v1 = 1; }
message M { string id = 1; bytes __raw__ = 2; Inner inner = 3; }"""


def test_reserved_field_names_are_refused_with_a_clear_error(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore,
) -> None:
    """A message with a field named like the archive's own columns is refused, visibly and before Spark runs."""
    topic = "pb-reserved"
    create_topic(lake_broker, topic, partitions=1)
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    _, (m,) = message_classes(RESERVED, "rs.M")
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce_all(lake_broker, topic, [(None, serializer(m, registry)(m(id="a"), ctx))])
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 0 and "ReservedFieldNameError" in result.error and "'__raw__'" in result.error
    assert "icelog.schema.value=none" in result.error  # the fix is in the message
    [state] = lake_store.archive_states(lake_store.get_topic(topic).topic_id)
    assert state.archived_offset == 0 and "__raw__" in state.last_error  # what `icelog status` shows


@pytest.mark.parametrize("compacted", [False, True], ids=["append", "upsert"])
def test_registry_outage_seen_by_a_worker_fails_the_pass_never_an_err_row(
    compacted: bool, lake_broker: BrokerProcess, lake_spark: Any, lake_settings: Settings, lake_store: MetadataStore,
) -> None:
    """A schema id only a Spark worker fetches, while the registry fails: the pass fails, saying why, and the next
    one decodes it. (An upsert table's workers run an RDD job, whose failure comes back as a Java exception.)"""
    import threading
    import urllib.error
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from confluent_kafka.schema_registry import Schema

    topic = "pb-worker-outage" + ("-compacted" if compacted else "")
    create_topic(lake_broker, topic, partitions=1, configs={"cleanup.policy": "compact"} if compacted else None)
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    _, (m1,) = message_classes(V1, "ev.M")
    _, (m2,) = message_classes(V2, "ev.M")
    # Another subject's schema of the same message: not a version of the topic's subject, so not shipped to the
    # workers; the worker that meets it asks the registry.
    other_id = registry.register_schema(f"{topic}-other", Schema(V2, "PROTOBUF"))
    ctx = SerializationContext(topic, MessageField.VALUE)
    other = encode_envelope(other_id, [0]) + m2(id="b", amount=2, flag=True).SerializeToString()
    first = serializer(m1, registry)(m1(id="a", amount=1), ctx)
    produce_all(lake_broker, topic, [(b"a" if compacted else None, first), (b"b" if compacted else None, other)])
    topic_id = lake_store.get_topic(topic).topic_id

    failing = threading.Event()
    failing.set()

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if failing.is_set() and self.path.startswith(f"/schemas/ids/{other_id}"):
                self.send_response(503)
                self.end_headers()
                return
            try:
                with urllib.request.urlopen(lake_broker.registry_url + self.path, timeout=10) as upstream:
                    status, body = upstream.status, upstream.read()
            except urllib.error.HTTPError as exc:  # 404s are answers too
                status, body = exc.code, exc.read()
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = lake_settings.model_copy(update={"registry_url": f"http://127.0.0.1:{server.server_port}"})
        archiver = Archiver(settings, lake_spark, lake_store)
        [failed] = archiver.run_pass(force=True, topics=[topic])
        assert "RegistryUnavailableError" in failed.error and failed.records == 0  # what `icelog status` shows
        assert [s.archived_offset for s in lake_store.archive_states(topic_id)] == [0]
        failing.clear()  # the registry is back: the same records are archived, decoded
        [done] = archiver.run_pass(force=True, topics=[topic])
        assert not done.error and done.records == 2
    finally:
        server.shutdown()
    got = rows(lake_spark, topic, "value.id AS id, value.amount AS amount, value.__err__ AS err, value.__raw__ AS raw")
    assert [(r["id"], r["amount"], r["err"]) for r in got] == [("a", 1, None), ("b", 2, None)]
    assert bytes(got[1]["raw"]) == other  # v2's `flag` has no column in this table: the bytes are kept
