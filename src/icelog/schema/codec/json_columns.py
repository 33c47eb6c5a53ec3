"""JSON documents straight to the Arrow arrays of a table's columns: the compiled fast path of json_codec.JSONRows.

JSONRows parses every body with json.loads' C scanner (a dict, a str, an int per value), then converts each column
value by value in Python, and pyarrow converts the lists again: ~10 µs a record of a JSON archive pass.
`ColumnDecoder` hands a batch's bodies to the C decoder (_json_columns.c), which parses them and fills Arrow buffers
per table column in one pass, with JSONRows' rules (json_codec's converters): a key the table has no column for is
ignored, a column the document lacks is null, a value of the wrong JSON type for its column is null, integers (and
numbers of integral value, 1.0 or 1e2) in range fill long columns, any number fills double columns (an integer past
the double range is null), RFC 3339 date-time strings with an offset are microseconds, YYYY-MM-DD dates are days,
objects are structs and arrays lists, a top-level value that is not an object a row of nulls.

It covers top-level objects whose columns are strings, longs (and ints), doubles, booleans, dates, timestamptz,
structs and lists of those. `ColumnDecoder.for_rows` answers None for the rest (a top-level schema that is not an
object, maps, open objects' `__extra__`, string columns kept as JSON text, other column types), and `decode` answers
None for a batch the C decoder is not sure of (see its module comment: anything json.loads might read otherwise,
date and date-time strings other than their plain forms): the caller then decodes with JSONRows. JSON rows always
keep `__raw__` (JSON text is not canonical), so a batch taken here needs no proof of rebuilding its bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from icelog.schema.codec.json_codec import JSONRows
from icelog.table.field_ids import Column
from icelog.table.json_types import EXTRA

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray

try:
    from icelog.schema.codec._json_columns import decode as _decode_buffers
except ImportError:  # built without a C compiler (setup.py's optional extension): json.loads decodes everything
    _decode_buffers = None  # type: ignore[assignment]
COMPILED = _decode_buffers is not None

# Node kinds of the C decoder's program (the enum at the top of _json_columns.c).
STRUCT, LIST, STRING, LONG, DOUBLE, BOOLEAN, DATE, TIMESTAMPTZ = range(8)
_LEAVES = {"string": STRING, "long": LONG, "int": LONG, "double": DOUBLE, "boolean": BOOLEAN, "date": DATE,
           "timestamptz": TIMESTAMPTZ}

Buffers = tuple[int, int, bytes | None, bytes, bytes | None]  # length, null count, validity, data, offsets
Build = Callable[[Sequence[Buffers]], "ArrowArray"]
Instruction = tuple[int, int, bytes, tuple[int, ...]]  # kind, arg, key, children (see _json_columns.c)
_MAX_NODES = 4096  # MAX_NODES in _json_columns.c


class Unsupported(Exception):
    """A table (or a column against the writer's schema) the fast path does not cover: JSONRows decodes it."""


class ColumnDecoder:
    """Decodes JSON bodies into the arrays of a side's struct columns, as `rows` does (None: use JSONRows)."""

    def __init__(self, rows: JSONRows, struct_type: pa.StructType) -> None:
        if not rows.is_record:
            raise Unsupported("a top-level schema that is not an object")
        self._rows = rows
        self._program: list[Instruction] = [(STRUCT, 0, b"", ())]
        builds: list[tuple[str, Build]] = []
        children = []
        for column in rows.children:
            index, build = self._add(column, (column.name,), struct_type.field(column.name).type)
            children.append(index)
            builds.append((column.name, build))
        self._program[0] = (STRUCT, 0, b"", tuple(children))
        if len(self._program) > _MAX_NODES:
            raise Unsupported("a table of over 4096 columns and elements")
        self._columns = builds
        self.program = tuple(self._program)

    @classmethod
    def for_rows(cls, rows: JSONRows, struct_type: pa.StructType) -> ColumnDecoder | None:
        if _decode_buffers is None:
            return None
        try:
            return cls(rows, struct_type)
        except (Unsupported, KeyError, UnicodeEncodeError):  # KeyError: a column the side's Arrow type lacks (JSONRows
            # then says); UnicodeEncodeError: a column name with a lone surrogate (a key no UTF-8 body spells)
            return None

    def decode(self, bodies: list[bytes] | list[bytes | None], head: bytes = b"") -> dict[str, ArrowArray] | None:
        """Child column name → its array over the bodies; None if the C decoder is not sure of this batch, or (with
        a `head`, the batch's envelope, skipped) a body is None or does not start with `head`."""
        import pyarrow as pa

        try:
            buffers = _decode_buffers(self.program, bodies, head)
            return {name: build(buffers) for name, build in self._columns}
        except (ValueError, pa.ArrowInvalid):  # json.loads might read a body otherwise (ArrowInvalid: a bug, refused)
            return None

    # --- the program: the table's columns, each after its parent, with the builder of its array ------------------

    def _add(self, column: Column, path: tuple[str, ...], target: pa.DataType) -> tuple[int, Build]:
        import pyarrow as pa

        index = len(self._program)
        self._program.append((0, 0, b"", ()))  # reserved: children come after their parent
        key = column.name.encode()
        signature = column.signature
        if column.name == EXTRA:
            raise Unsupported("an open object's undeclared properties (__extra__)")
        if signature == "struct":
            assert isinstance(target, pa.StructType)
            children: list[int] = []
            fields: list[Build] = []
            by_name = {c.name: c for c in column.children}
            for field in target:
                child, build = self._add(by_name[field.name], (*path, field.name), field.type)
                children.append(child)
                fields.append(build)
            self._program[index] = (STRUCT, 0, key, tuple(children))
            return index, _struct(index, target, fields)
        if signature == "list":
            assert isinstance(target, pa.ListType)
            child, element = self._add(column.children[0], (*path, "element"), target.value_type)
            self._program[index] = (LIST, 0, key, (child,))
            return index, _list(index, target, element)
        kind = _LEAVES.get(signature)
        if kind is None:
            raise Unsupported(f"a {signature} column")
        if kind == STRING and not self._rows.holds_strings(path):
            raise Unsupported("a string column kept as JSON text")
        self._program[index] = (kind, 1 if signature == "int" else 0, key, ())
        return index, _leaf(index, kind, target)


def _struct(index: int, target: pa.DataType, fields: list[Build]) -> Build:
    import pyarrow as pa

    def struct(buffers: Sequence[Buffers]) -> ArrowArray:
        length, nulls, validity, _, _ = buffers[index]
        return pa.Array.from_buffers(target, length, [_buffer(validity)], nulls,
                                     children=[build(buffers) for build in fields])

    return struct


def _list(index: int, target: pa.DataType, element: Build) -> Build:
    import pyarrow as pa

    def listing(buffers: Sequence[Buffers]) -> ArrowArray:
        length, nulls, validity, _, offsets = buffers[index]
        return pa.Array.from_buffers(target, length, [_buffer(validity), _buffer(offsets)], nulls,
                                     children=[element(buffers)])

    return listing


def _leaf(index: int, kind: int, target: pa.DataType) -> Build:
    import pyarrow as pa

    by_kind: dict[int, pa.DataType] = {STRING: pa.string(), LONG: pa.int64(), DOUBLE: pa.float64(), BOOLEAN: pa.bool_(),
                                       DATE: pa.date32(), TIMESTAMPTZ: pa.timestamp("us", tz="UTC")}
    arrow_type = by_kind[kind]

    def leaf(buffers: Sequence[Buffers]) -> ArrowArray:
        length, nulls, validity, data, offsets = buffers[index]
        layout = [_buffer(validity), _buffer(offsets), _buffer(data)] if kind == STRING else [
            _buffer(validity), _buffer(data)]
        array = pa.Array.from_buffers(arrow_type, length, layout, nulls)
        return array if array.type == target else array.cast(target)

    return leaf


def _buffer(data: bytes | None) -> pa.Buffer | None:
    import pyarrow as pa

    return None if data is None else pa.py_buffer(data)
