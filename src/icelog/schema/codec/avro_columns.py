"""Avro datums straight to the Arrow arrays of a table's columns: the compiled fast path of avro_codec.AvroRows.

fastavro builds a dict per datum and a Python object per value, and AvroRows then writes every datum back to
prove its row rebuilds the payload: most of an Avro archive pass. `ColumnDecoder` hands a batch's bodies to the
C decoder (_avro_columns.c), which fills Arrow buffers per node of the writer schema, then maps those arrays onto
the table's columns with the same rules as avro_codec's converters (a field the table lacks is dropped, a
column the writer lacks is null, a type that does not fit its column is null, int → long and float → double
promoted, millisecond times scaled to microseconds, enums as their symbols, a union of several types as a struct
of its branches, decimals as decimal128, a uuid on a fixed as its text).

It covers the schemas producers write: records, every primitive type, enums, fixed, arrays, maps, unions and the
logical types. `ColumnDecoder.for_schema` answers None for the rest (recursive records, a non-record root, a union
of int and long or of float and double, a union of one type without null, a decimal on a fixed of over 16
bytes), and `decode` answers None for a batch the C decoder is not sure of (see its module comment): the caller
then decodes with fastavro.

A batch the C decoder takes is canonical Avro, so re-encoding each row gives its body back byte for byte
whenever the table holds every field as written (`AvroRows.invertible`): the same answer AvroRows gets by
writing each datum back, without the write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from icelog.schema.avro_schema import AvroSchema
from icelog.table.arrow import null_array
from icelog.table.avro_types import RECURSION, AvroTypes, Node, decimal_of, leaf_signature
from icelog.table.field_ids import PROMOTIONS, Column

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray

try:
    from icelog.schema.codec._avro_columns import decode as _decode_buffers
except ImportError:  # built without a C compiler (setup.py's optional extension): fastavro decodes everything
    _decode_buffers = None  # type: ignore[assignment]
COMPILED = _decode_buffers is not None

# Node kinds of the C decoder's program (the enum at the top of _avro_columns.c).
(BOOLEAN, INT, LONG, FLOAT, DOUBLE, STRING, BYTES, ENUM, FIXED, ARRAY, RECORD, NULLABLE, MAP, UNION, DECIMAL_BYTES,
 DECIMAL_FIXED, UUID_FIXED) = range(17)
_LEAVES = {"boolean": BOOLEAN, "int": INT, "long": LONG, "float": FLOAT, "double": DOUBLE, "string": STRING,
           "bytes": BYTES}
_MILLIS = {"timestamp-millis", "local-timestamp-millis", "time-millis"}
_US_PER_MS = 1000
_DECIMAL_BYTES = 16  # Arrow's decimal128
# Union branches fastavro tells apart only by their Python value (avro_codec's `_branches`): an int-sized long is
# filed under the int branch, so the branch the writer chose is not what the row says.
_AMBIGUOUS_BRANCHES = ({"int", "long"}, {"float", "double"})

Buffers = tuple[int, int, bytes | None, bytes, bytes | None]  # length, null count, validity, data, offsets
Build = Callable[[Sequence[Buffers]], "ArrowArray"]
Instruction = tuple[int, int, int, tuple[int, ...]]  # kind, arg, arg2, children (see _avro_columns.c)


class Unsupported(Exception):
    """A schema (or a writer field against its column) the fast path does not cover: fastavro decodes it."""


class ColumnDecoder:
    """Decodes bodies of one writer schema into the arrays of a side's struct columns (None: use fastavro)."""

    def __init__(self, writer: AvroSchema, column: Column, struct_type: pa.StructType) -> None:
        self._types = AvroTypes()
        self._program: list[Instruction] = []
        self._nodes: dict[int, Node] = {}  # program index → the writer's schema node
        root = self._types.resolve(writer.document, "")
        if root.kind != "record":
            raise Unsupported("a schema whose root is not a record")
        root_index = self._add(root, ())
        self._columns = self._record_columns(root_index, root, column, struct_type)
        self.program = tuple(self._program)

    @classmethod
    def for_schema(cls, writer: AvroSchema, column: Column, struct_type: pa.StructType) -> ColumnDecoder | None:
        if _decode_buffers is None:
            return None
        try:
            return cls(writer, column, struct_type)
        except (Unsupported, KeyError):  # KeyError: a column the side's Arrow type lacks (fastavro then says)
            return None

    def decode(self, bodies: list[bytes]) -> dict[str, ArrowArray] | None:
        """Child column name → its array over the bodies; None if the C decoder is not sure of this batch."""
        import pyarrow as pa

        try:
            buffers = _decode_buffers(self.program, bodies)
            return {name: build(buffers) for name, build in self._columns}
        except (ValueError, pa.ArrowInvalid):  # not plainly canonical, or a millisecond time past int64
            return None

    # --- the program: the writer schema's nodes, each after its parent --------------------------------------

    def _add(self, node: Node, stack: tuple[str, ...]) -> int:
        index = len(self._program)
        self._program.append((0, 0, 0, ()))  # reserved: children come after their parent
        self._nodes[index] = node
        self._program[index] = self._instruction(node, stack)
        return index

    def _instruction(self, node: Node, stack: tuple[str, ...]) -> Instruction:
        kind = node.kind
        schema = node.schema
        if kind == "union":
            assert isinstance(schema, list)
            present, has_null = self._types.branches(node)
            if len(present) == 1 and has_null:
                null_index = 0 if self._types.resolve(schema[0], node.namespace).kind == "null" else 1
                return NULLABLE, null_index, 0, (self._add(present[0], stack),)
            kinds = {b.kind for b in present}
            if len(present) < 2 or any(pair <= kinds for pair in _AMBIGUOUS_BRANCHES):
                raise Unsupported("a union of one type without null, or of int and long, or float and double")
            null_at = [self._types.resolve(b, node.namespace).kind for b in schema].index("null") if has_null else -1
            return UNION, null_at + 1, 0, tuple(self._add(b, stack) for b in present)
        if kind == "record":
            assert isinstance(schema, dict)
            if node.fullname in stack:
                raise Unsupported("a recursive record")
            inner = (*stack, node.fullname)
            fields = schema.get("fields") or []
            return RECORD, 0, 0, tuple(self._add(self._types.resolve(f["type"], node.namespace), inner)
                                       for f in fields)
        if kind == "array":
            assert isinstance(schema, dict)
            return ARRAY, 0, 0, (self._add(self._types.resolve(schema["items"], node.namespace), stack),)
        if kind == "map":
            assert isinstance(schema, dict)
            key = self._add(Node("string", "string", node.namespace), stack)
            return MAP, 0, 0, (key, self._add(self._types.resolve(schema["values"], node.namespace), stack))
        if kind == "enum":
            assert isinstance(schema, dict)
            return ENUM, len(schema["symbols"]), 0, ()
        signature = leaf_signature(node) if kind in ("fixed", "bytes") else ""
        precision_scale = decimal_of(schema) if signature.startswith("decimal") else None
        if kind == "fixed":
            assert isinstance(schema, dict)
            size = int(schema["size"])
            if precision_scale is not None:
                if size > _DECIMAL_BYTES:
                    raise Unsupported("a decimal on a fixed of over 16 bytes")
                return DECIMAL_FIXED, size, precision_scale[0], ()
            return (UUID_FIXED, 0, 0, ()) if signature == "string" else (FIXED, size, 0, ())
        if precision_scale is not None:
            return DECIMAL_BYTES, precision_scale[0], 0, ()
        if kind in _LEAVES:
            return _LEAVES[kind], 0, 0, ()
        raise Unsupported(f"Avro {kind}")

    # --- the columns: a builder per table column, from the program's buffers -----------------------------------

    def _record_columns(self, index: int, node: Node, column: Column, target: pa.StructType
                        ) -> list[tuple[str, Build]]:
        assert isinstance(node.schema, dict)
        fields = {f["name"]: child for f, child in zip(node.schema.get("fields") or [], self._program[index][3],
                                                       strict=True)}
        builds: list[tuple[str, Build]] = []
        for child in column.children:
            field_type = target.field(child.name).type
            source = fields.get(child.name)
            builds.append((child.name, self._nulls(index, field_type) if source is None
                           else self._build(source, child, field_type)))
        return builds

    def _build(self, index: int, column: Column, target: pa.DataType) -> Build:
        """The builder of `column`'s array from program node `index` (the writer's value for that column)."""
        import pyarrow as pa

        kind, _, _, children = self._program[index]
        node = self._nodes[index]
        if kind == NULLABLE:
            return self._build(children[0], column, target)  # the branch's node holds the nulls
        if kind == RECORD:
            if column.signature == RECURSION:
                raise Unsupported("a record kept as JSON text")
            if column.signature != "struct":
                return self._nulls(index, target)
            assert isinstance(target, pa.StructType)
            return self._struct(index, target, self._record_columns(index, node, column, target))
        if kind == UNION:
            if column.signature != "struct":
                return self._nulls(index, target)
            assert isinstance(target, pa.StructType)
            present, _ = self._types.branches(node)
            by_name = {self._types.branch_name(b): child for b, child in zip(present, children, strict=True)}
            return self._struct(index, target, [
                (c.name, self._nulls(index, target.field(c.name).type) if c.name not in by_name
                 else self._build(by_name[c.name], c, target.field(c.name).type)) for c in column.children])
        if kind in (ARRAY, MAP):
            if column.signature != ("list" if kind == ARRAY else "map"):
                return self._nulls(index, target)
            if kind == ARRAY:
                assert isinstance(target, pa.ListType)
                items = [self._build(children[0], column.children[0], target.value_type)]
            else:
                assert isinstance(target, pa.MapType)
                keys = self._build(children[0], column.children[0], target.key_type)
                values = self._build(children[1], column.children[1], target.item_type)
                fields = [target.key_field, target.item_field]
                items = [lambda buffers: pa.StructArray.from_arrays([keys(buffers), values(buffers)], fields=fields)]

            def listing(buffers: Sequence[Buffers]) -> ArrowArray:
                length, nulls, validity, _, offsets = buffers[index]
                return pa.Array.from_buffers(target, length, [_buffer(validity), _buffer(offsets)], nulls,
                                             children=[items[0](buffers)])

            return listing
        return self._leaf(index, node, column, target)

    def _struct(self, index: int, target: pa.DataType, fields: list[tuple[str, Build]]) -> Build:
        import pyarrow as pa

        def struct(buffers: Sequence[Buffers]) -> ArrowArray:
            length, nulls, validity, _, _ = buffers[index]
            return pa.Array.from_buffers(target, length, [_buffer(validity)], nulls,
                                         children=[build(buffers) for _, build in fields])

        return struct

    def _leaf(self, index: int, node: Node, column: Column, target: pa.DataType) -> Build:
        import pyarrow as pa
        import pyarrow.compute as pc

        kind, arg, _, _ = self._program[index]
        signature = leaf_signature(node)
        if signature != column.signature and (signature, column.signature) not in PROMOTIONS:
            return self._nulls(index, target)
        logical = node.schema.get("logicalType") if isinstance(node.schema, dict) else None
        scale = logical in _MILLIS and signature in ("timestamptz", "timestamp", "long")
        if kind == ENUM:
            assert isinstance(node.schema, dict)
            symbols = pa.array(node.schema["symbols"], pa.string())

            def enum(buffers: Sequence[Buffers]) -> ArrowArray:
                length, nulls, validity, data, _ = buffers[index]
                indices = pa.Array.from_buffers(pa.int32(), length, [_buffer(validity), _buffer(data)], nulls)
                return symbols.take(indices).cast(target)

            return enum
        arrow_type: pa.DataType
        if kind in (DECIMAL_BYTES, DECIMAL_FIXED):
            precision_scale = decimal_of(node.schema)
            assert precision_scale is not None
            arrow_type = pa.decimal128(*precision_scale)
        else:
            by_kind: dict[int, pa.DataType] = {
                BOOLEAN: pa.bool_(), INT: pa.int32(), LONG: pa.int64(), FLOAT: pa.float32(), DOUBLE: pa.float64(),
                STRING: pa.string(), BYTES: pa.binary(), UUID_FIXED: pa.string()}
            arrow_type = by_kind.get(kind) or pa.binary(arg)
        varying = kind in (STRING, BYTES, UUID_FIXED)

        def leaf(buffers: Sequence[Buffers]) -> ArrowArray:
            length, nulls, validity, data, offsets = buffers[index]
            layout = [_buffer(validity), _buffer(offsets), _buffer(data)] if varying else [
                _buffer(validity), _buffer(data)]
            array = pa.Array.from_buffers(arrow_type, length, layout, nulls)
            if scale:
                array = pc.multiply_checked(array.cast(pa.int64()), _US_PER_MS)
            return array if array.type == target else array.cast(target)

        return leaf

    def _nulls(self, index: int, target: pa.DataType) -> Build:
        """All nulls, as many as the program node at `index` has values (the writer's field lacks this column)."""

        def nulls(buffers: Sequence[Buffers]) -> ArrowArray:
            return null_array(self._length(buffers, index), target)

        return nulls

    def _length(self, buffers: Sequence[Buffers], index: int) -> int:
        kind, _, _, children = self._program[index]
        return self._length(buffers, children[0]) if kind == NULLABLE else buffers[index][0]


def _buffer(data: bytes | None) -> pa.Buffer | None:
    import pyarrow as pa

    return None if data is None else pa.py_buffer(data)
