"""Protobuf → Iceberg type mapping, field-id allocation and evolution, and worker-side decoding (no Spark)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor

from icelog.schema.codec.proto_decode import ProtoSideDecoder as SideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.protobuf_schema import compile_schema, encode_envelope, message_descriptor
from icelog.table.field_ids import Column, TableColumn, evolve
from icelog.table.iceberg_types import (
    arrow_schema,
    column_tree,
    iceberg_schema,
    records_from_schema,
    spark_ddl,
    table_columns,
)
from icelog.table.protobuf_types import fields_of


def proto_table_columns(key: Descriptor | None, value: Descriptor | None) -> tuple[Column, ...]:
    """The table_columns of Protobuf messages."""
    return table_columns(fields_of(key), fields_of(value))


EVERYTHING = (Path(__file__).parents[1] / "support" / "protos" / "everything.proto").read_text()


def descriptor(text: str, name: str) -> object:
    return message_descriptor(compile_schema(text, {}), None, name)


def value_types(records: list[TableColumn]) -> dict[str, str]:
    """Column name → Iceberg type, without field ids."""
    schema = iceberg_schema(records)
    return {f.name: re.sub(r"\d+: ", "", str(f.field_type)) for f in schema.find_field("value").field_type.fields}


def test_every_protobuf_type_maps_to_its_iceberg_type() -> None:
    records = evolve(proto_table_columns(None, descriptor(EVERYTHING, "icelog.test.Everything")), [])
    types = value_types(records)
    assert types == {
        "i32": "int", "s32": "int", "sf32": "int", "u32": "long", "f32": "long",
        "i64": "long", "s64": "long", "sf64": "long", "u64": "decimal(20, 0)", "f64": "decimal(20, 0)",
        "fl": "float", "db": "double", "b": "boolean", "s": "string", "by": "binary",
        "color": "string",
        # Inner.children is Inner again: recursion stops there, as JSON text.
        "inner": "struct<name: optional string, n: optional int, children: optional list<string>>",
        "nums": "list<int>",
        "inners": "list<struct<name: optional string, n: optional int, "
        "children: optional list<string>>>",
        "counts": "map<string, long>",
        "by_id": "map<int, struct<name: optional string, n: optional int, "
        "children: optional list<string>>>",
        "text": "string", "number": "long",
        "nested": "struct<name: optional string, n: optional int, children: optional list<string>>",
        "ts": "timestamptz", "dur": "long", "w_i32": "int", "w_s": "string", "w_u64": "decimal(20, 0)",
        "st": "string", "val": "string", "any": "string", "maybe": "string", "colors": "list<string>",
        "__prefix__": "binary", "__err__": "string", "__raw__": "binary",
    }
    # key without a schema: only __raw__; the fixed columns are the raw layout's.
    schema = iceberg_schema(records)
    assert [f.name for f in schema.fields] == ["key", "value", "headers", "kafka"]
    assert str(schema.find_field("key").field_type) == "struct<2: __raw__: optional binary>"
    assert records_from_schema(schema) == [r for r in records]
    assert "`u64`: DECIMAL(20,0)" in spark_ddl(records)
    assert arrow_schema(records).field("value").type.field("ts").type == pa.timestamp("us", tz="UTC")


V1 = """syntax = "proto3"; package ev;
message M { string id = 1; int32 amount = 2; string note = 3; repeated int32 tags = 4; }"""
V2 = """syntax = "proto3"; package ev;
message M { string id = 1; int32 amount = 2; string note = 3; repeated int32 tags = 4; bool flag = 5; }"""
V3 = """syntax = "proto3"; package ev;
message M { string id = 1; string amount = 2; repeated string tags = 4; bool flag = 5; int64 big = 6; }"""


def ids(records: list[TableColumn]) -> dict[str, tuple[int, str, bool]]:
    return {r.path: (r.field_id, r.signature, r.deleted) for r in records}


def test_evolution_keeps_ids_adds_deletes_and_renames() -> None:
    v1 = evolve(proto_table_columns(None, descriptor(V1, "ev.M")), [])
    v2 = evolve(proto_table_columns(None, descriptor(V2, "ev.M")), v1)
    v3 = evolve(proto_table_columns(None, descriptor(V3, "ev.M")), v2)
    one, two, three = ids(v1), ids(v2), ids(v3)
    # v2 adds `flag` with a new id above every id; every other column keeps its id.
    assert {p: two[p] for p in one} == one
    assert two["value.flag"][0] > max(i for i, _, _ in one.values())
    # v3: `note` removed → kept, deleted; `amount` int → string and `tags` list<int> → list<string>:
    # the old columns are renamed <name>__v1 (same id, deleted) and new ones take the name with new ids.
    assert three["value.note"] == (one["value.note"][0], "string", True)
    assert three["value.amount__v1"] == (one["value.amount"][0], "int", True)
    assert three["value.amount"][1:] == ("string", False) and three["value.amount"][0] > two["value.flag"][0]
    assert three["value.tags__v1"][0] == one["value.tags"][0]
    assert three["value.tags__v1.element"] == (one["value.tags.element"][0], "int", True)
    assert three["value.tags.element"][1] == "string"
    for path in ("key", "key.__raw__", "value", "value.id", "value.flag", "kafka.offset", "headers.element.key"):
        assert three[path][0] == two[path][0]
    # int → long is a safe promotion: same id, new type. A removed field that comes back keeps its id.
    v4 = evolve(proto_table_columns(None, descriptor(V3.replace("string amount", "int64 amount").replace(
        "int64 big = 6;", "int64 big = 6; string note = 3;"), "ev.M")), v3)
    four = ids(v4)
    assert four["value.note"] == (one["value.note"][0], "string", False)
    assert four["value.amount__v2"] == (three["value.amount"][0], "string", True)  # string → long: renamed
    # The Iceberg schema holds every column, deleted ones too (old data files still resolve by id).
    assert {"amount__v1", "amount__v2", "tags__v1", "note"} <= set(value_types(v4))


def test_new_ids_stay_above_the_tables_last_column_id() -> None:
    v1 = evolve(proto_table_columns(None, descriptor(V1, "ev.M")), [], floor_id=500)
    assert min(r.field_id for r in v1) == 501


def test_decoder_envelope_plain_error_and_key_raw() -> None:
    fds = compile_schema(EVERYTHING, {})
    d = message_descriptor(fds, None, "icelog.test.Everything")
    records = evolve(proto_table_columns(d, d), [])
    cls = message_factory.GetMessageClass(d)
    message = cls(i32=-5, u64=2**64 - 1, color=2, number=9, colors=[1, 7])
    message.ts.seconds, message.ts.nanos = 1_700_000_000, 123_456_789
    message.w_i32.value = 0  # a set wrapper holding the default is not null
    body = message.SerializeToString()

    def decoder(side: str) -> SideDecoder:
        return SideDecoder(SideDecoding(side, column_tree(records, side), 7, {7: fds},
                                        "icelog.test.Everything"))

    value, key = decoder("value"), decoder("key")
    envelope = encode_envelope(7, [1])  # [1]: the second top-level message, Everything
    plain, framed, broken = value.decode(body), value.decode(envelope + body), value.decode(b"\xff\xff")
    assert plain is not None and framed is not None and broken is not None
    assert plain["__prefix__"] is None and framed["__prefix__"] == envelope
    assert "__err__" not in plain
    # No envelope, or a message the columns cannot hold exactly (Timestamp nanos, maps, JSON): __raw__ kept.
    assert plain["__raw__"] == body and framed["__raw__"] == envelope + body
    assert {k: framed[k] for k in plain if k not in ("__prefix__", "__raw__")} == {
        k: v for k, v in plain.items() if k not in ("__prefix__", "__raw__")}
    assert plain["u64"] == 2**64 - 1 and plain["color"] == "GREEN" and plain["colors"] == ["RED", "7"]
    assert plain["number"] == 9 and "text" not in plain and "nested" not in plain  # oneof: only the set member
    assert plain["ts"] == 1_700_000_000_123_456 and plain["w_i32"] == 0 and "w_s" not in plain
    assert set(broken) == {"__err__", "__raw__"} and broken["__raw__"] == b"\xff\xff"
    assert broken["__err__"].startswith("DecodeError")
    keyed = key.decode(body)
    assert keyed is not None and keyed["__raw__"] == body  # key.__raw__ is always set
    assert value.decode(None) is None
    # Rows fit the Arrow type Spark receives; the column-wise batch decoder gives the same rows, also for a
    # batch that mixes message types (another message index: merged in row by row), errors and nulls.
    struct_type = arrow_schema(records).field("value").type
    rows = pa.array([plain, framed, broken, None], type=struct_type)
    assert rows.null_count == 1
    inner = message_factory.GetMessageClass(d.file.pool.FindMessageTypeByName("icelog.test.Inner"))
    other = encode_envelope(7, [0]) + inner(name="x", n=3).SerializeToString()
    batch = [envelope + body, None, b"\xff\xff", other, body, envelope + body]
    for side in ("value", "key"):
        many = decoder(side).decode_many(batch, arrow_schema(records).field(side).type)
        one = decoder(side)
        assert many.to_pylist() == pa.array([one.decode(p) for p in batch], type=many.type).to_pylist()
    # A payload of another message than the table's is an __err__ row keeping its bytes, never nulls.
    other_row = many.to_pylist()[3]
    assert other_row["__raw__"] == other and "icelog.test.Inner" in other_row["__err__"]


@pytest.mark.parametrize("unknown_id", [99])
def test_unknown_schema_id_without_registry_is_a_row_error(unknown_id: int) -> None:
    fds = compile_schema(V1, {})
    d = message_descriptor(fds, None, "ev.M")
    records = evolve(proto_table_columns(None, d), [])
    dec = SideDecoder(SideDecoding("value", column_tree(records, "value"), 1, {1: fds}))
    row = dec.decode(encode_envelope(unknown_id, [0]) + b"\x0a\x01x")
    assert row is not None and row["__err__"].startswith("LookupError")


LOSSLESS = """
syntax = "proto3";
package ll;
enum Kind { K0 = 0; K1 = 1; }
message Inner { string name = 1; int32 n = 2; }
message Order {
  int64 id = 1; uint64 big = 2; Kind kind = 3; repeated string tags = 4; Inner inner = 5;
  repeated Inner items = 6; optional int32 maybe = 7; bytes blob = 8; float f = 9;
  oneof choice { string text = 10; int32 number = 11; }
}
"""


class _Fixed:
    def __init__(self, fds: object) -> None:
        self.fds = fds

    def by_id(self, schema_id: int) -> object:
        return self.fds


def test_lossless_rows_drop_raw_and_rebuild_byte_identical() -> None:
    """A value row without __raw__ rebuilds its bytes exactly; anything not provably lossless keeps __raw__."""
    from icelog.schema.codec.rebuild import rebuild_payload

    fds = compile_schema(LOSSLESS, {})
    d = message_descriptor(fds, None, "ll.Order")
    records = evolve(proto_table_columns(d, d), [])
    dec = SideDecoder(SideDecoding("value", column_tree(records, "value"), 3, {3: fds}, "ll.Order"))
    cls = message_factory.GetMessageClass(d)
    envelope = encode_envelope(3, [1])
    full = cls(id=-7, big=2**64 - 1, kind=1, tags=["a", "b"], maybe=0, blob=b"\x00\xff", f=1.5, number=0)
    full.inner.SetInParent()  # set but empty: must stay set
    full.items.add(name="x", n=2)
    unknown = cls(id=1).SerializeToString() + b"\xf8\x07\x01"  # an unknown field 127: not in the columns
    payloads = [
        envelope + full.SerializeToString(),
        envelope + cls().SerializeToString(),
        envelope + unknown,
        full.SerializeToString(),  # no envelope: the schema id is unknown later, keep __raw__
        encode_envelope(3, [0]) + b"\x0a\x01x",  # another message (Inner): an __err__ row
        envelope + b"\xff",  # does not decode
    ]
    rows = dec.decode_many(payloads, arrow_schema(records).field("value").type).to_pylist()
    assert [r["__raw__"] is None for r in rows] == [True, True, False, False, False, False]
    assert rows[4]["__err__"] and rows[5]["__err__"]
    for payload, row in zip(payloads, rows, strict=True):
        assert rebuild_payload(row, _Fixed(fds)) == payload
    assert rebuild_payload(None, _Fixed(fds)) is None


def test_registry_outage_in_a_worker_fails_the_task_not_the_row() -> None:
    """A schema id the worker must fetch from an unreachable registry raises (pass retried), never an __err__ row."""
    from icelog.schema.codec.registry_source import SourceSpec
    from icelog.schema.registry_client import RegistryUnavailableError
    from tests.support.broker import free_port

    fds = compile_schema(V1, {})
    d = message_descriptor(fds, None, "ev.M")
    records = evolve(proto_table_columns(None, d), [])
    spec = SourceSpec("http", f"http://127.0.0.1:{free_port()}")
    dec = SideDecoder(SideDecoding("value", column_tree(records, "value"), 1, {1: fds}, "ev.M",
                                   spec))
    payload = encode_envelope(42, [0]) + b"\x0a\x01x"
    with pytest.raises(RegistryUnavailableError):
        dec.decode(payload)
    with pytest.raises(RegistryUnavailableError):
        dec.decode_many([encode_envelope(1, [0]) + b"\x0a\x01y", payload], arrow_schema(records).field("value").type)
