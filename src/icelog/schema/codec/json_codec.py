"""Decoding JSON payloads into rows of a table's columns, and checking them against their schema.

`JSONRows` turns JSON documents (the body after Confluent's 5-byte envelope) into the values of the side's
struct column, typed as table/json_types.py maps the schema: integers → int, numbers → float, date-time
strings (RFC 3339, with an offset) → microseconds since the epoch, dates → days, arrays → lists, maps →
(key, value) lists, objects → dicts, JSON-text columns (untyped values, unions, recursion, `__extra__`) →
compact JSON. No validation: a value of the wrong type for its column is None (the archive always keeps a
JSON payload's raw bytes: JSON text is not canonical, so a row cannot give back the produced bytes).
A body that is not JSON raises.

The archive's hot path is `decode_many`: parse every body (stdlib json's C scanner), then fill each column
with one comprehension over the parsed documents, converting only the columns the table has.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from jsonschema.exceptions import best_match

from icelog.schema.json_schema import JSONSchema
from icelog.table.field_ids import Column
from icelog.table.iceberg_types import ERR, PREFIX, RAW
from icelog.table.json_types import EXTRA, json_layout

Converter = Callable[[object], object]

SYSTEM_CHILDREN = frozenset({PREFIX, ERR, RAW})  # filled by the side decoder, not from the JSON
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MICROSECOND = timedelta(microseconds=1)


class JSONRows:
    """Decodes JSON bodies written with `schema` into the children of the side's struct `column` (the table's)."""

    def __init__(self, schema: JSONSchema, column: Column) -> None:
        self.children = tuple(c for c in column.children if c.name not in SYSTEM_CHILDREN)
        root = self.children[0].name if len(self.children) == 1 else "value"
        layout = json_layout(schema.document, schema.reference_documents, root)
        self.is_record = layout.is_record
        kinds = self._kinds = _StringKinds(layout.json_text, frozenset(_string_paths(layout.columns, ())))
        self._converters = [(c.name, _converter(c, (c.name,), kinds)) for c in self.children]
        self._names = frozenset(c.name for c in self.children)
        self._extra = any(c.name == EXTRA for c in self.children)

    def holds_strings(self, path: tuple[str, ...]) -> bool:
        """Whether the string column at `path` (column names, "element" in a list) takes only JSON strings (any
        other value is None), rather than keeping values as JSON text: what json_columns.py can decode in C."""
        return self._kinds.converter(path) is _string

    def decode(self, body: bytes) -> dict[str, object]:
        """One JSON document → the row dict of the column's children (raises on a body that is not JSON)."""
        document = parse(body)
        if not self.is_record:
            return {name: convert(document) for name, convert in self._converters}
        if type(document) is not dict:
            return dict.fromkeys(self._names)
        row = {name: convert(document.get(name)) for name, convert in self._converters if name != EXTRA}
        if self._extra:
            row[EXTRA] = _extra_text(document, self._names)
        return row

    def decode_many(self, bodies: Sequence[bytes]) -> dict[str, list[object]]:
        """Child column name → one value per body, built column by column (raises if any body is not JSON)."""
        # Parsing allocates many containers and keeps them all: the cyclic GC would walk them over and over
        # (a third of the time), and JSON documents cannot form cycles.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._columns(bodies)
        finally:
            if collecting:
                gc.enable()

    def _columns(self, bodies: Sequence[bytes]) -> dict[str, list[object]]:
        documents = [parse(body) for body in bodies]
        if not self.is_record:
            return {name: [convert(d) for d in documents] for name, convert in self._converters}
        objects = [d if type(d) is dict else _EMPTY for d in documents]  # not an object: every column None
        columns: dict[str, list[object]] = {}
        for name, convert in self._converters:
            if name == EXTRA:
                names = self._names
                columns[name] = [_extra_text(d, names) for d in objects]
            elif convert is _string:  # the common columns, without a call per value
                columns[name] = [v if type(v) is str else None for v in [d.get(name) for d in objects]]
            else:
                columns[name] = [convert(d.get(name)) for d in objects]
        return columns


_EMPTY: dict[str, object] = {}


# The C scanner json.loads ends up in; called directly it skips json.loads' Python-level steps (encoding
# detection, the decoder's whitespace regexes), which cost as much as the scan for a small document.
_scan: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # typeshed lacks it


def parse(body: bytes) -> object:
    """A JSON body's value, exactly as json.loads(body) (same values, same errors), faster for compact UTF-8."""
    try:
        text = body.decode()
        document, end = _scan(text, 0)
    except (UnicodeDecodeError, StopIteration):
        return json.loads(body)  # another encoding, leading whitespace, or not JSON: json.loads decides (or raises)
    if end != len(text):
        return json.loads(body)  # trailing whitespace is fine, anything else raises "Extra data"
    return document


def payload_problem(schema: JSONSchema, body: bytes) -> str | None:
    """None if `body` is a JSON document valid under `schema`, else why (jsonschema's message and the path).

    `format` is an annotation here, as in jsonschema's and confluent-kafka's JSONSerializer's validation by default:
    a broker stricter than the producing client would refuse what the client just accepted.
    """
    try:
        document = json.loads(body)
    except ValueError as exc:  # also a body that is not UTF-8
        return f"not JSON: {exc}"
    error = best_match(schema.validator.iter_errors(document))
    if error is None:
        return None
    return f"{error.message} (at {error.json_path})"


