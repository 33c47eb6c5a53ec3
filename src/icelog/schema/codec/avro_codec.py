"""Avro binary datums ↔ rows shaped like their Iceberg columns (runs in Spark's Python workers and the broker).

fastavro's compiled reader decodes with the writer's schema stripped of its logical types, so timestamps, dates
and times come back as the integers the table stores (no datetime is built only to be taken apart again) and
decimals as their bytes; a converter compiled once per (writer schema, table column) then shapes each value: the
column tree says which fields to fill; a field the writer lacks, or whose type does not fit its column (a payload
written with an older schema version), is None. The table's column may come from a newer schema than the writer's.

Avro binary is canonical for ordinary writers, so `encode(decode(body)) == body`; the caller keeps the raw bytes
whenever it does not hold (a lossy column, a writer padding its decimals).
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.types import Schema

from icelog.schema.avro_schema import AvroSchema, without_logical_types
from icelog.table.avro_types import RECURSION, AvroTypes, Node, decimal_of, leaf_signature
from icelog.table.field_ids import PROMOTIONS, Column

Convert = Callable[[Any], Any]
_US_PER_MS = 1000
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DECIMAL_CONTEXT = decimal.Context(prec=80)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DAY = datetime.date(1970, 1, 1)
_ONE_US = datetime.timedelta(microseconds=1)
_MILLIS = {"timestamp-millis", "local-timestamp-millis", "time-millis"}


def _null(_value: Any) -> None:
    return None


def _decimal_reader(scale: int) -> Convert:
    scaleb, exponent, unscaled = _DECIMAL_CONTEXT.scaleb, decimal.Decimal(-scale), int.from_bytes

    def read(raw: bytes) -> decimal.Decimal:
        return scaleb(decimal.Decimal(unscaled(raw, "big", signed=True)), exponent)

    return read


def _jsonable(value: Any) -> Any:
    """A fastavro value as Avro's JSON encoding would spell it (bytes as ISO-8859-1, a union branch as {name: v})."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {value[0]: _jsonable(value[1])}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def _as_json(value: Any) -> str | None:
    return None if value is None else json.dumps(_jsonable(value), separators=(",", ":"), sort_keys=True)


def _millis_to_micros(millis: int) -> int:
    """Milliseconds as the column's microseconds. Past the column's int64 the datum is valid Avro but no row can
    hold it: ValueError, so the payload is kept whole as a row that did not decode (`__err__`, `__raw__`)."""
    micros = millis * _US_PER_MS
    if not _LONG_MIN <= micros <= _LONG_MAX:
        raise ValueError(f"{millis} ms is past what a microsecond column holds")
    return micros


def _optional(convert: Convert) -> Convert:
    return lambda v: None if v is None else convert(v)


def _list_of(convert: Convert) -> Convert:
    return lambda values: [convert(v) for v in values]


def _entries_of(convert: Convert | None) -> Convert:
    if convert is None:
        return lambda values: list(values.items())
    return lambda values: [(k, convert(v)) for k, v in values.items()]


def _struct_of(fields: Sequence[tuple[str, str | None, Convert | None]]) -> Convert:
    """A record value → the column's dict: (child name, writer field name or None, converter or None)."""

    def convert(record: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: None if source is None else (record[source] if f is None else f(record[source]))
            for name, source, f in fields
        }

    return convert


