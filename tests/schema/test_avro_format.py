"""Avro schemas end to end without a broker: compile (errors, references), canonical form, compatibility,
the Avro → Iceberg column mapping, and the codec that turns datums into rows and back."""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import pickle
import uuid
from typing import Any

import pytest

from icelog.schema.avro_schema import AvroSchema, canonical, compile_avro, incompatibilities
from icelog.schema.codec.avro_codec import AvroRows, payload_problem
from icelog.schema.protobuf_schema import InvalidSchemaError
from icelog.table.avro_types import avro_columns
from icelog.table.field_ids import Column
from tests.schema.avro_fixtures import ADDRESS, ORDER, ORDER_TEXT, REFERENCES, body, order, order_named

C = Column


def record(name: str, *fields: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t, **extra.get(n, {})} for n, t in fields]}


def compiled(schema: Any, references: dict[str, str] | None = None) -> AvroSchema:
    return compile_avro(json.dumps(schema), references or {})


def table_column(schema: AvroSchema) -> Column:
    return Column("value", "struct", avro_columns(schema.document, "value"))


# --- compile ---------------------------------------------------------------------------------------------------


def test_a_schema_that_does_not_parse_is_refused_with_the_parsers_message() -> None:
    with pytest.raises(InvalidSchemaError, match="Unknown type: Nope"):
        compiled(record("R", ("a", "Nope")))
    with pytest.raises(InvalidSchemaError, match="Default value <x> must match schema type: int"):
        compiled(record("R", ("a", "int"), a={"default": "x"}))
    with pytest.raises(InvalidSchemaError, match="All symbols in an enum must be unique"):
        compiled({"type": "enum", "name": "E", "symbols": ["A", "A"]})
    with pytest.raises(InvalidSchemaError, match="Invalid schema JSON: Expecting"):
        compile_avro('{"type": "record",', {})


def test_a_named_type_registered_separately_is_referenced_by_its_full_name() -> None:
    schema = compile_avro(ORDER_TEXT, REFERENCES)
    document = schema.document
    ship_to = next(f for f in document["fields"] if f["name"] == "ship_to")
    bill_to = next(f for f in document["fields"] if f["name"] == "bill_to")
    assert ship_to["type"]["name"] == "com.acme.Address"  # expanded inline at its first use
    assert bill_to["type"] == ["null", "com.acme.Address"]  # and named after it
    assert "com.acme.Address" in schema.named_types()
    assert pickle.loads(pickle.dumps(schema)) == schema
    assert hash(schema) == hash(AvroSchema(schema.text, schema.references))


def test_references_may_use_each_other_in_any_order_and_a_missing_one_is_refused() -> None:
    country = {"type": "enum", "name": "Country", "namespace": "com.acme", "symbols": ["DE", "FR"]}
    address = {**ADDRESS, "fields": [*ADDRESS["fields"], {"name": "country", "type": "com.acme.Country"}]}
    references = {"com.acme.Address": json.dumps(address), "com.acme.Country": json.dumps(country)}
    schema = compile_avro(ORDER_TEXT, references)
    assert schema.references == (json.dumps(country), json.dumps(address))  # a type before its users
    with pytest.raises(InvalidSchemaError, match="com.acme.Country"):
        compile_avro(ORDER_TEXT, {"com.acme.Address": json.dumps(address)})
    with pytest.raises(InvalidSchemaError, match="reference 'com.acme.Address'"):
        compile_avro(ORDER_TEXT, {"com.acme.Address": "{not json"})


def test_canonical_form_is_equal_for_spelling_variants() -> None:
    a = compiled({"type": "record", "name": "R", "namespace": "com.acme",
                  "fields": [{"name": "a", "type": {"type": "int"}}, {"name": "b", "type": "string"}]})
    text = '{ "fields" : [ {"type":"int","name":"a"}, {"name":"b","type":{"type":"string"}} ], "name":"com.acme.R",' \
           ' "type" : "record" }'
    b = compile_avro(text, {})
    assert canonical(a) == canonical(b) == b'{"fields":[{"name":"a","type":"int"},{"name":"b","type":"string"}],' \
        b'"name":"com.acme.R","type":"record"}'
    assert canonical(a) != canonical(compiled(record("com.acme.R", ("a", "long"), ("b", "string"))))
    # Defaults and logical types change what a schema reads (Parsing Canonical Form would drop them): other schemas.
    with_default = compiled({"type": "record", "name": "com.acme.R", "fields": [
        {"name": "a", "type": "int", "default": 0}, {"name": "b", "type": "string"}]})
    as_date = compiled({"type": "record", "name": "com.acme.R", "fields": [
        {"name": "a", "type": {"type": "int", "logicalType": "date"}}, {"name": "b", "type": "string"}]})
    assert len({canonical(a), canonical(with_default), canonical(as_date)}) == 3


