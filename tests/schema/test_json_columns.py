"""The compiled JSON decoder (schema/codec/json_columns.py, _json_columns.c) against JSONRows, the reference.

The invariant, over every path at once: for any batch of payloads, `RecordSideDecoder.decode_many` (which takes
the compiled decoder whenever it covers the table and the batch) gives exactly the rows, `__raw__` and `__err__`
included, that decoding each payload alone with json.loads and json_codec's converters gives. Random documents of a
schema with every construct the compiled decoder covers (wrong-typed values and undeclared keys mixed in), the same
read into a table of another schema version, and thousands of corrupted bodies, byte-level and JSON-aware (which the
compiled decoder must refuse, or decode exactly as JSONRows does).
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import pyarrow as pa
import pytest

from icelog.schema.codec import json_columns
from icelog.schema.codec.json_columns import ColumnDecoder
from icelog.schema.codec.record_decode import RecordSideDecoder
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.compiled import JSON
from icelog.schema.json_schema import compile_json
from icelog.table.field_ids import Column, evolve
from icelog.table.iceberg_types import ERR, RAW, arrow_schema, column_tree, table_columns
from icelog.table.json_types import json_columns as table_fields
from tests.support.arrow_rows import assert_same_rows


@pytest.fixture(autouse=True)
def built() -> None:
    if not json_columns.COMPILED:
        pytest.fail("icelog.schema.codec._json_columns is not built: run `pip install -e .` (needs gcc and Python "
                    "headers)")


ITEM = {"type": "object", "additionalProperties": False, "properties": {
    "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": ["number", "null"]}}}
EVENT: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object", "additionalProperties": False,
    "properties": {
        "id": {"type": "string"},
        "n": {"type": "integer"},
        "amount": {"type": "number"},
        "flag": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "kind": {"type": "string", "enum": ["BUY", "SELL", "HOLD"]},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}},
        "counts": {"type": "array", "items": {"type": ["integer", "null"]}},
        "items": {"type": "array", "items": ITEM},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "address": {"type": "object", "additionalProperties": False, "properties": {
            "city": {"type": "string"}, "zip": {"type": ["integer", "null"]},
            "geo": {"type": "object", "additionalProperties": False, "properties": {
                "lat": {"type": "number"}, "lon": {"type": "number"}, "seen": {"type": "string", "format": "date"}}},
        }},
        "when": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date-time"}]},
    },
}
# The next version: `amount` gone (the document's key is ignored), `added` and `also` new (the writer lacks them:
# a long column takes whatever integer a document holds under that key), `n` still an integer.
EVENT_V2: dict[str, Any] = {**EVENT, "properties": {
    **{k: v for k, v in EVENT["properties"].items() if k != "amount"},
    "added": {"type": "integer"}, "also": {"type": "array", "items": {"type": "boolean"}}}}

TEXTS = ["", "a", "é€😀", "tab\there", "q\"uote", "back\\slash", "nul\0", "\u2028", "x" * 40]
INSTANTS = ["2024-01-01T10:00:00Z", "2024-02-29t23:59:59.5z", "1970-01-01T00:00:00.000001+05:30",
            "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59.999999-00:00", "2023-02-29T00:00:00Z",
            "2024-06-30T12:00:00", "abc", "", "N/A"]
DATES = ["2024-01-01", "2024-02-29", "2023-02-29", "0000-01-01", "2024-13-01", "1900-02-28", "never", ""]
NUMBERS = [0, -1, 1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**63, 2**64, 10**30, 0.5, -0.0, 1.0, 1e2, 1e300,
           -1e-300, 5e-324, 1.7976931348623157e308, 123.456, 0.1]


def value(schema: dict[str, Any], rng: random.Random) -> Any:
    """A random value of a schema, of the wrong type (or null) one time in eight."""
    if rng.random() < 0.125:
        return rng.choice([None, "x", 7, 2.5, True, [], {}, [1, "a"], {"k": 1}])
    if "oneOf" in schema:
        return value(schema["oneOf"][1], rng) if rng.random() < 0.8 else None
    kind = schema["type"]
    if isinstance(kind, list):
        if rng.random() < 0.3:
            return None
        kind = kind[0]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if kind == "string":
        form = schema.get("format")
        if form == "date-time":
            return rng.choice(INSTANTS)
        if form == "date":
            return rng.choice(DATES)
        return rng.choice(TEXTS) + str(rng.randrange(1000))
    if kind == "integer":
        return rng.choice([*NUMBERS[:10], rng.randint(-(2**40), 2**40)])
    if kind == "number":
        return rng.choice([*NUMBERS, rng.uniform(-1e6, 1e6), rng.randint(-100, 100)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [value(schema["items"], rng) for _ in range(rng.choice([0, 1, 3]))]
    document = {k: value(v, rng) for k, v in schema["properties"].items() if rng.random() < 0.9}
    if rng.random() < 0.2:
        document[rng.choice(["extra", "__raw__", "ID", "idx"])] = rng.choice([1, "two", [3], {"four": None}])
    items = list(document.items())
    rng.shuffle(items)
    return dict(items)


def envelope(data: bytes) -> bytes:
    return b"\0" + struct.pack(">I", 1) + data


def text(document: Any, rng: random.Random) -> bytes:
    """A document as some producer writes it: compact or spaced, ASCII-escaped or not."""
    return json.dumps(document, ensure_ascii=rng.random() < 0.3,
                      separators=rng.choice([(",", ":"), (", ", ": ")]), indent=rng.choice([None, None, 2])).encode()


def side(writer: dict[str, Any], table: dict[str, Any] | None = None) -> tuple[RecordSideDecoder, pa.StructType]:
    """The value side's decoder for documents of `writer` into the table made from `table` (default: the writer)."""
    compiled = compile_json(json.dumps(writer), {})
    records = evolve(table_columns(None, table_fields(compile_json(json.dumps(table or writer), {}).document, {},
                                                      "value")), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: compiled}, schema_type=JSON)
    return RecordSideDecoder(decoding), arrow_schema(records).field("value").type


