"""The archive's side decoder for Protobuf payloads: a batch decoded at once (the hot path, column by column)
gives exactly the rows of decoding each payload alone, `__raw__` kept or dropped by the same rule."""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
from google.protobuf import message_factory

from icelog.schema.codec.proto_decode import ProtoSideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.protobuf_schema import build_pool, compile_schema, encode_envelope
from icelog.table.field_ids import evolve
from icelog.table.iceberg_types import ERR, RAW, arrow_schema, column_tree, table_columns
from icelog.table.protobuf_types import message_columns

SCHEMA = """syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
message A { string s = 1; int64 n = 2; repeated string tags = 3; optional int32 o = 4; }
message B { string other = 1; }
enum K { K0 = 0; K1 = 1; }
message C { google.protobuf.Timestamp at = 1; K k = 2; repeated K ks = 3; }
"""


def test_protobuf_batch_rows_and_raw_bytes_equal_one_by_one() -> None:
    fds = compile_schema(SCHEMA, {})
    pool = build_pool(fds)
    a = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.A"))
    b = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.B"))
    records = evolve(table_columns(None, message_columns(pool.FindMessageTypeByName("t.A"))), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: fds, 2: fds}, "t.A")
    struct_type = arrow_schema(records).field("value").type
    first, second = encode_envelope(1, [0]), encode_envelope(2, [0])
    message = a(s="x", n=5, tags=["p", "q"], o=0).SerializeToString()
    payloads = [
        first + message,
        None,
        first + a(s="y").SerializeToString(),
        second + message,  # another schema id: decoded on its own, merged in
        first + b"\xff\xff",  # the common envelope, a body that does not parse: an error row
        message,  # no envelope: the latest schema, bytes kept (nothing to rebuild them with)
        encode_envelope(1, [1]) + b(other="z").SerializeToString(),  # another message than the table's: error row
        first + message + b"\x20\x07",  # field 4 twice (last wins): decodes, but does not re-serialize the same
        b"\x00\x00",  # too short for an envelope, and not a message (field number 0)
    ]
    decoder = ProtoSideDecoder(decoding)
    rows = decoder.decode_many(payloads, struct_type).to_pylist()
    assert rows == pa.array([ProtoSideDecoder(decoding).decode(p) for p in payloads], type=struct_type).to_pylist()
    assert [None if r is None else (r[ERR] is not None, r[RAW] is None) for r in rows] == [
        (False, True), None, (False, True), (False, True), (True, False), (False, False), (True, False),
        (False, False), (True, False)]
    assert rows[0] is not None
    assert (rows[0]["s"], rows[0]["n"], rows[0]["tags"], rows[0]["o"]) == ("x", 5, ["p", "q"], 0)


def message_c() -> tuple[Any, SideDecoding, pa.StructType]:
    """Message t.C's class, the decoding of a table made from it, and the value side's Arrow type."""
    fds = compile_schema(SCHEMA, {})
    pool = build_pool(fds)
    c = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.C"))
    records = evolve(table_columns(None, message_columns(pool.FindMessageTypeByName("t.C"))), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: fds}, "t.C")
    return c, decoding, arrow_schema(records).field("value").type


def test_protobuf_batch_timestamps_and_enums_equal_one_by_one() -> None:
    c, decoding, struct_type = message_c()
    full = c(k=1, ks=[0, 1])
    full.at.FromMicroseconds(1_700_000_000_123_456)
    envelope = encode_envelope(1, [2])  # C is the file's third message
    payloads = [envelope + full.SerializeToString(), envelope + c(k=9, ks=[9]).SerializeToString(), None]
    rows = ProtoSideDecoder(decoding).decode_many(payloads, struct_type).to_pylist()
    assert rows == pa.array([ProtoSideDecoder(decoding).decode(p) for p in payloads], type=struct_type).to_pylist()
    assert rows[0] is not None and rows[1] is not None
    at = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=1_700_000_000_123_456)
    assert (rows[0]["at"], rows[0]["k"], rows[0]["ks"]) == (at, "K1", ["K0", "K1"])
    assert (rows[1]["at"], rows[1]["k"], rows[1]["ks"]) == (None, "9", ["9"])  # unset; a number the enum does not name


def test_a_timestamp_past_what_microseconds_hold_is_an_error_row_not_a_failed_batch() -> None:
    """A Timestamp of 2^62 seconds parses, but no timestamptz column holds it: it failed decode_many (the archive
    task failed at every retry: the partition stalled); it is the row of a payload that did not decode."""
    c, decoding, struct_type = message_c()
    far = c(k=1)
    far.at.seconds = 2**62
    envelope = encode_envelope(1, [2])
    payloads = [envelope + c(k=1).SerializeToString(), envelope + far.SerializeToString()]
    rows = ProtoSideDecoder(decoding).decode_many(payloads, struct_type).to_pylist()
    assert rows[0]["k"] == "K1" and rows[0][ERR] is None
    assert rows[1][ERR] and rows[1][RAW] == payloads[1] and rows[1]["k"] is None
