"""Protobuf message descriptors → Iceberg column trees, and column records → pyiceberg / Arrow / Spark types.

Pure functions: no registry, no catalog, no Spark. The mapping (docs/protobuf.md, "Type mapping"):
  int32, sint32, sfixed32 → int;  uint32, int64, sint64, sfixed64, fixed32 → long;
  uint64, fixed64 → decimal(20,0) (exact: a long would wrap above 2^63-1);
  float → float; double → double; bool → boolean; string → string; bytes → binary;
  enum → string (the value's name; the number as text when the schema does not know it);
  message → struct; repeated → list; map<K,V> → map; oneof members → ordinary nullable columns;
  google.protobuf.Timestamp → timestamptz; Duration → long (microseconds);
  wrappers (Int32Value, StringValue, ...) → the nullable scalar; Struct, Value, ListValue, Any → string (JSON);
  a recursive message field (its type is already among the enclosing messages), or one nested deeper
  than MAX_DEPTH, → string (the message as JSON), so recursive schemas give finite tables.
Every column is optional: Iceberg can only add optional columns, and proto3 absence is null.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icelog.table.config import (
    BATCH_START,
    BUCKET,
    HEADERS,
    KEY_BYTES,
    KEY_ERR,
    OFFSET,
    SYSTEM_COLUMNS,
    TIMESTAMP,
    VALUE_BYTES,
    VALUE_ERR,
    VALUE_PREFIX,
)
from icelog.table.field_ids import Column as Column  # re-exported: the column tree computed from a schema
from icelog.table.field_ids import FieldIdRecord, child_paths

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

MAX_DEPTH = 10  # message nesting kept as structs; deeper message fields become JSON strings

# Column names the archive adds next to a message's fields (Bufstream's).
PREFIX, ERR, RAW = "__prefix__", "__err__", "__raw__"

_SCALARS: dict[int, str] = {
    FieldDescriptor.TYPE_INT32: "int",
    FieldDescriptor.TYPE_SINT32: "int",
    FieldDescriptor.TYPE_SFIXED32: "int",
    FieldDescriptor.TYPE_UINT32: "long",
    FieldDescriptor.TYPE_FIXED32: "long",
    FieldDescriptor.TYPE_INT64: "long",
    FieldDescriptor.TYPE_SINT64: "long",
    FieldDescriptor.TYPE_SFIXED64: "long",
    FieldDescriptor.TYPE_UINT64: "decimal(20,0)",
    FieldDescriptor.TYPE_FIXED64: "decimal(20,0)",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "binary",
    FieldDescriptor.TYPE_ENUM: "string",
}

WRAPPERS: dict[str, str] = {
    "google.protobuf.DoubleValue": "double",
    "google.protobuf.FloatValue": "float",
    "google.protobuf.Int64Value": "long",
    "google.protobuf.UInt64Value": "decimal(20,0)",
    "google.protobuf.Int32Value": "int",
    "google.protobuf.UInt32Value": "long",
    "google.protobuf.BoolValue": "boolean",
    "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "binary",
}
WELL_KNOWN: dict[str, str] = {
    "google.protobuf.Timestamp": "timestamptz",
    "google.protobuf.Duration": "long",
    "google.protobuf.Struct": "string",
    "google.protobuf.Value": "string",
    "google.protobuf.ListValue": "string",
    "google.protobuf.Any": "string",
    **WRAPPERS,
}


def is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def field_signature(field: FieldDescriptor, ancestors: tuple[str, ...]) -> Column:
    """The column of one field; `ancestors`: full names of the enclosing messages, outermost first."""
    if is_map(field):
        entry = field.message_type
        key = _element(entry.fields_by_name["key"], "key", ancestors)
        value = _element(entry.fields_by_name["value"], "value", ancestors)
        return Column(field.name, "map", (key, value))
    if field.is_repeated:
        return Column(field.name, "list", (_element(field, "element", ancestors),))
    return _element(field, field.name, ancestors)


def nested_as_json(full_name: str, ancestors: tuple[str, ...]) -> bool:
    """Whether a message field is kept as JSON text: recursive, or past MAX_DEPTH."""
    return full_name in ancestors or len(ancestors) >= MAX_DEPTH


def _element(field: FieldDescriptor, name: str, ancestors: tuple[str, ...]) -> Column:
    if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        full_name = field.message_type.full_name
        if full_name in WELL_KNOWN:
            return Column(name, WELL_KNOWN[full_name])
        if nested_as_json(full_name, ancestors):
            return Column(name, "string")
        return Column(name, "struct", message_columns(field.message_type, ancestors))
    return Column(name, _SCALARS[field.type])


def message_columns(descriptor: Descriptor, ancestors: tuple[str, ...] = ()) -> tuple[Column, ...]:
    """The columns of a message's fields, in field order (oneof members are plain nullable columns)."""
    inside = (*ancestors, descriptor.full_name)
    return tuple(field_signature(field, inside) for field in descriptor.fields)


