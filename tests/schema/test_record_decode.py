"""The archive's side decoder for Avro and JSON payloads: a batch decoded at once (the hot path, column by column)
gives exactly the rows of decoding each payload alone, `__raw__` kept or dropped by the same rule."""

from __future__ import annotations

import json
import struct

import pyarrow as pa

from icelog.schema.avro_schema import compile_avro
from icelog.schema.codec.record_decode import RecordSideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.compiled import AVRO, JSON, CompiledSchema
from icelog.schema.json_schema import compile_json
from icelog.table.avro_types import avro_columns
from icelog.table.field_ids import Column, evolve
from icelog.table.iceberg_types import RAW, arrow_schema, column_tree, table_columns
from icelog.table.json_types import json_columns
from tests.schema.avro_fixtures import body

AVRO_SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}


def envelope(schema_id: int, data: bytes) -> bytes:
    return b"\0" + struct.pack(">I", schema_id) + data


def decoder(
    side: str, schema_type: str, fields: tuple[Column, ...], schema: CompiledSchema
) -> tuple[RecordSideDecoder, pa.StructType]:
    records = evolve(table_columns(fields if side == "key" else None, fields if side == "value" else None), [])
    decoding = SideDecoding(side, column_tree(records, side), 1, {1: schema}, schema_type=schema_type)
    return RecordSideDecoder(decoding), arrow_schema(records).field(side).type


def test_avro_batch_rows_and_raw_bytes_equal_one_by_one() -> None:
    schema = compile_avro(json.dumps(AVRO_SCHEMA), {})
    fields = avro_columns(schema.document, "value")
    good = [body(AVRO_SCHEMA, {"id": i, "tags": ["a"] * (i % 3), "at": 1_700_000_000_000 + i}) for i in range(6)]
    padded = b"\x82\x00" + good[1][1:]  # id 1 as a non-minimal varint: decodes, but its row does not rebuild it
    payloads = [envelope(1, good[0]), None, envelope(1, padded), good[2], envelope(1, good[3]),
                envelope(1, good[4] + b"\x00"), envelope(1, good[5])]
    for side in ("value", "key"):
        dec, struct_type = decoder(side, AVRO, fields, schema)
        one_by_one = pa.array([dec.decode(p) for p in payloads], type=struct_type).to_pylist()
        assert dec.decode_many(payloads, struct_type).to_pylist() == one_by_one
        # every one decodes: the bulk path
        clean: list[bytes | None] = [p for p in payloads if p is not None and p != payloads[5]]
        assert dec.decode_many(clean, struct_type).to_pylist() == pa.array(
            [dec.decode(p) for p in clean], type=struct_type).to_pylist()
    dec, struct_type = decoder("value", AVRO, fields, schema)
    rows = dec.decode_many([p for p in payloads if p is not None and p != payloads[5]], struct_type).to_pylist()
    # only enveloped payloads whose row rebuilds them drop their bytes: not the padded one, not the bare body
    assert [row[RAW] is None for row in rows] == [True, False, False, True, True]


def test_json_batch_rows_equal_one_by_one_and_keep_their_bytes() -> None:
    document = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    schema = compile_json(json.dumps(document), {})
    fields = json_columns(schema.document, {}, "value")
    payloads = [envelope(1, json.dumps({"id": i, "name": f"n{i}"}).encode()) for i in range(4)] + [None]
    dec, struct_type = decoder("value", JSON, fields, schema)
    rows = dec.decode_many(payloads, struct_type).to_pylist()
    assert rows == pa.array([dec.decode(p) for p in payloads], type=struct_type).to_pylist()
    assert [row[RAW] for row in rows[:4]] == payloads[:4] and rows[4] is None


def test_a_datum_whose_value_no_column_holds_is_an_error_row_not_a_failed_batch() -> None:
    """fastavro reads an Avro int of any width and a timestamp-millis of any size; such a value does not fit the
    table's int or microsecond column. It was an exception out of decode_many (the archive task failed, every
    retry again: the partition stalled); it is the row of a payload that did not decode, its bytes kept."""
    document = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "int"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    schema = compile_avro(json.dumps(document), {})
    fields = avro_columns(schema.document, "value")
    good = body(document, {"n": 1, "at": 1_700_000_000_000})
    wide_int = b"\x80\x80\x80\x80\x80\x01" + good[1:]  # 2^34 as a zigzag varint where an int belongs
    huge_millis = good[:1] + body({"type": "long"}, 2**62)
    payloads: list[bytes | None] = [envelope(1, good), envelope(1, wide_int), envelope(1, huge_millis)]
    dec, struct_type = decoder("value", AVRO, fields, schema)
    rows = dec.decode_many(payloads, struct_type).to_pylist()
    assert rows[0]["n"] == 1 and rows[0]["__err__"] is None
    for row, payload in zip(rows[1:], payloads[1:], strict=True):
        assert row["__err__"] and row[RAW] == payload and row["n"] is None, row


def test_a_json_string_no_column_can_hold_is_an_error_row_not_a_failed_batch() -> None:
    """json.loads lets a lone surrogate into a string ("\\ud800", or its raw UTF-8 bytes); Arrow cannot encode it.
    It failed decode_many (the archive task at every retry); it is the row of a payload that did not decode."""
    document = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    schema = compile_json(json.dumps(document), {})
    dec, struct_type = decoder("value", JSON, json_columns(schema.document, {}, "value"), schema)
    bodies = [b'{"id": 1, "name": "ok"}', b'{"id": 2, "name": "\\ud800"}', b'{"id": 3, "name": "\xed\xa0\x80"}']
    payloads: list[bytes | None] = [envelope(1, body) for body in bodies]
    rows = dec.decode_many(payloads, struct_type).to_pylist()
    assert (rows[0]["id"], rows[0]["name"], rows[0]["__err__"]) == (1, "ok", None)
    for row, payload in zip(rows[1:], payloads[1:], strict=True):
        assert "UnicodeEncodeError" in row["__err__"] and row[RAW] == payload and row["id"] is None
