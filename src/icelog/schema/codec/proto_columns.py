"""Protobuf messages straight to the Arrow arrays of a table's columns: the compiled fast path of
proto_decode.ProtoSideDecoder.

upb builds a Python message per record, proto_values reads every column from it field by field, and
ProtoSideDecoder re-serializes each message to prove its row rebuilds the payload: most of a Protobuf archive
pass. `ColumnDecoder` hands a batch's bodies to the C decoder (_proto_columns.c), which fills Arrow buffers per
field of the writer's message, then maps those arrays onto the table's columns with the same rules as
proto_values' converters (`struct_parts` decides which fields fill which columns: a field the table lacks is
dropped, a column the writer lacks or whose type changed is null; int → long and float → double promoted; uint64
and fixed64 as decimal(20,0); enums as their names, a number the enum does not name as its text; Timestamp and
Duration as microseconds; unset fields with presence null, plain proto3 scalars their default).

It covers the messages producers write: every scalar type, enums, nested messages, repeated scalars and messages,
Timestamp and Duration, proto3 `optional` and oneofs, proto2 optional and required fields. `ColumnDecoder.
for_message` answers None for the rest (maps, wrappers, Struct/Value/ListValue/Any, groups, recursive messages or
ones nested past protobuf_types.MAX_DEPTH), and `decode` answers None for a batch the C decoder is not sure of
(see its module comment): the caller then parses with upb.

A batch the C decoder takes is, body by body, exactly what upb's SerializeToString writes for the message it
parses to, so a row whose message is `rebuild.invertible` rebuilds its body: the answer ProtoSideDecoder gets by
re-serializing each message, without the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icelog.schema.codec.proto_values import struct_parts
from icelog.table.arrow import null_array
from icelog.table.iceberg_types import Column
from icelog.table.protobuf_types import WELL_KNOWN, enum_of, is_map, message_of, nested_as_json

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray

try:
    from icelog.schema.codec._proto_columns import decode as _decode_buffers
except ImportError:  # built without a C compiler (setup.py's optional extension): upb parses everything
    _decode_buffers = None  # type: ignore[assignment]
COMPILED = _decode_buffers is not None

# Node kinds of the C decoder's program (the enum at the top of _proto_columns.c).
(INT32, SINT32, SFIXED32, UINT32, FIXED32, INT64, SINT64, SFIXED64, UINT64, FIXED64, FLOAT, DOUBLE, BOOL, STRING,
 BYTES, ENUM, MESSAGE, TIMESTAMP, LIST) = range(19)
# Node flags (F_* in _proto_columns.c).
PRESENCE, PACKED, CLOSED, REQUIRED = 1, 2, 4, 8
_MAX_ONEOFS = 64

_KINDS = {
    FieldDescriptor.TYPE_INT32: INT32, FieldDescriptor.TYPE_SINT32: SINT32, FieldDescriptor.TYPE_SFIXED32: SFIXED32,
    FieldDescriptor.TYPE_UINT32: UINT32, FieldDescriptor.TYPE_FIXED32: FIXED32, FieldDescriptor.TYPE_INT64: INT64,
    FieldDescriptor.TYPE_SINT64: SINT64, FieldDescriptor.TYPE_SFIXED64: SFIXED64,
    FieldDescriptor.TYPE_UINT64: UINT64, FieldDescriptor.TYPE_FIXED64: FIXED64, FieldDescriptor.TYPE_FLOAT: FLOAT,
    FieldDescriptor.TYPE_DOUBLE: DOUBLE, FieldDescriptor.TYPE_BOOL: BOOL, FieldDescriptor.TYPE_STRING: STRING,
    FieldDescriptor.TYPE_BYTES: BYTES, FieldDescriptor.TYPE_ENUM: ENUM,
}
_MICROSECONDS = ("google.protobuf.Timestamp", "google.protobuf.Duration")

Buffers = tuple[int, int, bytes | None, bytes, bytes | None]  # length, null count, validity, data, offsets
Build = Callable[[Sequence[Buffers]], "ArrowArray"]
Instruction = tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]]  # see _proto_columns.c


class Unsupported(Exception):
    """A message (or a field against its column) the fast path does not cover: upb parses it."""


class ColumnDecoder:
    """Decodes bodies of one message into the arrays of a side's struct columns (None: parse with upb)."""

    def __init__(self, descriptor: Descriptor, column: Column, struct_type: pa.StructType) -> None:
        self._program: list[Instruction] = []
        self._fields: dict[int, dict[str, int]] = {}  # message node → its field names' nodes
        root = self._message(descriptor, (), 0, 0, -1)
        self._columns = self._parts(root, descriptor, column, struct_type, ())
        self.program = tuple(self._program)

    @classmethod
    def for_message(cls, descriptor: Descriptor, column: Column, struct_type: pa.StructType) -> ColumnDecoder | None:
        if _decode_buffers is None:
            return None
        try:
            return cls(descriptor, column, struct_type)
        except (Unsupported, KeyError):  # KeyError: a column the side's Arrow type lacks (upb's path then says)
            return None

    def decode(self, bodies: list[bytes | None], head: bytes = b"") -> dict[str, ArrowArray] | None:
        """Column name → its array over the bodies (the columns `struct_parts` fills); None if the C decoder is not
        sure of this batch, a body is None, or one does not start with `head` (the batch's envelope, skipped)."""
        import pyarrow as pa

        try:
            buffers = _decode_buffers(self.program, bodies, head)
            return {name: build(buffers) for name, build in self._columns}
        except (ValueError, pa.ArrowInvalid):  # not exactly what upb writes (ArrowInvalid: a bug, still refused)
            return None

    # --- the program: the writer's fields, each after its message ------------------------------------------------

    def _reserve(self) -> int:
        self._program.append((0, 0, 0, -1, (), ()))  # children come after their parent
        return len(self._program) - 1

    def _message(self, descriptor: Descriptor, ancestors: tuple[str, ...], number: int, flags: int,
                 oneof: int) -> int:
        index = self._reserve()
        inside = (*ancestors, descriptor.full_name)
        if len(descriptor.oneofs) > _MAX_ONEOFS:
            raise Unsupported("a message of over 64 oneofs")
        names: dict[str, int] = {}
        for field in sorted(descriptor.fields, key=lambda f: f.number):  # the order upb writes them in
            member = field.containing_oneof
            names[field.name] = self._field(field, inside, -1 if member is None else member.index)
        self._fields[index] = names
        self._program[index] = (MESSAGE, number, flags, oneof, tuple(names.values()), ())
        return index

    def _field(self, field: FieldDescriptor, inside: tuple[str, ...], oneof: int) -> int:
        if is_map(field):
            raise Unsupported("a map")
        if field.is_repeated:
            index = self._reserve()
            element = self._value(field, inside, 0, 0, -1)
            self._program[index] = (LIST, field.number, PACKED if field.is_packed else 0, -1, (element,), ())
            return index
        flags = (PRESENCE if field.has_presence else 0) | (REQUIRED if field.is_required else 0)
        return self._value(field, inside, field.number, flags, oneof)

    def _value(self, field: FieldDescriptor, inside: tuple[str, ...], number: int, flags: int, oneof: int) -> int:
        """The node of one value of `field` (the field itself, or a repeated field's element)."""
        if field.type == FieldDescriptor.TYPE_GROUP:
            raise Unsupported("a group")
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            message = message_of(field)
            full_name = message.full_name
            if full_name in _MICROSECONDS:
                self._program.append((TIMESTAMP, number, flags, oneof, (), ()))
                return len(self._program) - 1
            if full_name in WELL_KNOWN:
                raise Unsupported(f"a {full_name} (a wrapper, or a column of JSON text)")
            if nested_as_json(full_name, inside):
                raise Unsupported("a recursive message, or one nested past MAX_DEPTH (a column of JSON text)")
            return self._message(message, inside, number, flags, oneof)
        kind = _KINDS[field.type]
        enums: tuple[int, ...] = ()
        if kind == ENUM and enum_of(field).is_closed:
            flags |= CLOSED
            enums = tuple(sorted({v.number for v in enum_of(field).values}))
        self._program.append((kind, number, flags, oneof, (), enums))
        return len(self._program) - 1

    # --- the columns: a builder per table column, from the program's buffers -----------------------------------

    def _parts(self, index: int, descriptor: Descriptor, column: Column, target: pa.StructType,
               ancestors: tuple[str, ...]) -> list[tuple[str, Build]]:
        """(column name, builder) of the columns `struct_parts` fills from message node `index`."""
        inside = (*ancestors, descriptor.full_name)
        children = {c.name: c for c in column.children}
        builds: list[tuple[str, Build]] = []
        for name, _, _ in struct_parts(descriptor, column, ancestors):
            field = descriptor.fields_by_name[name]
            builds.append((name, self._build(self._fields[index][name], field, children[name],
                                             target.field(name).type, inside)))
        return builds

    def _build(self, index: int, field: FieldDescriptor, column: Column, target: pa.DataType,
               inside: tuple[str, ...]) -> Build:
        """The builder of `column`'s array from program node `index` (the writer's values of `field`)."""
        import pyarrow as pa

        if self._program[index][0] != LIST:
            return self._element(index, field, column, target, inside)
        if not isinstance(target, pa.ListType):
            raise Unsupported("a repeated field whose column is not a list")
        items = self._element(self._program[index][4][0], field, column.children[0], target.value_type, inside)

        def listing(buffers: Sequence[Buffers]) -> ArrowArray:
            length, nulls, validity, _, offsets = buffers[index]
            return pa.Array.from_buffers(target, length, [_buffer(validity), _buffer(offsets)], nulls,
                                         children=[items(buffers)])

        return listing

    def _element(self, index: int, field: FieldDescriptor, column: Column, target: pa.DataType,
                 inside: tuple[str, ...]) -> Build:
        import pyarrow as pa
        import pyarrow.compute as pc

        kind = self._program[index][0]
        if kind == MESSAGE:
            if not isinstance(target, pa.StructType):
                raise Unsupported("a message whose column is not a struct")
            built = dict(self._parts(index, message_of(field), column, target, inside))
            fields = [built.get(f.name) or self._nulls(index, f.type) for f in target]

            def struct(buffers: Sequence[Buffers]) -> ArrowArray:
                length, nulls, validity, _, _ = buffers[index]
                return pa.Array.from_buffers(target, length, [_buffer(validity)], nulls,
                                             children=[build(buffers) for build in fields])

            return struct
        if kind == ENUM:
            names: dict[int, str] = {v.number: v.name for v in enum_of(field).values}  # as proto_values._EnumNames
            numbers = pa.array(sorted(names), pa.int32())
            symbols = pa.array([names[n] for n in sorted(names)], pa.string())

            def enum(buffers: Sequence[Buffers]) -> ArrowArray:
                length, nulls, validity, data, _ = buffers[index]
                values = pa.Array.from_buffers(pa.int32(), length, [_buffer(validity), _buffer(data)], nulls)
                named = symbols.take(pc.index_in(values, value_set=numbers))
                texts: ArrowArray = pc.coalesce(named, values.cast(pa.string()))  # an unnamed number as its text
                return texts.cast(target)

            return enum
        by_kind: dict[int, pa.DataType] = {
            INT32: pa.int32(), SINT32: pa.int32(), SFIXED32: pa.int32(), UINT32: pa.int64(), FIXED32: pa.int64(),
            INT64: pa.int64(), SINT64: pa.int64(), SFIXED64: pa.int64(), UINT64: pa.uint64(), FIXED64: pa.uint64(),
            FLOAT: pa.float32(), DOUBLE: pa.float64(), BOOL: pa.bool_(), STRING: pa.string(), BYTES: pa.binary(),
            TIMESTAMP: pa.int64()}
        arrow_type = by_kind[kind]
        varying = kind in (STRING, BYTES)

        def leaf(buffers: Sequence[Buffers]) -> ArrowArray:
            length, nulls, validity, data, offsets = buffers[index]
            layout = [_buffer(validity), _buffer(offsets), _buffer(data)] if varying else [
                _buffer(validity), _buffer(data)]
            array = pa.Array.from_buffers(arrow_type, length, layout, nulls)
            return array if array.type == target else array.cast(target)  # promotions, decimal(20,0), timestamptz

        return leaf

    def _nulls(self, index: int, target: pa.DataType) -> Build:
        """All nulls, as many as program node `index` has values (a column the writer's message does not fill)."""

        def nulls(buffers: Sequence[Buffers]) -> ArrowArray:
            return null_array(buffers[index][0], target)

        return nulls


def _buffer(data: bytes | None) -> pa.Buffer | None:
    import pyarrow as pa

    return None if data is None else pa.py_buffer(data)
