"""The compiled Avro decoder (schema/codec/avro_columns.py, _avro_columns.c) against fastavro, the reference.

The invariant, over every path at once: for any batch of payloads, `RecordSideDecoder.decode_many` (which takes
the compiled decoder whenever it covers the schema and the batch) gives exactly the rows, `__raw__` kept or dropped
alike, that decoding each payload alone with fastavro gives. Random datums of a schema with every construct the
compiled decoder covers, the same read into a table of another schema version, and thousands of corrupted bodies
(which the compiled decoder must refuse, or decode exactly as fastavro does).
"""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pyarrow as pa
import pytest

from icelog.schema.avro_schema import compile_avro
from icelog.schema.codec import avro_columns
from icelog.schema.codec.avro_columns import ColumnDecoder
from icelog.schema.codec.record_decode import RecordSideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.compiled import AVRO
from icelog.table.avro_types import avro_columns as table_fields
from icelog.table.field_ids import evolve
from icelog.table.iceberg_types import RAW, arrow_schema, column_tree, table_columns
from tests.schema.avro_fixtures import body
from tests.support.arrow_rows import assert_same_rows


@pytest.fixture(autouse=True)
def built() -> None:
    if not avro_columns.COMPILED:
        pytest.fail("icelog.schema.codec._avro_columns is not built: run `pip install -e .` (needs gcc and Python "
                    "headers)")


POINT = {"type": "record", "name": "Point", "fields": [
    {"name": "x", "type": "double"}, {"name": "label", "type": ["null", "string"]}]}
KIND = {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}
EVENT = {"type": "record", "name": "Event", "namespace": "t", "fields": [
    {"name": "flag", "type": "boolean"},
    {"name": "small", "type": "int"},
    {"name": "big", "type": "long"},
    {"name": "ratio", "type": "float"},
    {"name": "amount", "type": "double"},
    {"name": "name", "type": "string"},
    {"name": "blob", "type": "bytes"},
    {"name": "kind", "type": KIND},
    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "points", "type": {"type": "array", "items": POINT}},
    {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": ["int", "null"]}}},
    {"name": "maybe_point", "type": ["null", "Point"]},
    {"name": "maybe_kind", "type": ["t.Kind", "null"]},
    {"name": "note", "type": ["string", "null"]},
    {"name": "count", "type": ["null", "long"]},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "tod_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "tod_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "when", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "attrs", "type": {"type": "map", "values": "string"}},
    {"name": "scores", "type": ["null", {"type": "map", "values": ["null", "Point"]}]},
    {"name": "choice", "type": ["null", "long", "string", "Point", {"type": "array", "items": "int"}]},
    {"name": "either", "type": ["boolean", "t.Kind", "null", "bytes"]},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "wide", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}},
    {"name": "cost", "type": ["null", {"type": "fixed", "name": "Cost", "size": 9, "logicalType": "decimal",
                                        "precision": 20, "scale": 4}]},
    {"name": "uid", "type": {"type": "fixed", "name": "Uid", "size": 16, "logicalType": "uuid"}},
]}


def named() -> dict[str, Any]:
    return {"Point": POINT, "t.Point": POINT, "Kind": KIND, "t.Kind": KIND}


def envelope(data: bytes) -> bytes:
    return b"\0" + struct.pack(">I", 1) + data