class _Decoders:
    """Compiles converters from writer-schema nodes to table columns (None: the value is used as read)."""

    def __init__(self, types: AvroTypes) -> None:
        self.types = types
        self.lossless = True  # every writer field lands in a column of its own type
        # Whether the writer's datum of a row is exactly what encode() rebuilds from it. Every converter but the
        # decimal's undoes exactly (a decimal's bytes are re-encoded minimal, a padded writer's are not).
        self.datum_exact = True

    def compile(self, node: Node, column: Column) -> Convert | None:
        if node.kind == "union":
            return self._union(node, column)
        if node.kind == "record":
            return self._record(node, column)
        if node.kind in ("array", "map"):
            assert isinstance(node.schema, dict)
            if column.signature != ("list" if node.kind == "array" else "map"):
                return self._mismatch()
            key = "items" if node.kind == "array" else "values"
            child = column.children[0] if node.kind == "array" else column.children[1]
            inner = self.compile(self.types.resolve(node.schema[key], node.namespace), child)
            if node.kind == "array":
                return None if inner is None else _list_of(inner)  # fastavro's list already is the column's
            return _entries_of(inner)
        return self._leaf(node, column)

    def _mismatch(self) -> Convert:
        self.lossless = False
        return _null

    def _record(self, node: Node, column: Column) -> Convert | None:
        if column.signature == RECURSION:
            self.lossless = False  # a recursive record cut to its JSON text
            return _as_json
        if column.signature != "struct":
            return self._mismatch()
        plan = self.record_plan(node, column)
        assert isinstance(node.schema, dict)
        fields = [f["name"] for f in node.schema.get("fields") or []]
        if sorted(fields) == sorted(c.name for c in column.children) and all(
            source == name and f is None for name, source, f in plan
        ):
            return None  # fastavro's dict already is the row: same names, values as read (the hot path's common case)
        return _struct_of(plan)

    def record_plan(self, node: Node, column: Column) -> list[tuple[str, str | None, Convert | None]]:
        """Per child of a struct column: (child name, the writer's field name or None, converter or None)."""
        assert isinstance(node.schema, dict)
        fields = {f["name"]: f for f in node.schema.get("fields") or []}
        if set(fields) - {c.name for c in column.children}:
            self.lossless = False  # the table (from another schema version) has no column for some field
        plan: list[tuple[str, str | None, Convert | None]] = []
        for child in column.children:
            field = fields.get(child.name)
            if field is None:
                plan.append((child.name, None, None))
                continue
            convert = self.compile(self.types.resolve(field["type"], node.namespace), child)
            plan.append((child.name, None, None) if convert is _null else (child.name, child.name, convert))
        return plan

    def _union(self, node: Node, column: Column) -> Convert | None:
        present, _ = self.types.branches(node)
        if not present:
            return _null
        if len(present) == 1:
            inner = self.compile(present[0], column)
            if inner is _null:
                return _null
            if present[0].fullname:  # fastavro (return_named_type) hands back (name, value) for named types
                return (lambda v: None if v is None else v[1]) if inner is None else (
                    lambda v: None if v is None else inner(v[1])
                )
            return None if inner is None else _optional(inner)
        if column.signature != "struct":
            return self._mismatch()
        return self._branches(present, column)

    def _branches(self, present: list[Node], column: Column) -> Convert:
        """A union of several types → a struct with one child per branch, the value in its branch's child."""
        children = {c.name: c for c in column.children}
        by_name: dict[str, tuple[str, Convert | None]] = {}  # fastavro's full name or Python type → (child, f)
        python_types: dict[type, str] = {}
        kinds = [b.kind for b in present]
        if {"int", "long"} <= set(kinds) or {"float", "double"} <= set(kinds):
            self.lossless = False  # the value alone does not say which branch the writer chose
        for branch in present:
            name = self.types.branch_name(branch)
            child = children.get(name)
            if child is None:
                self.lossless = False
                continue
            key = branch.fullname or branch.kind
            by_name[key] = (name, self.compile(branch, child))
            if not branch.fullname:
                for python_type in _PYTHON_TYPES[branch.kind]:
                    python_types.setdefault(python_type, key)
        template = dict.fromkeys(children)

        def to_struct(value: Any) -> dict[str, Any] | None:
            if value is None:
                return None
            if isinstance(value, tuple):
                key, value = value
            else:
                key = python_types.get(type(value), "")
                if key == "int" and "long" in by_name and not -(2**31) <= value < 2**31:
                    key = "long"
            row = dict(template)
            target = by_name.get(key)
            if target is not None:
                row[target[0]] = value if target[1] is None else target[1](value)
            return row

        return to_struct

    def _leaf(self, node: Node, column: Column) -> Convert | None:
        signature = leaf_signature(node)
        if signature != column.signature and (signature, column.signature) not in PROMOTIONS:
            return self._mismatch()
        logical = node.schema.get("logicalType") if isinstance(node.schema, dict) else None
        if logical in _MILLIS and signature in ("timestamptz", "timestamp", "long"):
            return _millis_to_micros
        if signature.startswith("decimal"):
            precision_scale = decimal_of(node.schema)
            assert precision_scale is not None
            self.datum_exact = False
            return _decimal_reader(precision_scale[1])
        if logical == "uuid" and node.kind == "fixed":
            return lambda v: str(uuid.UUID(bytes=v))
        return None