def _extra_text(document: dict[str, object], declared: frozenset[str]) -> str | None:
    if document.keys() <= declared:  # the usual case, answered without building anything
        return None
    return json_text({k: v for k, v in document.items() if k not in declared})


def json_text(value: object) -> str | None:
    """A value as compact JSON text (None for null)."""
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- one converter per column --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StringKinds:
    """What the writer's schema makes of the table's string columns (by path): JSON text, or JSON strings."""

    json_text: frozenset[tuple[str, ...]]
    strings: frozenset[tuple[str, ...]]

    def converter(self, path: tuple[str, ...]) -> Converter:
        if path in self.json_text:
            return json_text
        if path in self.strings:
            return _string
        return _string_or_json_text  # a column the writer does not declare: keep whatever it holds


def _string_paths(columns: Sequence[Column], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for column in columns:
        if column.signature == "string":
            yield (*path, column.name)
        yield from _string_paths(column.children, (*path, column.name))


def _converter(column: Column, path: tuple[str, ...], kinds: _StringKinds) -> Converter:
    signature = column.signature
    if signature == "string":
        return kinds.converter(path)
    if signature == "struct":
        return _struct_converter(column, path, kinds)
    if signature == "list":
        element = _converter(column.children[0], (*path, "element"), kinds)
        if element is _string:
            return _string_list
        return lambda value: list(map(element, value)) if type(value) is list else None
    if signature == "map":
        convert = _converter(column.children[1], (*path, "value"), kinds)
        if convert is _string:
            return _string_map
        return lambda value: (
            list(zip(value, map(convert, value.values()), strict=True)) if type(value) is dict else None
        )
    return _SCALARS.get(signature, _none)


def _struct_converter(column: Column, path: tuple[str, ...], kinds: _StringKinds) -> Converter:
    names = frozenset(c.name for c in column.children)
    extra = EXTRA in names
    fields = [(c.name, _converter(c, (*path, c.name), kinds)) for c in column.children if c.name != EXTRA]

    def convert(value: object) -> object:
        if type(value) is not dict:
            return None
        row = {}
        for name, convert_field in fields:  # a loop: a comprehension per value costs twice as much here
            row[name] = convert_field(value.get(name))
        if extra:
            row[EXTRA] = _extra_text(value, names)
        return row

    return convert


def _none(value: object) -> None:
    return None


def _string(value: object) -> str | None:
    return value if type(value) is str else None


def _string_or_json_text(value: object) -> str | None:
    return value if type(value) is str else json_text(value)


def _string_list(value: object) -> list[str | None] | None:
    if type(value) is not list:
        return None
    for element in value:
        if type(element) is not str:
            return [e if type(e) is str else None for e in value]
    return value  # the parsed list is ours: no copy when every element is a string


def _string_map(value: object) -> list[tuple[str, str | None]] | None:
    if type(value) is not dict:
        return None
    for element in value.values():
        if type(element) is not str:
            return [(k, v if type(v) is str else None) for k, v in value.items()]
    return list(value.items())


def _boolean(value: object) -> bool | None:
    return value if type(value) is bool else None


def _long(value: object) -> int | None:
    if type(value) is int:
        return value if _LONG_MIN <= value <= _LONG_MAX else None
    if type(value) is float and value.is_integer():  # 1.0 is an integer to JSON Schema
        return _long(int(value))
    return None


def _int(value: object) -> int | None:
    number = _long(value)
    return number if number is not None and _INT_MIN <= number <= _INT_MAX else None


def _double(value: object) -> float | None:
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _instant(value: object) -> datetime | None:
    if type(value) is not str:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        try:  # RFC 3339 allows a lower-case "t" and "z"
            return datetime.fromisoformat(value.upper())
        except ValueError:
            return None


def _timestamptz(value: object) -> int | None:
    """An RFC 3339 date-time → µs since the epoch; one without an offset is not an instant (None)."""
    if type(value) is not str:
        return None
    try:
        instant: datetime | None = datetime.fromisoformat(value)
    except ValueError:
        instant = _instant(value)  # the slow path: lower-case separators, or not a date-time
    if instant is None or instant.tzinfo is None:
        return None
    return (instant - _EPOCH) // _MICROSECOND


def _timestamp(value: object) -> int | None:
    """A date-time → µs since the epoch of its wall-clock time (the offset, if any, is dropped)."""
    instant = _instant(value)
    return None if instant is None else (instant.replace(tzinfo=None) - _EPOCH_NAIVE) // _MICROSECOND


def _date(value: object) -> int | None:
    if type(value) is not str:
        return None
    try:
        return date.fromisoformat(value).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None


_SCALARS: dict[str, Converter] = {
    "long": _long,
    "int": _int,
    "double": _double,
    "float": _double,
    "boolean": _boolean,
    "timestamptz": _timestamptz,
    "timestamp": _timestamp,
    "date": _date,
}