def datum(schema: Any, rng: random.Random, named: dict[str, Any]) -> Any:
    """A random value of an Avro schema, as fastavro's writer takes it (logical types as their base values)."""
    if isinstance(schema, list):
        branch = rng.choice(schema)
        return None if branch == "null" else datum(branch, rng, named)
    if isinstance(schema, str):
        if schema in named:
            return datum(named[schema], rng, named)
        return {
            "boolean": lambda: rng.random() < 0.5,
            "int": lambda: rng.choice([0, -1, 1, 63, -64, 64, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)]),
            "long": lambda: rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)]),
            "float": lambda: struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0],
            "double": lambda: rng.choice([0.0, -0.0, math.inf, rng.uniform(-1e300, 1e300)]),
            "string": lambda: "".join(rng.choice("aé€😀\0 ") for _ in range(rng.randint(0, 6))),
            "bytes": lambda: rng.randbytes(rng.randint(0, 5)),
        }[schema]()
    kind = schema["type"]
    if isinstance(kind, (dict, list)):
        return datum(kind, rng, named)
    if kind in ("record", "enum", "fixed"):
        named.setdefault(schema["name"], schema)
        named.setdefault(f"t.{schema['name']}", schema)
    if kind == "record":
        return {f["name"]: datum(f["type"], rng, named) for f in schema["fields"]}
    if kind == "enum":
        return rng.choice(schema["symbols"])
    if kind == "fixed":
        if schema.get("logicalType") == "decimal":
            digits = 10 ** schema["precision"]
            return rng.randrange(-digits + 1, digits).to_bytes(schema["size"], "big", signed=True)
        return rng.randbytes(schema["size"])
    if kind == "map":
        return {f"k{rng.randrange(9)}": datum(schema["values"], rng, named) for _ in range(rng.choice([0, 1, 4]))}
    if kind == "array":
        return [datum(schema["items"], rng, named) for _ in range(rng.choice([0, 1, 3]))]
    logical = schema.get("logicalType")
    if logical == "decimal":
        digits = 10 ** schema["precision"]
        unscaled = rng.choice([0, -1, 127, -128, 128, digits - 1, -digits + 1, rng.randrange(-digits + 1, digits)])
        return unscaled.to_bytes((unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()) // 8 + 1,
                                 "big", signed=True)
    if logical == "uuid":
        return "12345678-1234-5678-1234-567812345678"
    if logical in ("timestamp-millis", "local-timestamp-millis"):
        return rng.randint(-(5 * 10**12), 5 * 10**12)
    if logical in ("timestamp-micros", "time-micros"):
        return rng.randint(0, 86_400_000_000 - 1)
    if logical == "time-millis":
        return rng.randint(0, 86_400_000 - 1)
    if logical == "date":
        return rng.randint(-100_000, 100_000)
    return datum(kind, rng, named)


