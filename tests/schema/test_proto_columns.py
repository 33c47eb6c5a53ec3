"""The compiled Protobuf decoder (schema/codec/proto_columns.py, _proto_columns.c) against upb, the reference.

The invariant, over every path at once: for any batch of payloads, `ProtoSideDecoder.decode_many` (which takes the
compiled decoder whenever it covers the message and the batch) gives exactly the rows, `__raw__` kept or dropped
alike, that decoding each payload alone with upb gives (`decode_each`). Random messages of a schema with every
construct the compiled decoder covers (proto3, and a proto2 message), the same read into a table of another schema
version, and thousands of corrupted bodies (which the compiled decoder must refuse, or decode exactly as upb does).
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from icelog.schema.codec import proto_columns
from icelog.schema.codec.proto_columns import ColumnDecoder
from icelog.schema.codec.proto_decode import ProtoSideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.protobuf_schema import build_pool, compile_schema, encode_envelope, main_file_of, message_indexes_of
from icelog.table.field_ids import evolve
from icelog.table.iceberg_types import ERR, RAW, arrow_schema, column_tree, table_columns
from icelog.table.protobuf_types import message_columns
from tests.support.arrow_rows import assert_same_rows


@pytest.fixture(autouse=True)
def built() -> None:
    if not proto_columns.COMPILED:
        pytest.fail("icelog.schema.codec._proto_columns is not built: run `pip install -e .` (needs gcc and Python "
                    "headers)")


# Every construct the compiled decoder covers; fields declared out of field-number order (upb writes them in
# number order), an enum with a negative number, a oneof of a scalar, a string, a message and a Timestamp.
EVENT = """syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
enum Kind { KIND_UNSPECIFIED = 0; BUY = 1; SELL = 2; NEG = -3; }
message Point { double x = 1; optional string label = 2; repeated sint32 steps = 3; Kind kind = 4; }
message Outer { message Inner { int64 n = 1; Point p = 2; } Inner inner = 1; repeated Inner inners = 2; }
message Event {
  Outer deep = 50;
  int32 i32 = 1; sint32 s32 = 2; sfixed32 sf32 = 3; uint32 u32 = 4; int64 i64 = 5; sint64 s64 = 6;
  sfixed64 sf64 = 7; fixed32 f32 = 8; uint64 u64 = 9; fixed64 f64 = 10; float fl = 11; double db = 12;
  bool flag = 13; string name = 14; bytes blob = 15; Kind kind = 16;
  Point point = 17; repeated Point points = 18;
  repeated int32 ri32 = 19; repeated uint64 ru64 = 20; repeated double rdb = 21; repeated bool rflag = 22;
  repeated Kind kinds = 23; repeated string tags = 24; repeated bytes blobs = 25; repeated fixed32 rf32 = 26;
  google.protobuf.Timestamp at = 27; google.protobuf.Duration took = 28; repeated google.protobuf.Timestamp ats = 29;
  optional int64 maybe = 30; optional string maybe_name = 31; optional Kind maybe_kind = 32;
  optional bool maybe_flag = 33; optional double maybe_db = 38;
  oneof choice { string text = 34; int64 number = 35; Point where = 36; google.protobuf.Timestamp when = 37; }
  repeated int32 unpacked = 40 [packed = false]; repeated float rfl = 41; repeated sfixed64 rsf64 = 42;
  repeated sint64 rs64 = 43; repeated uint32 ru32 = 44;
}
"""

# The next version: `blob` gone (the table lacks it), `added` new (the writer lacks it), `name` a long now (a type
# beyond promotion: null), `i32` and `fl` promoted to int64 and double.
EVENT_V2 = (EVENT.replace("bytes blob = 15;", "")
            .replace("string name = 14;", "int64 name = 14; optional string added = 60;")
            .replace("int32 i32 = 1;", "int64 i32 = 1;").replace("float fl = 11;", "double fl = 11;"))

# EVENT without Timestamp and Duration: invertible, so `__raw__` is dropped or kept by upb's re-serialization.
INVERTIBLE = (EVENT.replace("google.protobuf.Timestamp at = 27; google.protobuf.Duration took = 28; "
                            "repeated google.protobuf.Timestamp ats = 29;", "")
              .replace("google.protobuf.Timestamp when = 37;", ""))


LEGACY = """syntax = "proto2";
package p;
enum Color { RED = 0; GREEN = 1; BLUE = 5; }
message Legacy {
  message Sub { optional double d = 1; required bool ok = 2; repeated Color tint = 3; }
  required int32 id = 1;
  optional string name = 2;
  optional Color color = 3 [default = GREEN];
  repeated Color colors = 4;
  repeated int32 packed_ints = 5 [packed = true];
  repeated int64 ints = 6;
  optional Sub sub = 7;
  optional uint64 big = 8 [default = 7];
  repeated Sub subs = 9;
  optional int32 zero = 10;
}
"""

_MICROS = ("google.protobuf.Timestamp", "google.protobuf.Duration")


def scalar(field: FieldDescriptor, rng: random.Random) -> Any:
    """A random value of a scalar field, edge values often."""
    t = FieldDescriptor
    kind = field.type
    if kind in (t.TYPE_INT32, t.TYPE_SINT32, t.TYPE_SFIXED32):
        return rng.choice([0, 1, -1, 63, -64, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)])
    if kind in (t.TYPE_UINT32, t.TYPE_FIXED32):
        return rng.choice([0, 1, 127, 128, 2**32 - 1, rng.randint(0, 2**32 - 1)])
    if kind in (t.TYPE_INT64, t.TYPE_SINT64, t.TYPE_SFIXED64):
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)])
    if kind in (t.TYPE_UINT64, t.TYPE_FIXED64):
        return rng.choice([0, 1, 2**63, 2**64 - 1, rng.randint(0, 2**64 - 1)])
    if kind == t.TYPE_FLOAT:
        return rng.choice([0.0, -0.0, float("inf"), -float("inf"), 1.5,
                           struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]])
    if kind == t.TYPE_DOUBLE:
        return rng.choice([0.0, -0.0, float("inf"), 5e-324, rng.uniform(-1e300, 1e300)])
    if kind == t.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == t.TYPE_STRING:
        return "".join(rng.choice("aé€😀\0 ") for _ in range(rng.randint(0, 6)))
    if kind == t.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 5))
    assert kind == t.TYPE_ENUM
    numbers = [v.number for v in field.enum_type.values]
    return rng.choice(numbers if field.enum_type.is_closed else [*numbers, 7, -9, 2**31 - 1])


def fill(message: Message, rng: random.Random) -> None:
    """Random values in a message: each field set or not (a oneof: at most one member), repeated 0, 1 or 3 times."""
    descriptor: Descriptor = message.DESCRIPTOR
    if descriptor.full_name in _MICROS:
        # within what 64-bit microseconds hold (past it a row is an error: tested apart); nanos of either sign
        seconds = rng.choice([0, 1, -1, 1_700_000_000, rng.randint(-(10**11), 10**11)])
        nanos = rng.choice([0, 999_999_999, -999_999_999, rng.randint(-(10**9) + 1, 10**9 - 1)])
        message.MergeFrom(type(message)(seconds=seconds, nanos=nanos))
        return
    chosen = {o.name: rng.choice([None, *o.fields]) for o in descriptor.oneofs}
    for field in descriptor.fields:
        member = field.containing_oneof
        if member is not None and chosen[member.name] is not field:
            continue
        if field.is_repeated:
            values = getattr(message, field.name)
            for _ in range(rng.choice([0, 1, 3])):
                if field.message_type is not None:
                    fill(values.add(), rng)
                else:
                    values.append(scalar(field, rng))
        elif field.message_type is not None:
            if member is not None or field.is_required or rng.random() < 0.7:
                target = getattr(message, field.name)
                target.SetInParent()
                fill(target, rng)
        elif member is not None or field.is_required or rng.random() < 0.7:
            setattr(message, field.name, scalar(field, rng))


class Side:
    """The value side of a table made from `table_schema` (default: the writer's), payloads written with schema id 1."""

    def __init__(self, writer_schema: str, message: str, table_schema: str | None = None) -> None:
        self.fds = compile_schema(writer_schema, {})
        pool = build_pool(self.fds)
        self.descriptor = pool.FindMessageTypeByName(message)
        self.cls = message_factory.GetMessageClass(self.descriptor)
        records = evolve(table_columns(None, message_columns(self.descriptor)), [])
        schemas: dict[int, Any] = {1: self.fds}
        if table_schema is not None:  # the table evolved to the next version (a retired column stays in Arrow)
            table_fds = compile_schema(table_schema, {})
            table_message = build_pool(table_fds).FindMessageTypeByName(message)
            records = evolve(table_columns(None, message_columns(table_message)), records)
            schemas[2] = table_fds
        self.decoding = SideDecoding("value", column_tree(records, "value"), max(schemas), schemas, message)
        self.struct_type: pa.StructType = arrow_schema(records).field("value").type
        self.decoder = ProtoSideDecoder(self.decoding)
        self.reference = ProtoSideDecoder(self.decoding)  # its own caches: decode_each, payload by payload
        self.envelope = encode_envelope(1, message_indexes_of(main_file_of(self.fds), message))

    def payload(self, body: bytes) -> bytes:
        return self.envelope + body

    def random_body(self, rng: random.Random) -> bytes:
        message = self.cls()
        fill(message, rng)
        body: bytes = message.SerializeToString()
        return body

    def takes(self, payloads: list[bytes | None]) -> bool:
        """Whether decode_many answers this batch through the compiled decoder (else upb parses it)."""
        return self.decoder._decode_compiled(payloads, self.struct_type) is not None

    def same_rows(self, payloads: list[bytes | None]) -> list[Any]:
        """decode_many's rows, asserted equal (NaN included) to upb's, payload by payload."""
        many = self.decoder.decode_many(payloads, self.struct_type)
        return assert_same_rows(many, self.reference.decode_each(payloads, self.struct_type), self.struct_type)


def test_random_messages_of_every_covered_construct_decode_as_upb() -> None:
    rng = random.Random(7)
    side = Side(EVENT, "t.Event")
    assert ColumnDecoder.for_message(side.descriptor, side.decoding.column, side.struct_type) is not None
    for size in (1, 7, 300):
        bodies = [side.random_body(rng) for _ in range(size)]
        payloads: list[bytes | None] = [side.payload(b) for b in bodies]
        assert side.takes(payloads)
        rows = side.same_rows(payloads)
        # Timestamp and Duration are not invertible (sub-µs nanos): their messages keep the bytes
        assert all(row[RAW] == p and row[ERR] is None for row, p in zip(rows, payloads, strict=True))
        first = side.cls.FromString(bodies[0])
        assert rows[0]["i64"] == first.i64 and rows[0]["tags"] == list(first.tags)


def test_an_invertible_message_drops_its_bytes_and_one_without_envelope_keeps_them() -> None:
    """Without Timestamp and Duration the message is invertible: every enveloped row drops `__raw__`."""
    rng = random.Random(5)
    side = Side(INVERTIBLE, "t.Event")
    bodies = [side.random_body(rng) for _ in range(200)]
    payloads: list[bytes | None] = [side.payload(b) for b in bodies]
    assert side.takes(payloads)
    assert all(row[RAW] is None for row in side.same_rows(payloads)), "a canonical message's row rebuilds it"
    bare: list[bytes | None] = [b for b in bodies if b]  # no envelope: the latest schema, bytes kept
    assert side.takes(bare)
    assert all(row[RAW] is not None for row in side.same_rows(bare))
    mixed: list[bytes | None] = [payloads[0], bodies[1]]  # two decoder keys: upb's path
    assert not side.takes(mixed)
    side.same_rows(mixed)
    assert not side.takes([payloads[0], None])
    side.same_rows([payloads[0], None])


def test_a_proto2_message_decodes_as_upb() -> None:
    rng = random.Random(13)
    side = Side(LEGACY, "p.Legacy")
    payloads: list[bytes | None] = [side.payload(side.random_body(rng)) for _ in range(300)]
    assert side.takes(payloads)
    rows = side.same_rows(payloads)
    assert all(row[RAW] is None for row in rows), "proto2 optional fields have presence: every row rebuilds"
    assert any(row["color"] is None for row in rows) and any(row["color"] == "RED" for row in rows)
    # The common 6-byte envelope (message index [0]): the C decoder checks every payload starts with the first's.
    assert side.envelope == encode_envelope(1, [0])
    body = side.random_body(rng)
    for other in (None, encode_envelope(2, [0]) + body, body, encode_envelope(1, [0, 0]) + body, side.envelope[:5]):
        batch: list[bytes | None] = [payloads[0], other, payloads[1]]
        assert not side.takes(batch)
        side.same_rows(batch)


def test_a_table_of_another_schema_version_takes_what_fits() -> None:
    """A field the table lacks is dropped (bytes kept), a column the writer lacks is null, int32 and float promoted,
    and a field whose type changed beyond promotion is null."""
    rng = random.Random(11)
    side = Side(EVENT, "t.Event", EVENT_V2)
    assert "name__v1" in side.struct_type.names  # the retired column, in Arrow but not among the columns
    payloads: list[bytes | None] = [side.payload(side.random_body(rng)) for _ in range(100)]
    assert side.takes(payloads)
    rows = side.same_rows(payloads)
    assert all(row[RAW] == p for row, p in zip(rows, payloads, strict=True))
    assert {row["name"] for row in rows} == {None} and {row["added"] for row in rows} == {None}
    assert {row.get("blob") for row in rows} == {None}, "a dropped field's column (kept in Arrow) is null"
    assert any(row["i32"] not in (None, 0) for row in rows)
    assert side.struct_type.field("fl").type == pa.float64()


def corrupt(body: bytes, rng: random.Random, mutation: int) -> bytes:
    """`body` with one corruption: a byte replaced, a bit flipped, bytes deleted, inserted or appended, a truncation,
    or a slice of it repeated (a field twice, a repeated field's elements apart)."""
    data = bytearray(body)
    at = rng.randrange(len(data)) if data else 0
    if mutation == 0 and data:
        data[at] = rng.randrange(256)
    elif mutation == 1 and data:
        data[at] ^= 1 << rng.randrange(8)
    elif mutation == 2 and data:
        del data[at:at + rng.randint(1, 3)]
    elif mutation == 3:
        data[at:at] = rng.randbytes(rng.randint(1, 3))
    elif mutation == 4:
        data = data[:at]
    elif mutation == 5:
        data += rng.randbytes(rng.randint(1, 2))
    else:
        end = rng.randint(at, len(data))
        data[end:end] = data[at:end]
    return bytes(data)


@pytest.mark.parametrize(("schema", "message", "trials"), [
    (EVENT, "t.Event", 1600),
    (INVERTIBLE, "t.Event", 1600),
    (LEGACY, "p.Legacy", 800),
], ids=["values", "raw-decisions", "proto2"])
def test_corrupted_bodies_are_refused_or_decoded_exactly_as_upb_does(schema: str, message: str, trials: int) -> None:
    rng = random.Random(3)
    side = Side(schema, message)
    clean = [side.random_body(rng) for _ in range(40)]
    taken = dropped = 0
    for trial in range(trials):
        payloads: list[bytes | None] = [side.payload(corrupt(rng.choice(clean), rng, trial % 7))]
        if side.takes(payloads):
            taken += 1
            dropped += side.same_rows(payloads)[0][RAW] is None
        else:
            side.same_rows(payloads)
        side.same_rows([side.payload(clean[0]), *payloads, side.payload(clean[1])])
    assert taken > trials // 20, "some corruptions are still canonical messages, which the compiled decoder takes"
    assert taken < trials - trials // 20, "most corruptions are refused"
    assert (dropped == taken) if schema is not EVENT else dropped == 0


@pytest.mark.parametrize(("body", "why"), [
    (b"\x08\x00", "an implicit-presence int32 written with its default"),
    (b"\x08\x81\x00", "a padded varint"),
    (b"\x08\xff\xff\xff\xff\x0f", "an int32 as a 5-byte varint (upb sign-extends it to 10 bytes)"),
    (b"\x68\x02", "a bool 2"),
    (b"\x61\x00\x00\x00\x00\x00\x00\xf8\x7f", "a NaN double"),
    (b"\x5d\x00\x00\xc0\x7f", "a NaN float"),
    (b"\x08\x01\x08\x02", "a singular field twice"),
    (b"\x10\x02\x08\x01", "fields out of field-number order"),
    (b"\x92\x02\x01\x61\x98\x02\x01", "two members of one oneof"),
    (b"\x98\x01\x01", "a packed field unpacked"),
    (b"\x9a\x01\x00", "an empty packed chunk"),
    (b"\x9a\x01\x01\x01\x9a\x01\x01\x02", "a packed field in two chunks"),
    (b"\xc0\x02\x01\xca\x02\x04\x00\x00\x80\x3f\xc0\x02\x02", "a repeated field's elements apart"),
    (b"\xc2\x02\x01\x01", "an unpacked field packed"),
    (b"\xf8\x07\x01", "an unknown field"),
    (b"\x0d\x01\x00\x00\x00", "a field of another wire type"),
    (b"\x72\x01\xff", "a string that is not UTF-8"),
    (b"\x72\x00", "an empty string with implicit presence"),
    (b"\xda\x01\x02\x08\x80", "a Timestamp whose varint runs past its end"),
    (b"\xda\x01\x0a\x08\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "a Timestamp past 64-bit microseconds"),
    (b"\xda\x01\x02\x10\x00", "a Timestamp's nanos written as 0"),
    (b"\x8a\x01\x02\x20\x00", "a nested message's implicit-presence enum written as 0"),
])
def test_what_the_compiled_decoder_refuses_upb_still_decodes(body: bytes, why: str) -> None:
    side = Side(EVENT, "t.Event")
    payloads: list[bytes | None] = [side.payload(body)]
    assert not side.takes(payloads), why
    side.same_rows(payloads)


def test_presence_defaults_and_negative_zero_are_what_upb_writes() -> None:
    """A field with presence written with its default is taken (upb writes it), as is -0.0 without presence."""
    side = Side(EVENT, "t.Event")
    message = side.cls(maybe=0, maybe_name="", maybe_kind=0, maybe_flag=False, maybe_db=0.0, number=0, db=-0.0,
                       fl=-0.0, kinds=[0, 0], ri32=[0])
    message.point.SetInParent()
    message.took.SetInParent()
    payloads: list[bytes | None] = [side.payload(message.SerializeToString())]
    assert side.takes(payloads)
    [row] = side.same_rows(payloads)
    assert (row["maybe"], row["maybe_name"], row["maybe_kind"], row["maybe_flag"], row["number"]) == (
        0, "", "KIND_UNSPECIFIED", False, 0)
    assert row["point"] == {"x": 0.0, "label": None, "steps": [], "kind": "KIND_UNSPECIFIED"}
    assert row["text"] is None and row["took"] == 0 and row["at"] is None and row["i32"] == 0


@pytest.mark.parametrize(("body", "why"), [
    (b"\x08\x01\x18\x02", "a closed enum's number it does not name"),
    (b"\x08\x01\x20\x07", "a repeated closed enum's number it does not name"),
    (b"", "a required field missing (not a message upb serializes back)"),
    (b"\x08\x01\x2a\x00", "a packed chunk, empty"),
    (b"\x08\x01\x30\x01\x08\x01", "fields out of order"),
])
def test_what_the_compiled_decoder_refuses_in_proto2(body: bytes, why: str) -> None:
    side = Side(LEGACY, "p.Legacy")
    assert not side.takes([side.payload(body)]), why
    [row] = side.same_rows([side.payload(body)])
    if why.startswith("a required field missing"):  # upb parses it but will not serialize it: the bytes are kept
        assert row[ERR] is None and row[RAW] == side.payload(body)


def test_a_timestamp_past_microseconds_is_an_error_row_through_both_paths() -> None:
    side = Side(EVENT, "t.Event")
    far = side.cls(i32=1)
    far.at.seconds = 2**62
    payloads: list[bytes | None] = [side.payload(side.cls(i32=2).SerializeToString()),
                                    side.payload(far.SerializeToString())]
    assert not side.takes(payloads)
    rows = side.same_rows(payloads)
    assert rows[0][ERR] is None and rows[1][ERR] and rows[1][RAW] == payloads[1]


@pytest.mark.parametrize("field", [
    "map<string, int32> m = 1;",
    "google.protobuf.Int32Value w = 1;",
    "google.protobuf.Struct s = 1;",
    "google.protobuf.Any a = 1;",
    "R r = 1;",
    "repeated R rs = 1;",
])
def test_messages_the_compiled_decoder_does_not_cover(field: str) -> None:
    schema = f"""syntax = "proto3";
package u;
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/any.proto";
message R {{ {field} int64 n = 2; }}
"""
    side = Side(schema, "u.R")
    assert ColumnDecoder.for_message(side.descriptor, side.decoding.column, side.struct_type) is None
    payloads: list[bytes | None] = [side.payload(b"\x10\x05")]
    assert not side.takes(payloads)
    side.same_rows(payloads)


def test_a_proto2_group_is_not_covered() -> None:
    side = Side('syntax = "proto2"; package g; message G { optional group Item = 1 { optional int32 a = 2; } }',
                "g.G")
    assert ColumnDecoder.for_message(side.descriptor, side.decoding.column, side.struct_type) is None