_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (float,),
    "double": (float,),
    "string": (str,),
    "bytes": (bytes,),
    "array": (list,),
    "map": (dict,),
}


class AvroRows:
    """Decodes Avro binary datums written with `writer` into rows of the table's struct `column`, and back."""

    def __init__(self, writer: AvroSchema, column: Column) -> None:
        self.writer = writer
        self.column = column
        document = writer.document
        self._raw = _raw_schema(writer)
        types = AvroTypes()
        root = types.resolve(document, "")
        decoders = _Decoders(types)
        self._plan: list[tuple[str, str | None, Convert | None]] = []
        self._names: tuple[str, ...] = tuple(c.name for c in column.children)
        self._record = root.kind == "record"
        encode = _Encoders(types).compile(root)
        if self._record:
            self._plan = decoders.record_plan(root, column)
            self._top: Convert = _struct_of(self._plan)
            self._encode: Convert = encode
        else:  # a non-record schema fills the one child named as the side's column ("value")
            children = [c for c in column.children if c.name == column.name] or list(column.children[:1])
            inner = decoders.compile(root, children[0]) if children else _null
            target = children[0].name if children else column.name
            self._top = self._single(target, inner)
            self._encode = lambda row: encode(row.get(target))
        self.invertible: bool = decoders.lossless
        self._datum_exact = decoders.datum_exact

    def _single(self, target: str, inner: Convert | None) -> Convert:
        empty = dict.fromkeys(self._names)

        def convert(value: Any) -> dict[str, Any]:
            row = dict(empty)
            if target in row:
                row[target] = value if inner is None else inner(value)
            return row

        return convert

    def read(self, body: bytes) -> Any:
        """fastavro's value of one datum (logical types raw); raises unless the datum uses every byte."""
        stream = io.BytesIO(body)
        value = schemaless_reader(stream, self._raw, None, False, False, "strict", True)
        if stream.tell() != len(body):
            raise ValueError(f"{len(body) - stream.tell()} bytes after the Avro datum")
        return value

    def decode(self, body: bytes) -> dict[str, object]:
        """One Avro binary datum (no envelope) → the row dict of the column's children."""
        row: dict[str, object] = self._top(self.read(body))
        return row

    def decode_many(self, bodies: Sequence[bytes]) -> dict[str, list[object]]:
        """Child column name → values, one per body. Raises if any body does not decode."""
        return self._columns(self._read_many(bodies))

    def decode_many_rebuilt(self, bodies: Sequence[bytes]) -> tuple[dict[str, list[object]], list[bool]]:
        """decode_many's columns, and per body whether its row rebuilds it exactly (`encode(row) == body`).

        The archive drops a payload's raw bytes only where its row rebuilds it. Encoding every row back is the
        archive's most expensive step, so the datums fastavro read are written back instead, all in one call,
        and compared with the bodies at once: where every converter undoes exactly (`datum_exact`), the datum's
        bytes are the row's. Bodies whose datum does not give them back (or all, with decimals) are checked by
        encoding their row, as before.
        """
        values = self._read_many(bodies)
        columns = self._columns(values)
        n = len(values)
        if not self.invertible:
            return columns, [False] * n
        rebuilt = _rewrites(self._raw, values, bodies) if self._datum_exact else [False] * n
        names = [name for name in self._names if name in columns]
        for j in [j for j, same in enumerate(rebuilt) if not same]:
            try:
                rebuilt[j] = self.encode({name: columns[name][j] for name in names}) == bodies[j]
            except Exception:  # a row that does not encode back: keep the bytes
                rebuilt[j] = False
        return columns, rebuilt

    def _read_many(self, bodies: Sequence[bytes]) -> list[Any]:
        read = self.read
        return [read(body) for body in bodies]

    def _columns(self, values: list[Any]) -> dict[str, list[object]]:
        if not self._record:
            rows = [self._top(v) for v in values]
            return {name: [row[name] for row in rows] for name in self._names}
        columns: dict[str, list[object]] = {}
        for name, source, convert in self._plan:
            if source is None:
                columns[name] = [None] * len(values)
            elif convert is None:
                columns[name] = [v[source] for v in values]
            else:
                columns[name] = [convert(v[source]) for v in values]
        return columns

    def encode(self, row: Mapping[str, object]) -> bytes:
        """The writer-schema datum of a row (also one read back from the table). Raises ValueError."""
        try:
            datum = self._encode(row)
            stream = io.BytesIO()
            schemaless_writer(stream, self._raw, datum)
        except ValueError:
            raise
        except Exception as exc:  # fastavro raises TypeError, AttributeError, KeyError, OverflowError, ...
            raise ValueError(f"row does not fit the Avro schema: {exc}") from exc
        return stream.getvalue()