def raw_schema(schema: Any) -> Any:
    """The schema without logical types: fastavro then writes the base values the datums hold."""
    if isinstance(schema, list):
        return [raw_schema(s) for s in schema]
    if isinstance(schema, dict):
        return {k: raw_schema(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def side(writer: dict[str, Any], table: dict[str, Any] | None = None) -> tuple[RecordSideDecoder, pa.StructType]:
    """The value side's decoder for payloads of `writer` into the table made from `table` (default: the writer)."""
    compiled = compile_avro(json.dumps(writer), {})
    records = evolve(table_columns(None, table_fields(compile_avro(json.dumps(table or writer), {}).document,
                                                      "value")), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: compiled}, schema_type=AVRO)
    return RecordSideDecoder(decoding), arrow_schema(records).field("value").type


def same_rows(decoder: RecordSideDecoder, struct_type: pa.StructType, payloads: list[bytes | None]) -> list[Any]:
    """decode_many's rows, asserted equal (NaN included) to fastavro's, payload by payload."""
    return assert_same_rows(decoder.decode_many(payloads, struct_type), decoder.decode_each(payloads, struct_type),
                            struct_type)


def compiled_takes(decoder: RecordSideDecoder, struct_type: pa.StructType, payloads: list[bytes | None]) -> bool:
    """Whether the compiled decoder takes this batch (else decode_many went to fastavro)."""
    columns = ColumnDecoder.for_schema(decoder.decoding.schemas[1], decoder.decoding.column,  # type: ignore[arg-type]
                                       struct_type)
    assert columns is not None, "the compiled decoder covers this schema"
    return columns.decode([p[5:] for p in payloads if p is not None]) is not None


def test_random_datums_of_every_covered_construct_decode_as_fastavro_and_drop_their_bytes() -> None:
    rng = random.Random(7)
    decoder, struct_type = side(EVENT)
    for size in (1, 7, 300):
        values = [datum(EVENT, rng, named()) for _ in range(size)]
        payloads: list[bytes | None] = [envelope(body(raw_schema(EVENT), v)) for v in values]
        assert compiled_takes(decoder, struct_type, payloads)
        rows = same_rows(decoder, struct_type, payloads)
        assert all(row[RAW] is None for row in rows), "a canonical datum's row rebuilds it: its bytes are dropped"
        first = rows[0]
        assert first["kind"] == values[0]["kind"] and first["big"] == values[0]["big"]
        assert first["tags"] == values[0]["tags"] and first["hash"] == values[0]["hash"]


def test_a_table_of_another_schema_version_takes_what_fits() -> None:
    """Fields the table lacks are dropped (bytes kept), columns the writer lacks are null, int and float promoted,
    and a field whose type changed beyond promotion is null."""
    table = {**EVENT, "fields": [
        *[f for f in EVENT["fields"] if f["name"] not in ("blob", "small", "ratio", "name")],
        {"name": "small", "type": "long"}, {"name": "ratio", "type": "double"}, {"name": "name", "type": "long"},
        {"name": "added", "type": ["null", "string"], "default": None},
    ]}
    rng = random.Random(11)
    payloads: list[bytes | None] = [envelope(body(raw_schema(EVENT), datum(EVENT, rng, named()))) for _ in range(50)]
    decoder, struct_type = side(EVENT, table)
    assert compiled_takes(decoder, struct_type, payloads)
    rows = same_rows(decoder, struct_type, payloads)
    assert all(row[RAW] == p for row, p in zip(rows, payloads, strict=True)), "a field without a column: bytes kept"
    assert {row["name"] for row in rows} == {None} and {row["added"] for row in rows} == {None}
    assert all(isinstance(row["small"], int) for row in rows)


def test_corrupted_bodies_are_refused_or_decoded_exactly_as_fastavro_does() -> None:
    rng = random.Random(3)
    decoder, struct_type = side(EVENT)
    clean = [body(raw_schema(EVENT), datum(EVENT, rng, named())) for _ in range(40)]
    taken = 0
    for trial in range(1500):
        data = bytearray(rng.choice(clean))
        mutation = trial % 5
        at = rng.randrange(len(data))
        if mutation == 0:
            data[at] = rng.randrange(256)
        elif mutation == 1:
            data[at] ^= 1 << rng.randrange(8)
        elif mutation == 2:
            del data[at:at + rng.randint(1, 3)]
        elif mutation == 3:
            data[at:at] = rng.randbytes(rng.randint(1, 3))
        else:
            data += rng.randbytes(1)
        payloads: list[bytes | None] = [envelope(bytes(data))]
        taken += compiled_takes(decoder, struct_type, payloads)
        same_rows(decoder, struct_type, payloads)
        same_rows(decoder, struct_type, [envelope(clean[0]), *payloads, envelope(clean[1])])
    assert taken > 50, "some corruptions are still canonical datums, which the compiled decoder takes"


@pytest.mark.parametrize("data", [
    b"\x02",  # a boolean 2
    b"\x00\x80\x00",  # a padded varint
    b"\x00\x00\x00\x00\x00\x00\xf8\x7f",  # NaN
])
def test_what_the_compiled_decoder_refuses_fastavro_still_decodes(data: bytes) -> None:
    writer = {"type": "record", "name": "R", "fields": [
        {"name": "b", "type": "boolean"} if data == b"\x02" else
        {"name": "n", "type": "long"} if data[1:2] == b"\x80" else {"name": "d", "type": "double"}]}
    if data[1:2] == b"\x80":
        writer["fields"].insert(0, {"name": "m", "type": "long"})
    payloads: list[bytes | None] = [envelope(data)]
    decoder, struct_type = side(writer)
    assert not compiled_takes(decoder, struct_type, payloads)
    [row] = same_rows(decoder, struct_type, payloads)
    assert row["__err__"] is None, "decoded by fastavro"


def test_schemas_the_compiled_decoder_does_not_cover() -> None:
    covered = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    for field in (["null", "int", "long"], ["float", "double"], ["string"], "R",
                  {"type": "fixed", "name": "F", "size": 17, "logicalType": "decimal", "precision": 38}):
        writer = {**covered, "fields": [*covered["fields"], {"name": "b", "type": field}]}
        decoder, struct_type = side(writer)
        assert ColumnDecoder.for_schema(decoder.decoding.schemas[1], decoder.decoding.column,  # type: ignore[arg-type]
                                        struct_type) is None
