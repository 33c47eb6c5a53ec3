"""Avro schema → Iceberg column tree (engine-free: walks the schema's JSON, needs no Avro library).

The mapping: a record → struct (one child per field, in field order); array → list; map → map<string, V>;
enum → string (the symbol); fixed and bytes → binary; `["null", T]` in either order → an optional T (every
column is nullable); any other union → a struct with one child per non-null branch, named by the branch's type
("int", "string", "array", the short name of a named type). Logical types: date → date; time-millis /
time-micros → long (microseconds since midnight, as Spark has no time type); timestamp-millis / -micros →
timestamptz; local-timestamp-millis / -micros → timestamp; decimal → decimal(P,S) (P <= 38); uuid (on a string
or a 16-byte fixed) → string; any other logical type → its underlying type. A record that contains itself becomes a
string column (the value as JSON) where it recurs, so the table stays finite, as Protobuf's recursive messages do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from icelog.table.field_ids import Column

PRIMITIVES = {
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
    "null": "string",  # a value that is always null still needs a type; string is the most forgiving
}
NAMED = ("record", "error", "enum", "fixed")
MAX_DECIMAL_PRECISION = 38
UUID_BYTES = 16
RECURSION = "string"  # the signature of a column cut at a recursive record (the value as JSON text)


@dataclass(frozen=True)
class Node:
    """One Avro schema node with its named types resolved: `kind` is the Avro type ("record", "array", "int",
    ...; "union" for a list), `schema` the node's JSON (a definition for a named type), `namespace` the
    namespace its short names resolve in."""

    kind: str
    schema: object
    namespace: str
    fullname: str = ""


def full_name(name: str, namespace: str) -> str:
    """A named type's full name (Avro: a name with a dot is already full; otherwise it takes the namespace)."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def short_name(fullname: str) -> str:
    return fullname.rsplit(".", 1)[-1]


class AvroTypes:
    """The named types of one Avro document, learnt as the walk meets their definitions, and the mapping."""

    def __init__(self, named: Mapping[str, object] | None = None) -> None:
        self.named: dict[str, object] = dict(named or {})

    def resolve(self, schema: object, namespace: str) -> Node:
        """The node `schema` stands for: a name is looked up, a definition is learnt."""
        if isinstance(schema, list):
            return Node("union", schema, namespace)
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return Node(schema, schema, namespace)
            name = full_name(schema, namespace)
            definition = self.named.get(name, self.named.get(schema))
            if definition is None:
                raise ValueError(f"unknown Avro type {schema!r}")
            return self._named_node(definition, namespace)
        if isinstance(schema, dict):
            kind = schema.get("type")
            if isinstance(kind, str) and kind in NAMED:
                return self._named_node(schema, namespace)
            if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in PRIMITIVES and kind
                                                  not in ("array", "map")):
                return self.resolve(kind, namespace)  # {"type": "com.acme.Address"} or {"type": {...}}
            return Node(str(kind), schema, namespace)
        raise ValueError(f"not an Avro schema: {schema!r}")

    def _named_node(self, definition: object, namespace: str) -> Node:
        if not isinstance(definition, dict) or not isinstance(definition.get("name"), str):
            raise ValueError(f"not an Avro named type: {definition!r}")
        ns = definition.get("namespace")
        own_namespace = ns if isinstance(ns, str) else namespace
        fullname = full_name(definition["name"], own_namespace)
        self.named.setdefault(fullname, definition)
        inner_namespace = fullname.rsplit(".", 1)[0] if "." in fullname else ""
        kind = "record" if definition["type"] == "error" else str(definition["type"])
        return Node(kind, definition, inner_namespace, fullname)

    def branches(self, node: Node) -> tuple[list[Node], bool]:
        """A union's non-null branches, and whether it has a null branch."""
        assert isinstance(node.schema, list)
        resolved = [self.resolve(b, node.namespace) for b in node.schema]
        return [b for b in resolved if b.kind != "null"], len(resolved) > len([b for b in resolved if b.kind != "null"])

    def branch_name(self, node: Node) -> str:
        """A union branch's child name: the short name of a named type, else the Avro type ("int", "map")."""
        return short_name(node.fullname) if node.fullname else node.kind

    def column(self, schema: object, name: str, namespace: str = "", stack: tuple[str, ...] = ()) -> Column:
        """The column of one Avro schema node (`stack`: the records being expanded, to cut recursion)."""
        node = self.resolve(schema, namespace)
        return self.node_column(node, name, stack)

    def node_column(self, node: Node, name: str, stack: tuple[str, ...] = ()) -> Column:
        if node.kind == "union":
            present, _ = self.branches(node)
            if not present:
                return Column(name, PRIMITIVES["null"])
            if len(present) == 1:
                return self.node_column(present[0], name, stack)
            children = tuple(self.node_column(b, self.branch_name(b), stack) for b in present)
            return Column(name, "struct", children)
        if node.kind == "record":
            if node.fullname in stack:
                return Column(name, RECURSION)
            assert isinstance(node.schema, dict)
            inner = (*stack, node.fullname)
            fields = node.schema.get("fields") or []
            return Column(name, "struct", tuple(
                self.column(f["type"], f["name"], node.namespace, inner) for f in fields
            ))
        if node.kind == "array":
            assert isinstance(node.schema, dict)
            return Column(name, "list", (self.column(node.schema["items"], "element", node.namespace, stack),))
        if node.kind == "map":
            assert isinstance(node.schema, dict)
            value = self.column(node.schema["values"], "value", node.namespace, stack)
            return Column(name, "map", (Column("key", "string"), value))
        return Column(name, leaf_signature(node))


def leaf_signature(node: Node) -> str:
    """The Iceberg type of a primitive, enum or fixed node, its logical type applied."""
    kind = node.kind
    logical = node.schema.get("logicalType") if isinstance(node.schema, dict) else None
    if logical == "date" and kind == "int":
        return "date"
    if (logical, kind) in (("time-millis", "int"), ("time-micros", "long")):
        return "long"
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return "timestamptz"
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return "timestamp"
    if logical == "uuid" and (kind == "string" or (kind == "fixed" and _size(node.schema) == UUID_BYTES)):
        return "string"
    if logical == "decimal" and kind in ("bytes", "fixed"):
        decimal = decimal_of(node.schema)
        if decimal is not None:
            return f"decimal({decimal[0]},{decimal[1]})"
    if kind == "enum":
        return "string"
    if kind == "fixed":
        return "binary"
    if kind in PRIMITIVES:
        return PRIMITIVES[kind]
    raise ValueError(f"unknown Avro type {kind!r}")


def _size(schema: object) -> object:
    return schema.get("size") if isinstance(schema, dict) else None


def decimal_of(schema: object) -> tuple[int, int] | None:
    """(precision, scale) of a decimal logical type Iceberg can hold, else None (the column stays binary)."""
    if not isinstance(schema, dict):
        return None
    precision, scale = schema.get("precision"), schema.get("scale", 0)
    if not isinstance(precision, int) or not isinstance(scale, int) or isinstance(precision, bool):
        return None
    if not 0 < precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        return None
    return precision, scale


def avro_columns(document: object, root: str) -> tuple[Column, ...]:
    """The columns of an Avro schema: one per field of a top-level record, else one column named `root`."""
    types = AvroTypes()
    node = types.resolve(document, "")
    if node.kind == "record":
        column = types.node_column(node, root)
        return column.children
    return (types.node_column(node, root),)