def side_column(side: str, descriptor: Descriptor | None) -> Column:
    """The `key` or `value` struct: the message's fields plus __prefix__ and __err__, and always __raw__."""
    extra: tuple[Column, ...] = ()
    if descriptor is not None:
        extra = (*message_columns(descriptor), Column(PREFIX, "binary"), Column(ERR, "string"))
    return Column(side, "struct", (*extra, Column(RAW, "binary")))


FIXED_COLUMNS: tuple[Column, ...] = (
    Column("headers", "list", (Column("element", "struct", (Column("key", "string"), Column("value", "binary"))),)),
    Column(
        "kafka",
        "struct",
        (
            Column("partition", "int"),
            Column("offset", "long"),
            Column("event_timestamp", "timestamptz"),
            Column("ingest_timestamp", "timestamptz"),
            Column("batch_start", "long"),
        ),
    ),
)


def table_columns(key: Descriptor | None, value: Descriptor | None) -> tuple[Column, ...]:
    """Every column of an archive table whose key and/or value has a Protobuf schema."""
    return (side_column("key", key), side_column("value", value), *FIXED_COLUMNS)


_HEADER_ELEMENT = Column("element", "struct", (Column("key", "string"), Column("value", "binary")))


def table_layout_columns(key: Descriptor | None, value: Descriptor | None) -> tuple[Column, ...]:
    """Every column of a `table` layout table (Fluss's): the messages' fields, then the layout's own columns.

    The key's fields come first when it has a schema (its bytes always stay in __key: Kafka keys are compared
    byte for byte); the value's __value / __value_prefix / __value_err play the record layout's
    __raw__ / __prefix__ / __err__ roles. Names must not clash (table_schema.check_table_names).
    """
    columns: list[Column] = []
    if key is not None:
        columns += message_columns(key)
    if value is not None:
        columns += message_columns(value)
    columns.append(Column(KEY_BYTES, "binary"))
    if key is not None:
        columns.append(Column(KEY_ERR, "string"))
    columns.append(Column(VALUE_BYTES, "binary"))
    if value is not None:
        columns += [Column(VALUE_PREFIX, "binary"), Column(VALUE_ERR, "string")]
    columns += [
        Column(HEADERS, "list", (_HEADER_ELEMENT,)),
        Column(BATCH_START, "long"),
        Column(BUCKET, "int"),
        Column(OFFSET, "long"),
        Column(TIMESTAMP, "timestamptz"),
    ]
    return tuple(columns)


# -- records → engine types ------------------------------------------------------------------------
_TAIL_RANK = {name: rank for rank, name in enumerate(SYSTEM_COLUMNS)}


class _Tree:
    """Column records indexed by parent path, children ordered by field id (new columns come last).

    At the top level the table layout's own columns (SYSTEM_COLUMNS) stay last, in their order, also after a
    schema evolution adds fields with higher ids: Fluss's __bucket, __offset, __timestamp end every table.
    """

    def __init__(self, records: Iterable[FieldIdRecord]) -> None:
        self.by_path = {r.path: r for r in records}
        self.children = child_paths(self.by_path)
        top = self.children.get("", [])
        self.children[""] = sorted(top, key=lambda r: (_TAIL_RANK.get(r.path, -1), r.field_id))

    def top(self) -> list[FieldIdRecord]:
        return self.children.get("", [])

    def kids(self, record: FieldIdRecord) -> list[FieldIdRecord]:
        return self.children.get(record.path, [])


