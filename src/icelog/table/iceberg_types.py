"""The archive table's column tree (a side's schema fields plus the archive's own columns), and column records →
pyiceberg / Arrow / Spark types.

Pure functions: no registry, no catalog, no Spark. Each schema type maps its fields to `Column`s in its own
module: protobuf_types.py, avro_types.py, json_types.py; here a side is only a tuple of columns.
Primitive signatures: int, long, float, double, boolean, string, binary, date, timestamptz, timestamp (no
zone) and decimal(P,S); containers: struct, list, map. Every column is optional: Iceberg can only add
optional columns, and absence is null.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

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

# Column names the archive adds next to a message's fields (Bufstream's).
PREFIX, ERR, RAW = "__prefix__", "__err__", "__raw__"


Fields = tuple[Column, ...] | None  # a side's schema fields as columns (None: the side has no schema)


_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


def decimal_of(signature: str) -> tuple[int, int] | None:
    """(precision, scale) of a decimal(P,S) signature, else None."""
    match = _DECIMAL.match(signature)
    return None if match is None else (int(match[1]), int(match[2]))


def side_column(side: str, fields: Fields) -> Column:
    """The `key` or `value` struct: the schema's fields plus __prefix__ and __err__, and always __raw__."""
    extra: tuple[Column, ...] = ()
    if fields is not None:
        extra = (*fields, Column(PREFIX, "binary"), Column(ERR, "string"))
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


def table_columns(key: Fields, value: Fields) -> tuple[Column, ...]:
    """Every column of an archive table whose key and/or value has a schema."""
    return (side_column("key", key), side_column("value", value), *FIXED_COLUMNS)


_HEADER_ELEMENT = Column("element", "struct", (Column("key", "string"), Column("value", "binary")))


def table_layout_columns(key: Fields, value: Fields) -> tuple[Column, ...]:
    """Every column of a `table` layout table (Fluss's): the schemas' fields, then the layout's own columns.

    The key's fields come first when it has a schema (its bytes always stay in __key: Kafka keys are compared
    byte for byte); the value's __value / __value_prefix / __value_err play the record layout's
    __raw__ / __prefix__ / __err__ roles. Names must not clash (table_schema.check_table_names).
    """
    columns: list[Column] = []
    if key is not None:
        columns += key
    if value is not None:
        columns += value
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
    decimal = decimal_of(sig)
    if decimal is not None:
        return t.DecimalType(*decimal)
    primitives: Mapping[str, IcebergType] = {
        "int": t.IntegerType(),
        "long": t.LongType(),
        "float": t.FloatType(),
        "double": t.DoubleType(),
        "boolean": t.BooleanType(),
        "string": t.StringType(),
        "binary": t.BinaryType(),
        "date": t.DateType(),
        "timestamptz": t.TimestamptzType(),
        "timestamp": t.TimestampType(),
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
    decimal = decimal_of(sig)
    if decimal is not None:
        return pa.decimal128(*decimal)
    primitives: dict[str, pa.DataType] = {
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "timestamp": pa.timestamp("us"),
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
    if decimal_of(sig) is not None:
        return sig.upper()
    return {
        "int": "INT",
        "long": "BIGINT",
        "float": "FLOAT",
        "double": "DOUBLE",
        "boolean": "BOOLEAN",
        "string": "STRING",
        "binary": "BINARY",
        "date": "DATE",
        "timestamptz": "TIMESTAMP",
        "timestamp": "TIMESTAMP_NTZ",
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