def same_rows(decoder: RecordSideDecoder, struct_type: pa.StructType, payloads: list[bytes | None]) -> list[Any]:
    """decode_many's rows, asserted equal (NaN, -0.0 included: repr) to JSONRows', payload by payload."""
    return assert_same_rows(decoder.decode_many(payloads, struct_type), decoder.decode_each(payloads, struct_type),
                            struct_type)


def compiled_takes(decoder: RecordSideDecoder, struct_type: pa.StructType, payloads: list[bytes]) -> bool:
    """Whether the compiled decoder takes this batch of enveloped payloads (else decode_many went to JSONRows), both
    as decode_many hands it over (the envelope checked and skipped in C) and as bare bodies."""
    columns = ColumnDecoder.for_rows(decoder._codec(1), struct_type)  # type: ignore[arg-type]
    assert columns is not None, "the compiled decoder covers this table"
    taken = columns.decode([p[5:] for p in payloads]) is not None
    assert (decoder._decode_json_compiled(payloads, struct_type) is not None) == taken  # type: ignore[arg-type]
    return taken


def clean_documents(rng: random.Random, count: int) -> list[Any]:
    return [value(EVENT, rng) for _ in range(count)]


def test_random_documents_of_every_covered_construct_decode_as_json_rows() -> None:
    rng = random.Random(7)
    decoder, struct_type = side(EVENT)
    for size in (1, 7, 300):
        documents = clean_documents(rng, size)
        payloads: list[bytes | None] = [envelope(text(d, rng)) for d in documents]
        assert compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
        rows = same_rows(decoder, struct_type, payloads)
        assert all(row[RAW] == p and row[ERR] is None for row, p in zip(rows, payloads, strict=True))
    first = {"id": "a", "n": 3, "tags": ["x"], "at": "2024-01-01T10:00:00Z", "address": {"geo": {"lat": 1}}}
    [row] = same_rows(decoder, struct_type, [envelope(json.dumps(first).encode())])
    assert row["id"] == "a" and row["n"] == 3 and row["tags"] == ["x"] and row["at"] == 1_704_103_200_000_000
    assert row["address"]["geo"]["lat"] == 1.0 and row["address"]["city"] is None


def test_a_table_of_another_schema_version_takes_what_fits() -> None:
    rng = random.Random(11)
    documents = clean_documents(rng, 80)
    for d in [d for d in documents if isinstance(d, dict)][::3]:
        d["added"] = rng.choice([5, "5", 5.0, None])
        d["also"] = [True, 1, None]
    payloads: list[bytes | None] = [envelope(text(d, rng)) for d in documents]
    decoder, struct_type = side(EVENT, EVENT_V2)
    assert compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
    rows = same_rows(decoder, struct_type, payloads)
    assert {row["added"] for row in rows} == {None, 5}
    assert "amount" not in rows[0]


