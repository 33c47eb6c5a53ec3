"""JSON Schema documents → Iceberg column trees (pure: no jsonschema, no engine).

The mapping (docs, "JSON Schema type mapping"):
  object with `properties` → struct, one column per declared property in `properties` order; an object that
  allows undeclared properties (`additionalProperties` absent, true or a schema; `patternProperties`) also gets
  `__extra__` (string): the undeclared properties as a JSON object text, so open content is kept, never dropped;
  `additionalProperties: {schema}` without `properties` → map<string, T>;
  array with `items: {schema}` → list<T> (no `items` → list<string>, each element as JSON text);
  `"type": [T, "null"]`, `oneOf` / `anyOf` [T, {"type": "null"}] → optional T (every column is optional);
  string → string, with `format: date-time` → timestamptz, `format: date` → date (other formats: string);
  integer → long; number (or [integer, number]) → double; boolean → boolean;
  an enum or const of strings → string, of integers → long, of numbers → double, of booleans → boolean;
  other unions, tuple arrays, untyped schemas (`{}`, `true`), `allOf` of several schemas, a `$ref` that does
  not resolve, and recursive `$ref`s (or nesting deeper than MAX_DEPTH) → string: the value as JSON text.
A top-level object gives its columns; any other top-level schema gives one column named `root`.
`$ref`s are followed into `references` (reference name → parsed document, optionally `name#/pointer`) and
into the document itself (`#/definitions/...`, `#/$defs/...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from icelog.table.field_ids import Column

EXTRA = "__extra__"  # an open object's undeclared properties, as a JSON object text
MAX_DEPTH = 32  # nested objects/arrays kept as columns; deeper values become JSON text

_OBJECT_KEYWORDS = ("properties", "additionalProperties", "patternProperties", "required")
_SCALARS = {"integer": "long", "number": "double", "boolean": "boolean"}
_FORMATS = {"date-time": "timestamptz", "date": "date"}


@dataclass(frozen=True)
class JSONLayout:
    """The columns of a schema, whether they are a top-level object's properties, and its JSON-text columns.

    json_text: paths (column names from the side's struct: ("address", "__extra__"), ("tags", "element"))
    of the "string" columns that hold a value as JSON text rather than a JSON string.
    """

    columns: tuple[Column, ...]
    is_record: bool
    json_text: frozenset[tuple[str, ...]]


def json_columns(document: object, references: Mapping[str, object], root: str) -> tuple[Column, ...]:
    """The columns of a JSON schema: a top-level object → its properties; anything else → one column `root`."""
    return json_layout(document, references, root).columns


def json_layout(document: object, references: Mapping[str, object], root: str) -> JSONLayout:
    """json_columns with what a decoder needs besides: is the top an object, which columns are JSON text."""
    mapper = _Mapper(references)
    top = mapper.resolve(_Node(document, document, ""))
    if mapper.is_object(top):
        children = mapper.object_children(top, (), (top.ref,) if top.ref else ())
        if children is not None:
            return JSONLayout(children, True, frozenset(mapper.json_text))
    column = mapper.column(top, root, (root,), ())
    return JSONLayout((column,), False, frozenset(mapper.json_text))


@dataclass(frozen=True)
class _Node:
    """A subschema, the document it lives in (for local `#/...` refs) and the ref that led there ("" at the top)."""

    schema: object
    document: object
    ref: str


class _Mapper:
    def __init__(self, references: Mapping[str, object]) -> None:
        self.references = references
        self.json_text: set[tuple[str, ...]] = set()

    def resolve(self, node: _Node, seen: tuple[str, ...] = ()) -> _Node:
        """Follow `$ref`s; a ref that does not resolve, or one already being expanded, gives schema None."""
        hops = 0
        while isinstance(node.schema, dict) and isinstance(node.schema.get("$ref"), str):
            ref = node.schema["$ref"]
            target = self._lookup(ref, node.document)
            if target is None or hops > 100:
                return _Node(None, node.document, ref)
            key = _key(ref, target[1])
            if key in seen:
                return _Node(None, node.document, key)  # recursion: the caller keeps it as JSON text
            node, hops = _Node(target[0], target[1], key), hops + 1
        return node

    def _lookup(self, ref: str, document: object) -> tuple[object, object] | None:
        name, _, pointer = ref.partition("#")
        target = document if not name else self.references.get(name)
        if target is None:
            for reference in self.references.values():  # a reference known by its $id rather than its name
                if isinstance(reference, dict) and str(reference.get("$id", "")).split("#")[0] == name:
                    target = reference
                    break
            else:
                return None
        found = _pointer(target, pointer)
        return None if found is _MISSING else (found, target)

    def is_object(self, node: _Node) -> bool:
        """Whether a (resolved) node is an object schema, nullable or not."""
        schema = node.schema
        if not isinstance(schema, dict):
            return False
        declared = _non_null_types(schema)
        if declared is not None:
            return declared == ["object"]
        branch = self._nullable_branch(schema, (), node.document)
        if branch is not None:
            return self.is_object(branch)
        return any(k in schema for k in _OBJECT_KEYWORDS) and not any(k in schema for k in ("anyOf", "oneOf"))

    def column(self, node: _Node, name: str, path: tuple[str, ...], seen: tuple[str, ...]) -> Column:
        """The column of one schema node."""
        if node.ref:
            seen = (*seen, node.ref)
        schema = node.schema
        if not isinstance(schema, dict) or len(seen) > MAX_DEPTH or len(path) > MAX_DEPTH:
            return self._as_json(name, path)
        branch = self._nullable_branch(schema, seen, node.document)
        if branch is not None:
            return self.column(branch, name, path, seen)
        if "enum" in schema or "const" in schema:
            return self._enum(schema, name, path)
        declared = _non_null_types(schema)
        if declared is None:
            declared = self._inferred_type(schema)
        if declared == ["integer", "number"] or declared == ["number", "integer"]:
            declared = ["number"]
        if declared is None or len(declared) != 1:
            return self._as_json(name, path)
        kind = declared[0]
        if kind == "object":
            return self._object(node, name, path, seen)
        if kind == "array":
            return self._array(node, name, path, seen)
        if kind == "string":
            format_ = schema.get("format")
            return Column(name, _FORMATS.get(format_, "string") if isinstance(format_, str) else "string")
        if kind in _SCALARS:
            return Column(name, _SCALARS[kind])
        return self._as_json(name, path)  # "null" alone

    def object_children(self, node: _Node, path: tuple[str, ...], seen: tuple[str, ...]) -> tuple[Column, ...] | None:
        """An object's columns (its properties, and __extra__ when open); None when it is a map or has none."""
        schema = node.schema
        branch = self._nullable_branch(schema, seen, node.document) if isinstance(schema, dict) else None
        if branch is not None:
            return self.object_children(branch, path, seen)
        assert isinstance(schema, dict)
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        additional = schema.get("additionalProperties", True)
        if not properties and isinstance(additional, dict) and additional:
            return None  # a map
        children = [
            self.column(self.resolve(_Node(sub, node.document, ""), seen), prop, (*path, prop), seen)
            for prop, sub in properties.items()
        ]
        if additional is not False or schema.get("patternProperties"):
            self.json_text.add((*path, EXTRA))
            children.append(Column(EXTRA, "string"))
        return tuple(children) or None

    def _object(self, node: _Node, name: str, path: tuple[str, ...], seen: tuple[str, ...]) -> Column:
        children = self.object_children(node, path, seen)
        if children is not None:
            return Column(name, "struct", children)
        assert isinstance(node.schema, dict)
        additional = node.schema.get("additionalProperties")
        if isinstance(additional, dict) and additional:
            value = self.column(
                self.resolve(_Node(additional, node.document, ""), seen), "value", (*path, "value"), seen
            )
            return Column(name, "map", (Column("key", "string"), value))
        return self._as_json(name, path)  # a closed object without properties: always {}

    def _array(self, node: _Node, name: str, path: tuple[str, ...], seen: tuple[str, ...]) -> Column:
        assert isinstance(node.schema, dict)
        items = node.schema.get("items", True)
        if isinstance(items, list) or "prefixItems" in node.schema:
            return self._as_json(name, path)  # a tuple: positions of different types
        element_path = (*path, "element")
        element = self.column(self.resolve(_Node(items, node.document, ""), seen), "element", element_path, seen)
        return Column(name, "list", (element,))

    def _enum(self, schema: dict[str, object], name: str, path: tuple[str, ...]) -> Column:
        values = schema["enum"] if "enum" in schema else [schema.get("const")]
        values = [v for v in values if v is not None] if isinstance(values, list) else []
        if values and all(isinstance(v, str) for v in values):
            return Column(name, "string")
        if values and all(isinstance(v, bool) for v in values):
            return Column(name, "boolean")
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return Column(name, "long")
        if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return Column(name, "double")
        return self._as_json(name, path)

    def _nullable_branch(self, schema: object, seen: tuple[str, ...], document: object = None) -> _Node | None:
        """The T of `oneOf` / `anyOf` [T, {"type": "null"}] (either order), resolved; else None."""
        if not isinstance(schema, dict):
            return None
        for key in ("oneOf", "anyOf", "allOf"):
            branches = schema.get(key)
            if not isinstance(branches, list):
                continue
            resolved = [self.resolve(_Node(b, document, ""), seen) for b in branches]
            kept = [b for b in resolved if not _is_null(b.schema)]
            if len(kept) == 1 and (key != "allOf" or len(resolved) == 1):
                return kept[0] if kept[0].schema is not None else None
        return None

    def _inferred_type(self, schema: dict[str, object]) -> list[str] | None:
        if any(k in schema for k in _OBJECT_KEYWORDS):
            return ["object"]
        if "items" in schema or "prefixItems" in schema:
            return ["array"]
        return None

    def _as_json(self, name: str, path: tuple[str, ...]) -> Column:
        self.json_text.add(path)
        return Column(name, "string")


_MISSING = object()


def _key(ref: str, document: object) -> str:
    return f"{id(document)}{ref[ref.find('#') :] if '#' in ref else '#'}"


def _pointer(document: object, pointer: str) -> object:
    """The value at a JSON pointer ("" or "/definitions/a"), or _MISSING."""
    node = document
    for raw in unquote(pointer).split("/")[1:] if pointer else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _non_null_types(schema: dict[str, object]) -> list[str] | None:
    """The declared `type`s without "null" (None when `type` is absent; ["null"] for a null-only schema)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        types = [t for t in declared if isinstance(t, str) and t != "null"]
        return types or ["null"]
    return None


def _is_null(schema: object) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"