def iceberg_schema(records: Iterable[FieldIdRecord], schema_id: int = 0) -> Schema:
    """The pyiceberg Schema of column records (deleted ones included: old data files still hold them)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    tree = _Tree(records)
    fields = [
        NestedField(r.field_id, r.path.rsplit(".", 1)[-1], _iceberg_type(tree, r), required=False) for r in tree.top()
    ]
    return Schema(*fields, schema_id=schema_id)


def _iceberg_type(tree: _Tree, record: FieldIdRecord) -> IcebergType:
    from pyiceberg import types as t

    sig = record.signature
    kids = tree.kids(record)
    if sig == "struct":
        return t.StructType(
            *(
                t.NestedField(k.field_id, k.path.rsplit(".", 1)[-1], _iceberg_type(tree, k), required=False)
                for k in kids
            )
        )
    if sig == "list":
        [element] = kids
        return t.ListType(element.field_id, _iceberg_type(tree, element), element_required=False)
    if sig == "map":
        by_name = {k.path.rsplit(".", 1)[-1]: k for k in kids}
        key, value = by_name["key"], by_name["value"]
        return t.MapType(
            key.field_id, _iceberg_type(tree, key), value.field_id, _iceberg_type(tree, value), value_required=False
        )
    primitives: Mapping[str, IcebergType] = {
        "int": t.IntegerType(),
        "long": t.LongType(),
        "float": t.FloatType(),
        "double": t.DoubleType(),
        "boolean": t.BooleanType(),
        "string": t.StringType(),
        "binary": t.BinaryType(),
        "timestamptz": t.TimestamptzType(),
        "decimal(20,0)": t.DecimalType(20, 0),
    }
    return primitives[sig]


def arrow_schema(records: Iterable[FieldIdRecord]) -> pa.Schema:
    """The Arrow schema of decoded rows for these columns (what the Spark workers hand back)."""
    import pyarrow as pa

    tree = _Tree(records)
    return pa.schema([pa.field(r.path, _arrow_type(tree, r)) for r in tree.top()])


def _arrow_type(tree: _Tree, record: FieldIdRecord) -> pa.DataType:
    import pyarrow as pa

    sig = record.signature
    kids = tree.kids(record)
    if sig == "struct":
        return pa.struct([pa.field(k.path.rsplit(".", 1)[-1], _arrow_type(tree, k)) for k in kids])
    if sig == "list":
        return pa.list_(pa.field("element", _arrow_type(tree, kids[0])))
    if sig == "map":
        by_name = {k.path.rsplit(".", 1)[-1]: k for k in kids}
        return pa.map_(_arrow_type(tree, by_name["key"]), _arrow_type(tree, by_name["value"]))
    primitives = {
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "decimal(20,0)": pa.decimal128(20, 0),
    }
    return primitives[sig]


def spark_ddl(records: Iterable[FieldIdRecord]) -> str:
    """The Spark SQL schema (DDL) of these columns, for mapInArrow."""
    tree = _Tree(records)
    return ", ".join(f"`{_leaf(r)}` {_spark_type(tree, r)}" for r in tree.top())


def _leaf(record: FieldIdRecord) -> str:
    return record.path.rsplit(".", 1)[-1].replace("`", "``")


def _spark_type(tree: _Tree, record: FieldIdRecord) -> str:
    sig = record.signature
    kids = tree.kids(record)
    if sig == "struct":
        return "STRUCT<" + ", ".join(f"`{_leaf(k)}`: {_spark_type(tree, k)}" for k in kids) + ">"
    if sig == "list":
        return f"ARRAY<{_spark_type(tree, kids[0])}>"
    if sig == "map":
        by_name = {k.path.rsplit(".", 1)[-1]: k for k in kids}
        return f"MAP<{_spark_type(tree, by_name['key'])}, {_spark_type(tree, by_name['value'])}>"
    return {
        "int": "INT",
        "long": "BIGINT",
        "float": "FLOAT",
        "double": "DOUBLE",
        "boolean": "BOOLEAN",
        "string": "STRING",
        "binary": "BINARY",
        "timestamptz": "TIMESTAMP",
        "decimal(20,0)": "DECIMAL(20,0)",
    }[sig]


def records_from_schema(schema: Schema) -> list[FieldIdRecord]:
    """Column records of an existing table's pyiceberg schema (adopted when the store has none)."""
    from pyiceberg import types as t

    records: list[FieldIdRecord] = []

    def signature(kind: IcebergType) -> str:
        if isinstance(kind, t.StructType):
            return "struct"
        if isinstance(kind, t.ListType):
            return "list"
        if isinstance(kind, t.MapType):
            return "map"
        if isinstance(kind, t.DecimalType):
            return f"decimal({kind.precision},{kind.scale})"
        return str(kind)

    def visit(path: str, field_id: int, kind: IcebergType) -> None:
        records.append(FieldIdRecord(path, field_id, signature(kind)))
        if isinstance(kind, t.StructType):
            for f in kind.fields:
                visit(f"{path}.{f.name}", f.field_id, f.field_type)
        elif isinstance(kind, t.ListType):
            visit(f"{path}.element", kind.element_id, kind.element_type)
        elif isinstance(kind, t.MapType):
            visit(f"{path}.key", kind.key_id, kind.key_type)
            visit(f"{path}.value", kind.value_id, kind.value_type)

    for f in schema.fields:
        visit(f.name, f.field_id, f.field_type)
    return records


def column_tree(records: Iterable[FieldIdRecord], path: str) -> Column:
    """The current (non-deleted) column at `path` with its children, as the decoders fill it."""
    tree = _Tree(r for r in records if not r.deleted)

    def build(record: FieldIdRecord) -> Column:
        return Column(record.path.rsplit(".", 1)[-1], record.signature, tuple(build(k) for k in tree.kids(record)))

    return build(tree.by_path[path])