def payload_problem(schema: AvroSchema, body: bytes) -> str | None:
    """None if `body` is one valid datum of `schema` using every byte, else a short reason."""
    stream = io.BytesIO(body)
    try:
        schemaless_reader(stream, _raw_schema(schema), None)
    except Exception as exc:  # fastavro raises EOFError, StructError, UnicodeDecodeError, IndexError, ...
        return f"not an Avro datum of the schema: {type(exc).__name__}: {exc}"
    if stream.tell() != len(body):
        return f"{len(body) - stream.tell()} bytes after the Avro datum"
    return None


def _rewrites(raw: Schema, values: list[Any], bodies: Sequence[bytes]) -> list[bool]:
    """Per datum, whether fastavro writes it back as exactly its body."""
    stream = io.BytesIO()
    write = schemaless_writer
    ends = []
    try:
        for value in values:
            write(stream, raw, value)
            ends.append(stream.tell())
    except Exception:  # not expected of a datum fastavro read; the rows are then checked one by one
        return [False] * len(values)
    written = stream.getvalue()
    if written == b"".join(bodies):  # every body (each read to its last byte, so the boundaries agree)
        return [True] * len(values)
    out, start = [], 0
    for end, body in zip(ends, bodies, strict=True):
        out.append(written[start:end] == body)
        start = end
    return out


@lru_cache(maxsize=256)
def _raw_schema(schema: AvroSchema) -> Schema:
    raw: Schema = parse_schema(without_logical_types(schema.document))
    return raw


# --- rows back into datums -------------------------------------------------------------------------------------


def _micros(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        epoch = _EPOCH if value.tzinfo is None else _EPOCH_UTC  # Spark hands back UTC wall clock as naive
        return (value - epoch) // _ONE_US
    return int(value)


def _days(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        value = value.date()
    if isinstance(value, datetime.date):
        return (value - _EPOCH_DAY).days
    return int(value)


def _time_micros(value: Any) -> int:
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return int(value)


def _unscaled(value: Any, scale: int) -> int:
    scaled = decimal.Decimal(value).scaleb(scale, _DECIMAL_CONTEXT)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value} has more than {scale} decimal places")
    return int(scaled)


def _decimal_bytes(scale: int, size: int | None) -> Convert:
    def encode(value: Any) -> bytes:
        unscaled = _unscaled(value, scale)
        if size is not None:
            return unscaled.to_bytes(size, "big", signed=True)
        bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
        return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)  # minimal two's complement, as Java writes

    return encode