def random_number(rng: random.Random) -> bytes:
    """A JSON number spelled as producers and people write them: shortest reprs, 17 digits, integers of any length,
    exponents, integral floats, past the double range."""
    form = rng.randrange(7)
    x = struct.unpack("<d", rng.randbytes(8))[0]
    if form == 0 or x != x or x in (float("inf"), -float("inf")):
        return repr(rng.uniform(-1e6, 1e6)).encode()
    if form == 1:
        return repr(x).encode()
    if form == 2:
        spelled = f"{x:.17g}"
        return (spelled if "e" in spelled or "." in spelled else spelled + ".0").encode()
    if form == 3:
        return str(rng.randint(-(10 ** rng.randint(1, 400)), 10 ** rng.randint(1, 400))).encode()
    if form == 4:
        return b"%d.%se%d" % (rng.randint(-99, 99), str(rng.randrange(10**6)).encode(), rng.randint(-330, 330))
    if form == 5:
        return b"%d.0" % rng.randint(-(2**64), 2**64)
    return rng.choice([b"0", b"-0", b"-0.0", b"0e5", b"1E+2", b"2.5e-1", b"1e400", b"-1e400", b"1e-400",
                       b"9007199254740993", b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
                       b"9.223372036854775807e18", b"179769313486231580793728971405303415079934132710037826936173778"
                       b"980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505"
                       b"820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936"
                       b"475292719074168444365510704342711559699508093042880177904174497792"])


def random_instant(rng: random.Random) -> str:
    """A date-time in RFC 3339's strict form, fields in range (some impossible days), any offset and fraction."""
    year, month, day = rng.choice([1, 2, 1969, 1970, 2024, 9999, rng.randint(1, 9999)]), rng.randint(1, 12), \
        rng.randint(1, 31)
    fraction = "" if rng.random() < 0.3 else "." + str(rng.randrange(10**6)).zfill(6)[: rng.randint(1, 6)]
    offset = rng.choice(["Z", "z", "+00:00", "-00:00"]) if rng.random() < 0.5 else \
        f"{rng.choice('+-')}{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return (f"{year:04d}-{month:02d}-{day:02d}{rng.choice('Tt')}{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d}{fraction}{offset}")


def test_numbers_dates_and_date_times_decode_exactly_as_python_converts_them() -> None:
    """Numbers into long and double columns (Python's float() correctly rounded, an integer past the double range
    null, 1.0 an integer), date-times to microseconds and dates to days: in one batch the compiled decoder takes."""
    rng = random.Random(13)
    decoder, struct_type = side(EVENT)
    payloads: list[bytes | None] = []
    for _ in range(3000):
        number = random_number(rng)
        day = f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 31):02d}"
        body = b'{"n": %s, "amount": %s, "scores": [%s, %s], "at": %s, "day": %s, "address": {"zip": %s}}' % (
            number, number, number, random_number(rng), json.dumps(random_instant(rng)).encode(),
            json.dumps(day).encode(), random_number(rng))
        payloads.append(envelope(body))
    assert compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
    rows = same_rows(decoder, struct_type, payloads)
    assert sum(row["at"] is not None for row in rows) > 2000 and sum(row["n"] is not None for row in rows) > 300


def test_an_int_column_takes_32_bit_integers_only() -> None:
    """A table's int column (not one a JSON schema maps to, but one JSONRows fills with `_int`): an integer or an
    integral number within 32 bits, else null."""
    writer = compile_json(json.dumps({"type": "object", "additionalProperties": False, "properties": {
        "n": {"type": "integer"}, "m": {"type": "integer"}}}), {})
    records = evolve(table_columns(None, (Column("n", "int"), Column("m", "long"))), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: writer}, schema_type=JSON)
    decoder, struct_type = RecordSideDecoder(decoding), arrow_schema(records).field("value").type
    numbers = [b"0", b"-0", b"2147483647", b"2147483648", b"-2147483648", b"-2147483649", b"1e9", b"3e9", b"2.0",
               b"2.5", b'"7"', b"null", b"9223372036854775807", b"9223372036854775808", b"1e400"]
    payloads: list[bytes | None] = [envelope(b'{"n": %s, "m": %s}' % (n, n)) for n in numbers]
    assert compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
    rows = same_rows(decoder, struct_type, payloads)
    assert [row["n"] for row in rows] == [0, 0, 2**31 - 1, None, -(2**31), None, 10**9, None, 2, None, None, None,
                                          None, None, None]
    assert rows[12]["m"] == 2**63 - 1 and rows[13]["m"] is None