# --- compatibility (BACKWARD = incompatibilities(old, new), FORWARD = incompatibilities(new, old)) ----------------

V1 = record("R", ("id", "long"), ("n", "int"), ("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]}),
            ("u", ["null", "string"]))


def evolved(change: Any) -> AvroSchema:
    schema = copy.deepcopy(V1)
    change(schema["fields"])
    return compiled(schema)


def test_adding_a_field_with_a_default_is_backward_compatible() -> None:
    v2 = evolved(lambda f: f.append({"name": "note", "type": "string", "default": ""}))
    assert incompatibilities(compiled(V1), v2) == []


def test_adding_a_field_without_a_default_is_refused_naming_the_field() -> None:
    v2 = evolved(lambda f: f.append({"name": "note", "type": "string"}))
    [problem] = incompatibilities(compiled(V1), v2)
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in problem and "'note'" in problem
    assert incompatibilities(v2, compiled(V1)) == []  # forward: the old reader ignores the new field


def test_removing_a_field_is_backward_compatible_and_forward_only_with_a_default() -> None:
    v2 = evolved(lambda f: f.pop(1))
    assert incompatibilities(compiled(V1), v2) == []
    [problem] = incompatibilities(v2, compiled(V1))
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in problem and "'n'" in problem


def test_widening_int_to_long_is_backward_but_not_forward_compatible() -> None:
    v2 = evolved(lambda f: f[1].update(type="long"))
    assert incompatibilities(compiled(V1), v2) == []
    [problem] = incompatibilities(v2, compiled(V1))
    assert problem.startswith("TYPE_MISMATCH: field 'n'") and "reader type: int not compatible with writer type: long" \
        in problem


def test_adding_an_enum_symbol_is_backward_but_not_forward_compatible() -> None:
    v2 = evolved(lambda f: f[2]["type"]["symbols"].append("C"))
    assert incompatibilities(compiled(V1), v2) == []
    [problem] = incompatibilities(v2, compiled(V1))
    assert "MISSING_ENUM_SYMBOLS" in problem and "field 'e'" in problem and "C" in problem


def test_adding_a_union_branch_is_backward_but_not_forward_compatible() -> None:
    v2 = evolved(lambda f: f[3].update(type=["null", "string", "long"]))
    assert incompatibilities(compiled(V1), v2) == []
    [problem] = incompatibilities(v2, compiled(V1))
    assert "MISSING_UNION_BRANCH" in problem and "field 'u'" in problem and "LONG" in problem


def test_a_nested_record_change_names_the_nested_field() -> None:
    old = compile_avro(ORDER_TEXT, REFERENCES)
    address = {**ADDRESS, "fields": [*ADDRESS["fields"], {"name": "floor", "type": "int"}]}
    new = compile_avro(ORDER_TEXT, {"com.acme.Address": json.dumps(address)})
    problems = incompatibilities(old, new)
    assert problems and all("'ship_to.floor'" in p or "'bill_to" in p or "choice" in p for p in problems)
    assert any("'ship_to.floor'" in p for p in problems)


# --- Avro → Iceberg columns ---------------------------------------------------------------------------------------


def test_every_avro_type_maps_to_its_iceberg_column() -> None:
    address = record("Address", ("city", "string"))
    address["namespace"] = "com.acme"
    schema = record(
        "com.acme.All",
        ("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"), ("b", "boolean"), ("s", "string"),
        ("by", "bytes"), ("fx", {"type": "fixed", "name": "F4", "size": 4}),
        ("en", {"type": "enum", "name": "Color", "symbols": ["RED"]}),
        ("arr", {"type": "array", "items": "long"}), ("m", {"type": "map", "values": "double"}),
        ("rec", address), ("opt", ["null", "com.acme.Address"]), ("opt2", ["string", "null"]),
        ("u", ["null", "int", "string", "com.acme.Address", {"type": "array", "items": "int"}]),
        ("date", {"type": "int", "logicalType": "date"}),
        ("tms", {"type": "int", "logicalType": "time-millis"}), ("tus", {"type": "long", "logicalType": "time-micros"}),
        ("tsm", {"type": "long", "logicalType": "timestamp-millis"}),
        ("tsu", {"type": "long", "logicalType": "timestamp-micros"}),
        ("ltm", {"type": "long", "logicalType": "local-timestamp-millis"}),
        ("ltu", {"type": "long", "logicalType": "local-timestamp-micros"}),
        ("dec", {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}),
        ("decf", {"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 2}),
        ("uuid", {"type": "string", "logicalType": "uuid"}),
        ("odd", {"type": "long", "logicalType": "something-else"}),
    )
    city = (C("city", "string"),)
    assert avro_columns(compiled(schema).document, "value") == (
        C("i", "int"), C("l", "long"), C("f", "float"), C("d", "double"), C("b", "boolean"), C("s", "string"),
        C("by", "binary"), C("fx", "binary"), C("en", "string"),
        C("arr", "list", (C("element", "long"),)), C("m", "map", (C("key", "string"), C("value", "double"))),
        C("rec", "struct", city), C("opt", "struct", city), C("opt2", "string"),
        C("u", "struct", (C("int", "int"), C("string", "string"), C("Address", "struct", city),
                          C("array", "list", (C("element", "int"),)))),
        C("date", "date"), C("tms", "long"), C("tus", "long"), C("tsm", "timestamptz"), C("tsu", "timestamptz"),
        C("ltm", "timestamp"), C("ltu", "timestamp"), C("dec", "decimal(20,4)"), C("decf", "decimal(18,2)"),
        C("uuid", "string"), C("odd", "long"),
    )


def test_a_non_record_schema_is_one_column_and_recursion_is_cut_to_a_string() -> None:
    assert avro_columns("string", "value") == (C("value", "string"),)
    assert avro_columns({"type": "array", "items": "int"}, "key") == (C("key", "list", (C("element", "int"),)),)
    node = record("Node", ("v", "int"), ("next", ["null", "Node"]), ("kids", {"type": "array", "items": "Node"}))
    assert avro_columns(compiled(node).document, "value") == (
        C("v", "int"), C("next", "string"), C("kids", "list", (C("element", "string"),)),
    )


# --- the codec ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def orders() -> tuple[AvroSchema, AvroRows, list[bytes]]:
    schema = compile_avro(ORDER_TEXT, REFERENCES)
    named = order_named()
    return schema, AvroRows(schema, table_column(schema)), [body(ORDER, order(i), named) for i in range(40)]


def test_confluent_avro_serializer_bodies_decode_and_reencode_byte_for_byte() -> None:
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient.new_client({"url": "mock://avro-format"})  # confluent-kafka's in-process registry
    client.register_schema("com.acme.Address", Schema(json.dumps(ADDRESS), "AVRO"))
    order_schema = Schema(ORDER_TEXT, "AVRO", [SchemaReference("com.acme.Address", "com.acme.Address", 1)])
    serializer = AvroSerializer(client, order_schema)
    context = SerializationContext("orders", MessageField.VALUE)
    bodies = [serializer(order(i), context)[5:] for i in range(12)]  # strip the envelope: magic byte, schema id
    schema = compile_avro(ORDER_TEXT, REFERENCES)
    rows = AvroRows(schema, table_column(schema))
    assert [rows.encode(rows.decode(b)) for b in bodies] == bodies
    assert bodies == [body(ORDER, order(i), order_named()) for i in range(12)]  # what the other tests build


def test_avro_serializer_bodies_reencode_byte_for_byte(orders: tuple[AvroSchema, AvroRows, list[bytes]]) -> None:
    _, rows, bodies = orders
    assert rows.invertible
    for b in bodies:
        assert rows.encode(rows.decode(b)) == b
    columns = rows.decode_many(bodies)
    assert [rows.encode({k: v[i] for k, v in columns.items()}) for i in range(len(bodies))] == bodies


def test_decode_many_rebuilt_says_which_rows_give_back_their_bytes(
    orders: tuple[AvroSchema, AvroRows, list[bytes]],
) -> None:
    """The archive drops a payload's bytes only where its row encodes back to them exactly."""
    _, rows, bodies = orders
    columns, rebuilt = rows.decode_many_rebuilt(bodies)
    assert columns == rows.decode_many(bodies) and rebuilt == [True] * len(bodies)
    # An int written with a non-minimal varint (0x82 0x00 is 1): the row holds 1, which encodes as 0x02.
    plain = compiled(record("R", ("id", "long"), ("n", "int")))
    plain_rows = AvroRows(plain, table_column(plain))
    canonical_body = body(json.loads(plain.text), {"id": 7, "n": 1})
    padded_varint = canonical_body[:1] + b"\x82\x00"
    assert plain_rows.decode(padded_varint) == plain_rows.decode(canonical_body)
    assert plain_rows.decode_many_rebuilt([canonical_body, padded_varint, canonical_body])[1] == [True, False, True]
    # A decimal padded by its writer (1.00 as 3 bytes): the row encodes the minimal form, so the bytes are kept.
    money = compiled(record("M", ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2})))
    money_rows = AvroRows(money, table_column(money))
    minimal, padded = b"\x02\x64", b"\x04\x00\x64"  # 100 unscaled, in 1 byte (as Java writes) and in 2
    assert money_rows.decode(padded) == money_rows.decode(minimal) == {"amount": decimal.Decimal("1.00")}
    assert money_rows.decode_many_rebuilt([minimal, padded])[1] == [True, False]
    # A column that does not hold every field: no row rebuilds its body.
    lossy = AvroRows(plain, Column("value", "struct", (C("id", "long"),)))
    assert lossy.decode_many_rebuilt([canonical_body])[1] == [False]


def test_rows_are_typed_as_their_columns(orders: tuple[AvroSchema, AvroRows, list[bytes]]) -> None:
    _, rows, bodies = orders
    row = rows.decode(bodies[3])
    assert row["id"] == 1_000_003 and row["status"] == "NEW"
    assert row["amount"] == decimal.Decimal("1.11") and isinstance(row["amount"], decimal.Decimal)
    created = datetime.datetime(2026, 11, 25, 19, 0, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=3 * 1013)
    assert row["created"] == (created - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(
        microseconds=1)
    assert row["day"] == (datetime.date(2026, 1, 4) - datetime.date(1970, 1, 1)).days
    assert row["ship_to"] == {"street": "3 Main St", "city": "Springfield", "zip": None}
    assert row["lines"] == [{"sku": "SKU-3-0", "qty": 1, "price": 9.99}]
    assert row["attrs"] == [("channel", "web"), ("coupon", "C3")]
    assert row["note"] is None and row["ref"] == "00000000-0000-0000-0000-000000005ccd"
    assert row["choice"] == {"long": None, "string": None, "Address": {"street": "x", "city": "y", "zip": None}}
    assert rows.decode(bodies[1])["choice"] == {"long": 1, "string": None, "Address": None}
    assert rows.decode(bodies[0])["choice"] is None
    columns = rows.decode_many(bodies[:4])
    assert columns["id"] == [1_000_000, 1_000_001, 1_000_002, 1_000_003]
    assert columns["ship_to"][3] == row["ship_to"]


def test_an_older_writer_fills_a_newer_table_with_nones() -> None:
    old = compiled(record("R", ("id", "long"), ("n", "int"), ("gone", "string")))
    new = compiled(record("R", ("id", "long"), ("n", "long"), ("extra", ["null", "string"]),
                          ("when", {"type": "long", "logicalType": "timestamp-millis"})))
    rows = AvroRows(old, table_column(new))
    data = body(json.loads(old.text), {"id": 7, "n": 5, "gone": "x"})
    assert rows.decode(data) == {"id": 7, "n": 5, "extra": None, "when": None}  # int → long promoted
    assert rows.decode_many([data, data]) == {"id": [7, 7], "n": [5, 5], "extra": [None, None], "when": [None, None]}
    assert not rows.invertible  # "gone" has no column: the archive must keep the bytes
    mismatched = AvroRows(old, Column("value", "struct", (C("id", "string"), C("n", "int"))))
    assert mismatched.decode(data) == {"id": None, "n": 5}


def test_a_row_read_back_from_the_table_encodes_to_the_produced_bytes(
    orders: tuple[AvroSchema, AvroRows, list[bytes]],
) -> None:
    _, rows, bodies = orders
    row = rows.decode(bodies[5])
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    read_back = {
        **row,
        "created": epoch + datetime.timedelta(microseconds=row["created"]),  # pyiceberg: aware datetime
        "day": datetime.date(1970, 1, 1) + datetime.timedelta(days=row["day"]),
        "attrs": dict(row["attrs"]),  # Spark asDict(recursive=True): a dict
    }
    assert rows.encode(read_back) == bodies[5]
    naive = {**read_back, "created": read_back["created"].replace(tzinfo=None)}  # Spark: naive UTC wall clock
    assert rows.encode(naive) == bodies[5]
    with pytest.raises(ValueError):
        rows.encode({**row, "status": "UNKNOWN"})
    with pytest.raises(ValueError):
        rows.encode({**row, "ship_to": None})


def test_a_body_that_is_not_one_datum_is_a_payload_problem(orders: tuple[AvroSchema, AvroRows, list[bytes]]) -> None:
    schema, rows, bodies = orders
    assert payload_problem(schema, bodies[0]) is None
    assert payload_problem(schema, bodies[0] + b"\x00") == "1 bytes after the Avro datum"
    assert payload_problem(schema, bodies[0][:-3]) is not None
    wrong = body({"type": "record", "name": "X", "fields": [{"name": "s", "type": "string"}]}, {"s": "\xff" * 3})
    assert payload_problem(schema, wrong) is not None
    for bad in (bodies[0] + b"\x00", bodies[0][:-3], wrong):
        with pytest.raises(Exception):  # noqa: B017 - decode raises whatever the reader raises
            rows.decode(bad)
        with pytest.raises(Exception):  # noqa: B017
            rows.decode_many([bodies[1], bad])


def test_logical_types_decode_to_the_stored_integers_and_encode_back() -> None:
    schema = compiled(record(
        "L",
        ("tms", {"type": "int", "logicalType": "time-millis"}), ("tus", {"type": "long", "logicalType": "time-micros"}),
        ("ltm", {"type": "long", "logicalType": "local-timestamp-millis"}),
        ("ltu", {"type": "long", "logicalType": "local-timestamp-micros"}),
        ("tsu", {"type": "long", "logicalType": "timestamp-micros"}),
        ("decf", {"type": "fixed", "name": "D", "size": 6, "logicalType": "decimal", "precision": 12, "scale": 3}),
        ("uf", {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}),
        ("fx", {"type": "fixed", "name": "F2", "size": 2}),
    ))
    local = datetime.datetime(2026, 11, 25, 20, 15, 1, 250_000)
    text_uuid = "12345678-1234-5678-1234-567812345678"
    value = {
        "tms": datetime.time(20, 15, 1, 250_000), "tus": datetime.time(20, 15, 1, 250_001),
        "ltm": local, "ltu": local, "tsu": local.replace(tzinfo=datetime.UTC),
        "decf": decimal.Decimal("-12345.678"), "uf": uuid.UUID(text_uuid).bytes, "fx": b"\x00\xff",
    }
    data = body(json.loads(schema.text), value)
    rows = AvroRows(schema, table_column(schema))
    row = rows.decode(data)
    local_us = (local - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    assert row == {
        "tms": 72_901_250_000, "tus": 72_901_250_001, "ltm": local_us, "ltu": local_us, "tsu": local_us,
        "decf": decimal.Decimal("-12345.678"), "uf": text_uuid, "fx": b"\x00\xff",
    }
    assert rows.invertible and rows.encode(row) == data
    assert rows.encode({**row, "ltm": local, "tms": datetime.time(20, 15, 1, 250_000), "fx": bytearray(b"\x00\xff")}) \
        == data


def test_a_non_record_schema_and_a_recursive_record_decode_into_their_columns() -> None:
    text = compiled({"type": "array", "items": ["null", "string"]})
    rows = AvroRows(text, Column("value", "struct", avro_columns(text.document, "value")))
    data = body(json.loads(text.text), ["a", None])
    assert rows.decode(data) == {"value": ["a", None]} and rows.decode_many([data]) == {"value": [["a", None]]}
    assert rows.invertible and rows.encode({"value": ["a", None]}) == data
    node = compiled(record("Node", ("v", "int"), ("next", ["null", "Node"])))
    rows = AvroRows(node, table_column(node))
    data = body(json.loads(node.text), {"v": 1, "next": {"v": 2, "next": None}})
    assert rows.decode(data) == {"v": 1, "next": '{"next":null,"v":2}'}
    assert not rows.invertible  # the cut is JSON text: the archive keeps the bytes
    assert rows.encode(rows.decode(data)) == data


def test_a_38_digit_decimal_keeps_every_digit() -> None:
    schema = compiled(record("M", ("d", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10})))
    value = decimal.Decimal("-1234567890123456789012345678.9012345678")
    data = body(json.loads(schema.text), {"d": value})
    rows = AvroRows(schema, table_column(schema))
    assert rows.decode(data) == {"d": value} and str(rows.decode(data)["d"]) == str(value)
    assert rows.encode({"d": value}) == data