def _binary(value: Any) -> bytes:
    if isinstance(value, str):
        raise ValueError("expected bytes, got a string")
    return bytes(value)  # Spark hands back bytearray


def _entries(value: Any) -> Iterable[tuple[Any, Any]]:
    return value.items() if isinstance(value, Mapping) else value


class _Encoders:
    """Compiles, per writer-schema node, the function from a row value to fastavro's raw datum."""

    def __init__(self, types: AvroTypes) -> None:
        self.types = types
        self._records: dict[str, Convert] = {}

    def compile(self, node: Node) -> Convert:
        if node.kind == "union":
            return self._union(node)
        if node.kind == "record":
            return self._record(node)
        if node.kind == "array":
            assert isinstance(node.schema, dict)
            item = self.compile(self.types.resolve(node.schema["items"], node.namespace))
            return lambda v: [item(x) for x in v]
        if node.kind == "map":
            assert isinstance(node.schema, dict)
            value = self.compile(self.types.resolve(node.schema["values"], node.namespace))
            return lambda v: {str(k): value(x) for k, x in _entries(v)}
        return self._leaf(node)

    def _record(self, node: Node) -> Convert:
        if node.fullname in self._records:  # a recursive record: its encoder is being compiled
            return lambda v: self._records[node.fullname](v)
        assert isinstance(node.schema, dict)
        self._records[node.fullname] = _recursion_unsupported
        fields = [
            (f["name"], self.compile(self.types.resolve(f["type"], node.namespace)))
            for f in node.schema.get("fields") or []
        ]

        def encode(value: Any) -> dict[str, Any]:
            if isinstance(value, str):  # a record cut to JSON where it recurs
                value = json.loads(value)
            if not isinstance(value, Mapping):
                raise ValueError(f"expected a record, got {type(value).__name__}")
            return {name: f(value.get(name)) for name, f in fields}

        self._records[node.fullname] = encode
        return encode

    def _union(self, node: Node) -> Convert:
        present, has_null = self.types.branches(node)
        if len(present) == 1:
            inner = self.compile(present[0])
            return lambda v: None if v is None else inner(v)
        branches = [
            (self.types.branch_name(b), b.fullname or b.kind, self.compile(b)) for b in present
        ]

        def encode(value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, Mapping):
                raise ValueError(f"expected one child per union branch, got {type(value).__name__}")
            for child, avro_name, f in branches:
                if value.get(child) is not None:
                    return (avro_name, f(value[child]))
            if has_null:
                return None
            raise ValueError("no branch of the union holds a value")

        return encode

    def _leaf(self, node: Node) -> Convert:
        signature = leaf_signature(node)
        logical = node.schema.get("logicalType") if isinstance(node.schema, dict) else None
        millis = logical in _MILLIS
        if signature in ("timestamptz", "timestamp"):
            return (lambda v: _micros(v) // _US_PER_MS) if millis else _micros
        if signature == "date":
            return _days
        if logical in ("time-millis", "time-micros"):
            return (lambda v: _time_micros(v) // _US_PER_MS) if millis else _time_micros
        if signature.startswith("decimal"):
            precision_scale = decimal_of(node.schema)
            assert precision_scale is not None and isinstance(node.schema, dict)
            size = node.schema.get("size") if node.kind == "fixed" else None
            return _decimal_bytes(precision_scale[1], size)
        if logical == "uuid" and node.kind == "fixed":
            return lambda v: uuid.UUID(str(v)).bytes
        if signature == "binary":
            return _binary
        return _identity


def _identity(value: Any) -> Any:
    return value


def _recursion_unsupported(value: Any) -> Any:
    raise ValueError("recursive record encoder used before it was compiled")