def test_batches_of_bare_bodies_null_payloads_and_other_envelopes_decode_as_json_rows() -> None:
    """Only a batch whose payloads all carry the first one's envelope goes to the compiled decoder with its envelope;
    bare bodies (the latest schema) through decode_many's own loop; null payloads and other schema ids row by row."""
    rng = random.Random(5)
    decoder, struct_type = side(EVENT)
    bodies = [text(d, rng) for d in clean_documents(rng, 30)]
    bare: list[bytes | None] = list(bodies)
    assert decoder._decode_json_compiled(bare, struct_type) is None
    columns = ColumnDecoder.for_rows(decoder._codec(1), struct_type)  # type: ignore[arg-type]
    assert columns is not None and columns.decode(bodies) is not None
    same_rows(decoder, struct_type, bare)
    other = b"\0" + struct.pack(">I", 2)  # a schema id the side does not know: an error row
    for mixed in ([envelope(bodies[0]), None, envelope(bodies[1])], [envelope(bodies[0]), bodies[1]],
                  [None, envelope(bodies[2])], [envelope(bodies[3]), other + bodies[4]], [other + bodies[5]],
                  [bodies[6], envelope(bodies[7])]):
        assert decoder._decode_json_compiled(mixed, struct_type) is None
        rows = same_rows(decoder, struct_type, mixed)
        assert [row is None for row in rows] == [p is None for p in mixed]


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    """A JSON-aware corruption: a number, a string, a key or whitespace replaced by an awkward spelling."""
    spellings = [b"1.0", b"1e2", b"-0", b"-0.0", b"1e400", b"-1e400", b"123456789012345678901234567890", b"1E+2",
                 b"9223372036854775808", b"-9223372036854775808", b"9223372036854775807", b"2147483648", b"1.5",
                 b"0.1e1", b"01", b"1.", b".5", b"+1", b"NaN", b"Infinity", b"-Infinity", b"1e-400", b"2e0",
                 b"9007199254740993", b"1" * 700, b"4.9e-324", b"1.7976931348623159e308",
                 b'"\\u00e9"', b'"\\ud83d\\ude00"', b'"\\ud83d"', b'"\\ude00"', b'"\\ud83dx"', b'"a\\/b\\n"',
                 b'"\\x"', b'"\\u12"', b'"\x01"', b'"\xff"', b'"\xed\xa0\x80"', b'"\xef\xbb\xbf"', b'"\\u0000"',
                 b'"2024-01-01T10:00:00+05:75"', b'"2024-01-01T24:00:00Z"', b'"2024-01-01 10:00:00Z"',
                 b'"2024-01-01T10:00:00.1234567Z"', b'"20240101"', b'"2024-W01-1"', b'" 2024-01-01"',
                 b'"2024-01-01T10:00:00.Z"', b'"+2024-01-01"', b'"\\u0032024-01-01"', b'"\xef\xbc\x92024-01-01"',
                 b'"2024-01-01T10:00:60Z"', b'"2024-01-01T10:00:00+24:00"', b"true", b"false", b"null", b"[]",
                 b"{}", b'{"a":1,"a":2}', b"[1,]", b"{,}", b" ", b"\n\t", b"\x0b", b"\xc2\xa0"]
    out = bytearray(data)
    mutation = rng.randrange(6)
    if mutation == 0:  # a value (after a colon) respelled
        colons = [i for i, b in enumerate(out) if b == ord(":")]
        if colons:
            at = rng.choice(colons) + 1
            end = at
            while end < len(out) and out[end] not in b",}]":
                end += 1
            out[at:end] = rng.choice(spellings)
    elif mutation == 1:  # a key doubled: the same column twice in one object
        text_ = out.decode("utf-8", "replace")
        at = text_.find('"', 1)
        end = text_.find(",", at)
        if at > 0 and end > at:
            out = bytearray(b"{" + out[at:end] + b"," + out[1:])
    elif mutation == 2:  # whitespace or a BOM around or inside
        out = bytearray(rng.choice([b" ", b"\r\n", b"\xef\xbb\xbf", b"", b"\t"]) + out
                        + rng.choice([b" ", b"\n", b"", b"x", b"\0", b"}"]))
    elif mutation == 3:  # a key escaped: the same column spelled otherwise
        at = out.find(b'"', 1)
        if at > 0 and out[at + 1:at + 2].isalpha():
            out[at + 1:at + 2] = b"\\u%04x" % out[at + 1]
    elif mutation == 4:  # the top level replaced
        out = bytearray(rng.choice([b"1", b"[1, 2]", b'"s"', b"null", b"true", b"{}", b"[{}]", b"1 2"]))
    else:  # nested deep
        depth = rng.choice([10, 70, 200])
        out[1:1] = b'"deep": ' + b"[" * depth + b"]" * depth + b", "
    return bytes(out)


