"""Avro and JSON Schema topics end to end, with Confluent's own serializers against the embedded registry.

confluent-kafka's AvroSerializer (which registers its schema without a `schemaType`, meaning AVRO) and
JSONSerializer produce realistic records (nested records, arrays, maps, enums, unions, optional fields,
logical types) over TCP; the real Spark archiver writes typed tables; Spark SQL, pyiceberg and DuckDB read
them with the types the mapping promises; the schema evolves v1 → v2 → v3 under compatibility levels (an
incompatible change refused with Confluent's 409) with field ids kept; after the intake is trimmed, every
client reads the produced bytes back from the table, and Confluent's deserializers turn them into the
objects produced.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.meta.store import MetadataStore
from tests.archive.test_archive_protobuf import produce_all
from tests.readback.test_readback import archive_and_trim
from tests.support.archive import table
from tests.support.broker import BrokerProcess
from tests.support.clients_util import CLIENTS, create_topic
from tests.wire.test_bad_input import INVALID_RECORD, Connection, batch, high_watermark, produce

pytestmark = pytest.mark.slow

UTC = datetime.UTC

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
        ]}},
        {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
            {"name": "sku", "type": "string"},
            {"name": "qty", "type": "int"},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        ]}}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seen_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_at", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ship_date", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "payment", "type": ["null", "string", "long"], "default": None},
        {"name": "score", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
# v3 changes `score` from double to string: refused under BACKWARD, then registered under NONE.
ORDER_V3 = {**ORDER_V2, "fields": [f if f["name"] != "score" else {"name": "score", "type": "string"}
                                   for f in ORDER_V2["fields"]]}


def order(i: int, version: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": 1000 + i,
        "customer": {"name": f"cust {i} ü", "email": None if i % 3 == 0 else f"c{i}@example.com"},
        "items": [{"sku": f"sku-{j}", "qty": j + 1, "price": decimal.Decimal(f"{i}.{j:02d}")} for j in range(i % 3)],
        "attrs": {f"a{j}": f"v{j}" for j in range(i % 4)},
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "placed_at": datetime.datetime(2026, 11, 25, 12, 0, i, 123000, tzinfo=UTC),
        "seen_at": datetime.datetime(2026, 11, 25, 12, 0, i, 123456, tzinfo=UTC),
        "local_at": datetime.datetime(2026, 11, 25, 8, 30, i, 500000),
        "ship_date": None if i % 2 else datetime.date(2026, 12, 1 + i % 20),
        "ref": uuid.UUID(int=i),
        "payment": [None, f"card-{i}", i * 100][i % 3],
        "score": i / 4 if version < 3 else f"s{i}",
        "ok": i % 2 == 0,
        "blob": bytes([i % 256, 0, 255]),
        "note": None if i % 5 else f"note {i}",
    }
    if version >= 2:
        out["channel"] = "app" if i % 2 else "web"
    return out


def avro_serializer(registry: SchemaRegistryClient, schema: dict[str, Any]) -> AvroSerializer:
    return AvroSerializer(registry, json.dumps(schema), conf={"auto.register.schemas": True})


def table_metadata(settings: Settings, topic: str) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    location = catalog.load_table(("icelog", topic)).metadata_location
    return json.loads(Path(location.removeprefix("file:")).read_text())  # type: ignore[no-any-return]


def value_fields(metadata: dict[str, Any]) -> dict[str, tuple[int, Any]]:
    [schema] = [s for s in metadata["schemas"] if s["schema-id"] == metadata["current-schema-id"]]
    [value] = [f for f in schema["fields"] if f["name"] == "value"]
    return {f["name"]: (f["id"], f["type"]) for f in value["type"]["fields"]}


def duckdb_rows(metadata_location: str, query: str) -> list[tuple[Any, ...]]:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        [path] = Path(str(module.__file__)).parent.glob(f"extensions/*/{name}.duckdb_extension")
        con.load_extension(str(path))
    return con.sql(query.replace("$T", f"iceberg_scan('{metadata_location}')")).fetchall()


def test_avro_topic_typed_tables_evolution_and_read_back(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = "avro-orders"
    create_topic(lake_broker.bootstrap, topic, 1, {"icelog.intake.retention.ms": "0"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    value_ctx, key_ctx = SerializationContext(topic, MessageField.VALUE), SerializationContext(topic, MessageField.KEY)
    keys = AvroSerializer(registry, '"string"')
    v1 = avro_serializer(registry, ORDER_V1)
    produced = [(keys(f"order-{i}", key_ctx), v1(order(i), value_ctx)) for i in range(24)]
    # AvroSerializer registered without a schemaType: the registry holds them as AVRO.
    latest = registry.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "AVRO" and latest.version == 1
    produce_all(lake_broker, topic, produced)
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced))
    archive_and_trim(lake_archiver, lake_store, topic, before)

    # Typed in Spark SQL.
    spark_value = lake_spark.table(table(topic)).schema["value"].dataType
    types = {f.name: f.dataType.simpleString() for f in spark_value.fields}
    assert types["id"] == "bigint" and types["placed_at"] == "timestamp" and types["seen_at"] == "timestamp"
    assert types["local_at"] == "timestamp_ntz" and types["ship_date"] == "date"
    assert types["items"] == "array<struct<sku:string,qty:int,price:decimal(10,2)>>"
    assert types["attrs"] == "map<string,string>" and types["status"] == "string" and types["ref"] == "string"
    assert types["payment"] == "struct<string:string,long:bigint>" and types["blob"] == "binary"
    assert types["customer"] == "struct<name:string,email:string>"
    row = lake_spark.sql(f"SELECT value FROM {table(topic)} WHERE value.id = 1004").collect()[0].value
    assert row["customer"]["name"] == "cust 4 ü" and row["status"] == "PAID" and row["attrs"] == {}
    assert [i.asDict() for i in row["items"]] == [{"sku": "sku-0", "qty": 1, "price": decimal.Decimal("4.00")}]
    assert row["payment"].asDict() == {"string": "card-4", "long": None}
    assert row["ship_date"] == datetime.date(2026, 12, 5)
    assert row["ref"] == str(uuid.UUID(int=4)) and row["__raw__"] is None  # stored once, as columns
    row = lake_spark.sql(f"SELECT value FROM {table(topic)} WHERE value.id = 1005").collect()[0].value
    assert row["attrs"] == {"a0": "v0"} and row["payment"].asDict() == {"string": None, "long": 500}
    assert row["ship_date"] is None and row["customer"]["email"] == "c5@example.com"
    key_row = lake_spark.sql(f"SELECT key FROM {table(topic)} WHERE value.id = 1004").collect()[0].key
    assert key_row["key"] == "order-4"  # a primitive schema: one column named after the side

    # Typed in pyiceberg and DuckDB.
    from pyiceberg import types as t
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{lake_settings.data_dir / 'catalog.db'}",
                         warehouse=lake_settings.warehouse)
    iceberg_value = catalog.load_table(("icelog", topic)).schema().find_field("value").field_type
    assert isinstance(iceberg_value, t.StructType)
    assert isinstance(iceberg_value.field_by_name("placed_at").field_type, t.TimestamptzType)
    assert isinstance(iceberg_value.field_by_name("local_at").field_type, t.TimestampType)
    assert isinstance(iceberg_value.field_by_name("ship_date").field_type, t.DateType)
    assert iceberg_value.field_by_name("items").field_type.element_field.field_type.field_by_name(  # type: ignore[attr-defined]
        "price").field_type == t.DecimalType(10, 2)
    location = catalog.load_table(("icelog", topic)).metadata_location
    [(count, paid)] = duckdb_rows(location, "SELECT count(*), count(*) FILTER (value.status = 'PAID') FROM $T")
    assert (count, paid) == (24, 8)
    [(placed, kind)] = duckdb_rows(location, "SELECT epoch_ms(value.placed_at), typeof(value.placed_at) FROM $T "
                                             "WHERE value.id = 1001")
    assert placed == datetime.datetime(2026, 11, 25, 12, 0, 1, 123000, tzinfo=UTC).timestamp() * 1000
    assert kind == "TIMESTAMP WITH TIME ZONE"

    # Read back after the trim: every client gets the produced bytes; the deserializer the objects.
    for name in CLIENTS:
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced)) == before, name
    deserialize = AvroDeserializer(registry)
    for i, rec in enumerate(before):
        assert deserialize(rec.value, value_ctx) == order(i)

    # Evolution: v2 adds a field with a default (BACKWARD: fine), v3 changes a type (refused with 409).
    meta = table_metadata(lake_settings, topic)
    ids1 = value_fields(meta)
    v2 = avro_serializer(registry, ORDER_V2)
    produced += [(keys(f"order-{i}", key_ctx), v2(order(i, 2), value_ctx)) for i in range(24, 30)]
    with pytest.raises(SchemaRegistryError) as refused:
        avro_serializer(registry, ORDER_V3)(order(30, 3), value_ctx)
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409
    assert "score" in refused.value.error_message and "incompatible" in refused.value.error_message
    registry.set_compatibility(subject_name=f"{topic}-value", level="NONE")
    v3 = avro_serializer(registry, ORDER_V3)
    produced += [(keys(f"order-{i}", key_ctx), v3(order(i, 3), value_ctx)) for i in range(30, 33)]
    produce_all(lake_broker, topic, produced[24:])
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced))
    archive_and_trim(lake_archiver, lake_store, topic, before)
    ids3 = value_fields(table_metadata(lake_settings, topic))
    for name in ("id", "customer", "items", "attrs", "placed_at", "__raw__"):
        assert ids3[name] == ids1[name], name  # unchanged columns keep their ids
    assert ids3["score__v1"][0] == ids1["score"][0] and ids3["score"][1] == "string"
    assert ids3["channel"][0] > max(i for i, _ in ids1.values())
    got = lake_spark.sql(f"SELECT value.id, value.score, value.score__v1, value.channel FROM {table(topic)} "
                         "ORDER BY kafka.offset").collect()
    assert [tuple(r) for r in got[22:]] == [
        (1022, None, 5.5, None), (1023, None, 5.75, None),
        # v2 records archived after v3 retyped `score`: their double fits neither the string column nor the
        # retired one (only current columns are filled), so the row keeps the produced bytes (__raw__).
        *[(1000 + i, None, None, "app" if i % 2 else "web") for i in range(24, 30)],
        *[(1000 + i, f"s{i}", None, "app" if i % 2 else "web") for i in range(30, 33)],
    ]
    raws = lake_spark.sql(f"SELECT value.__raw__ IS NOT NULL FROM {table(topic)} ORDER BY kafka.offset").collect()
    assert [r[0] for r in raws] == [False] * 24 + [True] * 6 + [False] * 3
    for name in ("confluent", "kafka-python"):
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced)) == before, name


JSON_V1 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Reading", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "sensor": {"type": "string"},
        "value": {"type": "number"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "location": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                     "additionalProperties": False},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "sensor"],
}


def reading(i: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": i, "sensor": f"s-{i} ü", "value": i * 1.5, "at": f"2026-11-25T12:00:{i:02d}.250+01:00",
        "day": None if i % 2 else "2026-11-25", "tags": [f"t{j}" for j in range(i % 3)],
        "labels": {f"l{j}": j for j in range(i % 3)}, "location": {"lat": 52.5, "lon": 13.4 + i}, "ok": i % 2 == 0,
    }
    if i % 4 == 0:
        out["firmware"] = {"version": f"1.{i}"}  # open content: a property the schema does not declare
    return out


def test_json_topic_typed_table_open_content_and_read_back(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = "json-readings"
    create_topic(lake_broker.bootstrap, topic, 1, {"icelog.intake.retention.ms": "0"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    serialize = JSONSerializer(json.dumps(JSON_V1), registry)
    produced: list[tuple[bytes | None, bytes | None]] = [(f"k{i}".encode(), serialize(reading(i), ctx))
                                                         for i in range(20)]
    assert registry.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"
    produce_all(lake_broker, topic, produced)
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced))
    archive_and_trim(lake_archiver, lake_store, topic, before)

    value_type = lake_spark.table(table(topic)).schema["value"].dataType
    types = {f.name: f.dataType.simpleString() for f in value_type.fields}
    assert types["id"] == "bigint" and types["value"] == "double" and types["at"] == "timestamp"
    assert types["day"] == "date" and types["tags"] == "array<string>" and types["labels"] == "map<string,bigint>"
    assert types["location"] == "struct<lat:double,lon:double>" and types["__extra__"] == "string"
    rows = [r.value for r in lake_spark.sql(f"SELECT value FROM {table(topic)} ORDER BY kafka.offset").collect()]
    assert rows[4]["at"] == datetime.datetime(2026, 11, 25, 11, 0, 4, 250000)  # Spark shows UTC here
    assert rows[4]["labels"] == {"l0": 0} and rows[4]["location"].asDict() == {"lat": 52.5, "lon": 17.4}
    assert json.loads(rows[4]["__extra__"]) == {"firmware": {"version": "1.4"}} and rows[5]["__extra__"] is None
    assert all(r["__raw__"] is not None for r in rows)  # JSON text is not canonical: the bytes are kept

    for name in CLIENTS:
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", len(produced)) == before, name
    deserialize = JSONDeserializer(json.dumps(JSON_V1), schema_registry_client=registry)
    assert [deserialize(r.value, ctx) for r in before] == [reading(i) for i in range(20)]

    # Evolution: v2 declares `firmware` (it was open content; BACKWARD refuses adding a property to an open
    # model, so the subject is NONE), v3 retypes `value`: ids kept, the retyped column renamed.
    ids1 = value_fields(table_metadata(lake_settings, topic))
    registry.set_compatibility(subject_name=f"{topic}-value", level="NONE")
    v2 = {**JSON_V1, "properties": {**JSON_V1["properties"],  # type: ignore[dict-item]
                                    "firmware": {"type": "object", "properties": {"version": {"type": "string"}}}}}
    v3 = {**v2, "properties": {**v2["properties"], "value": {"type": "string"}}}  # type: ignore[dict-item]
    later = [JSONSerializer(json.dumps(v2), registry)(reading(20), ctx),
             JSONSerializer(json.dumps(v3), registry)({**reading(24), "value": "high"}, ctx)]
    produce_all(lake_broker, topic, [(b"k20", later[0]), (b"k24", later[1])])
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", 22)
    archive_and_trim(lake_archiver, lake_store, topic, before)
    ids3 = value_fields(table_metadata(lake_settings, topic))
    for name in ("id", "sensor", "at", "labels", "location", "__extra__", "__raw__"):
        assert ids3[name] == ids1[name], name
    assert ids3["value__v1"][0] == ids1["value"][0] and ids3["value"][1] == "string"
    assert ids3["firmware"][0] > max(i for i, _ in ids1.values())
    last = [r.value for r in lake_spark.sql(f"SELECT value FROM {table(topic)} ORDER BY kafka.offset").collect()][-2:]
    assert last[0]["firmware"].asDict() == {"version": "1.20", "__extra__": None} and last[0]["__extra__"] is None
    assert last[1]["value"] == "high" and last[1]["firmware"]["version"] == "1.24"
    for name in ("confluent", "kafka-python"):
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", 22) == before, name


def test_bad_schemas_and_payloads(lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any) -> None:
    url = lake_broker.registry_url
    # A schema that does not parse: 422 with the parser's own words.
    bad_avro = requests.post(f"{url}/subjects/bad-avro/versions",
                             json={"schema": json.dumps({"type": "record", "name": "R", "fields": [
                                 {"name": "a", "type": "no.such.Type"}]})})
    assert (bad_avro.status_code, bad_avro.json()["error_code"]) == (422, 42201)
    assert "no.such.Type" in bad_avro.json()["message"]
    bad_json = requests.post(f"{url}/subjects/bad-json/versions",
                             json={"schemaType": "JSON", "schema": json.dumps({"type": "objekt"})})
    assert (bad_json.status_code, bad_json.json()["error_code"]) == (422, 42201)
    assert "objekt" in bad_json.json()["message"]
    not_json = requests.post(f"{url}/subjects/bad-json/versions", json={"schemaType": "JSON", "schema": "{"})
    assert (not_json.status_code, not_json.json()["error_code"]) == (422, 42201)

    # A payload that does not match: reject → INVALID_RECORD naming the record; pass → an __err__ row.
    registry = SchemaRegistryClient({"url": url})
    for kind, good, bad in (
        ("avro", avro_serializer(registry, ORDER_V1), b"\x00\x00\x00\x00\x01\xff\xff"),
        ("json", JSONSerializer(json.dumps(JSON_V1), registry), b'{"id": "no number", '),
    ):
        strict, lenient = f"{kind}-strict", f"{kind}-lenient"
        create_topic(lake_broker.bootstrap, strict, 1, {"icelog.schema.value": f"subject:{kind}-shared-value",
                                                        "icelog.schema.value.on.parse.error": "reject",
                                                        "icelog.schema.value.coerce": "true"})
        create_topic(lake_broker.bootstrap, lenient, 1, {"icelog.schema.value": f"subject:{kind}-shared-value"})
        ctx = SerializationContext(f"{kind}-shared", MessageField.VALUE)
        sample = good(order(1) if kind == "avro" else reading(1), ctx)
        assert sample is not None
        # One batch, built by hand so no client's batching can split it: Kafka refuses the whole batch with
        # INVALID_RECORD and names the bad record's index (KIP-467); nothing of it is stored.
        with Connection(lake_broker) as conn:
            refused = produce(conn, strict, batch([sample, sample[5:], bad]))
            assert refused.error_code == INVALID_RECORD
            assert [e.batch_index for e in refused.record_errors] == [2], refused
            assert high_watermark(conn, strict) == 0
        produce_all(lake_broker, strict, [(None, sample), (None, sample[5:])])  # coerce: the envelope is added
        produce_all(lake_broker, lenient, [(None, sample), (None, bad)])
        results = lake_archiver.run_pass(force=True, topics=[strict, lenient])
        assert [r.error for r in results] == ["", ""], results
        strict_rows = lake_spark.sql(f"SELECT value FROM {table(strict)} ORDER BY kafka.offset").collect()
        assert [r.value["__err__"] for r in strict_rows] == [None, None]
        assert bytes(strict_rows[1].value["__prefix__"]) == sample[:5]  # coerced: the latest schema's envelope
        lenient_rows = lake_spark.sql(f"SELECT value FROM {table(lenient)} ORDER BY kafka.offset").collect()
        assert lenient_rows[0].value["__err__"] is None
        assert lenient_rows[1].value["__err__"] and bytes(lenient_rows[1].value["__raw__"]) == bad