def mutate_bytes(data: bytes, rng: random.Random, trial: int) -> bytes:
    out = bytearray(data)
    at = rng.randrange(len(out))
    mutation = trial % 6
    if mutation == 0:
        out[at] = rng.randrange(256)
    elif mutation == 1:
        out[at] ^= 1 << rng.randrange(8)
    elif mutation == 2:
        del out[at:at + rng.randint(1, 3)]
    elif mutation == 3:
        out[at:at] = rng.choice([rng.randbytes(rng.randint(1, 3)), rng.choice([b'"', b"\\", b",", b"{", b"]", b"e"])])
    elif mutation == 4:
        del out[at:]
    else:
        out += rng.randbytes(rng.randint(1, 2))
    return bytes(out)


def test_corrupted_bodies_are_refused_or_decoded_exactly_as_json_rows_does() -> None:
    rng = random.Random(3)
    decoder, struct_type = side(EVENT)
    clean = [text(d, rng) for d in clean_documents(rng, 60)]
    taken = 0
    trials = 2400
    for trial in range(trials):
        data = rng.choice(clean)
        data = mutate_json(data, rng) if trial % 2 else mutate_bytes(data, rng, trial // 2)
        payloads: list[bytes | None] = [envelope(data)]
        taken += compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
        same_rows(decoder, struct_type, payloads)
        if trial % 9 == 0:  # the envelope corrupted too: another schema id, no envelope, a short payload
            spoilt = bytearray(envelope(data))
            spoilt[rng.randrange(5)] = rng.randrange(256)
            payloads = [bytes(spoilt[:rng.choice([3, len(spoilt)])])]
        same_rows(decoder, struct_type, [envelope(clean[0]), *payloads, envelope(clean[1])])
    assert taken > trials // 10, "many corruptions are still JSON the compiled decoder reads as json.loads does"


@pytest.mark.parametrize("data", [
    b'{"n": NaN}', b'{"id": "\\ud800"}', b'{"id": "a", "id": "b"}', b'{"at": "2024-01-01T10:00:00+05:75"}',
    b'{"day": "20240101"}', b'{"id": "\x01"}', b'\xef\xbb\xbf{}', b"[" * 100 + b"]" * 100,
])
def test_what_the_compiled_decoder_refuses_json_rows_still_decodes(data: bytes) -> None:
    decoder, struct_type = side(EVENT)
    payloads: list[bytes | None] = [envelope(data)]
    assert not compiled_takes(decoder, struct_type, payloads)  # type: ignore[arg-type]
    same_rows(decoder, struct_type, payloads)


def test_tables_the_compiled_decoder_does_not_cover() -> None:
    closed = {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "integer"}}}
    for extra in ({"b": {}}, {"b": {"type": "object", "additionalProperties": {"type": "string"}}},
                  {"b": {"type": "object", "properties": {"c": {"type": "string"}}}}, {"b": {"oneOf": [
                      {"type": "string"}, {"type": "integer"}]}}):
        writer = {**closed, "properties": {**closed["properties"], **extra}}
        decoder, struct_type = side(writer)
        assert ColumnDecoder.for_rows(decoder._codec(1), struct_type) is None  # type: ignore[arg-type]
    decoder, struct_type = side({"type": "object", "properties": {"a": {"type": "integer"}}})  # open: __extra__
    assert ColumnDecoder.for_rows(decoder._codec(1), struct_type) is None  # type: ignore[arg-type]
    decoder, struct_type = side({"type": "array", "items": {"type": "integer"}})  # not an object
    assert ColumnDecoder.for_rows(decoder._codec(1), struct_type) is None  # type: ignore[arg-type]
