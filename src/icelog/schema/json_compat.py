"""Confluent's JSON Schema compatibility rules: what changed between two schemas, and which changes break readers.

`compare(original, update)` walks two schemas side by side, as Confluent's `SchemaDiff.compare` does, and
records each difference as (Difference.Type name, JSON path such as "#/properties/name"). A change is
compatible when data valid under `original` stays valid under `update`; the names and the set of compatible
types are Confluent's (io.confluent.kafka.schemaregistry.json.diff.Difference / SchemaDiff.COMPATIBLE_CHANGES),
so a schema Confluent's registry accepts, icelog accepts, and the messages name the same difference types.

The heart of the rules is the content model of an object (and likewise of an array's items):
  - OPEN: no `additionalProperties` (or `true`) and no `patternProperties` — any undeclared property may hold
    any value. Adding a property to an open original is INCOMPATIBLE (PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL:
    old data may already hold that name with another type) unless its schema is empty (`{}` / `true`:
    PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL). Removing a property while the update stays open
    is compatible (PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL).
  - CLOSED: `additionalProperties: false` — adding an optional property is compatible
    (OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL), adding a required one without a default is not
    (REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL); removing a property is INCOMPATIBLE
    (PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL) unless its schema was `false`.
  - PARTIALLY OPEN: `additionalProperties: {schema}` or `patternProperties` — an added / removed property is
    compatible when the schema the other side gives undeclared properties of that name covers it
    (PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL, ..._NOT_COVERED_... otherwise).
Other rules: a type may widen (integer → number: TYPE_EXTENDED) but not narrow (TYPE_NARROWED) or change
(TYPE_CHANGED); `T` → `anyOf/oneOf [T, ...]` is SUM_TYPE_EXTENDED (so making a field nullable is compatible,
the reverse is not); bounds (maxLength, maximum, maxItems, maxProperties, ...) may loosen, not tighten;
`required` may lose a name, not gain one without a default (REQUIRED_ATTRIBUTE_ADDED); enums may gain values,
not lose them (ENUM_ARRAY_NARROWED); closing `additionalProperties` is ADDITIONAL_PROPERTIES_REMOVED; combined
schemas (allOf/anyOf/oneOf) match their branches pairwise (COMBINED_TYPE_SUBSCHEMAS_CHANGED when no pairing
covers them). Titles, descriptions, ids and defaults are free.

Deliberate differences from Confluent: `additionalProperties: {}` counts as `true` (they mean the same);
`unevaluatedProperties` / `unevaluatedItems` and reserved-property metadata are not compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import referencing.exceptions

if TYPE_CHECKING:
    from referencing._core import Resolver  # the type of Registry.resolver(); referencing exports no alias

COMPATIBLE_CHANGES = frozenset(
    {
        "ID_CHANGED", "DESCRIPTION_CHANGED", "TITLE_CHANGED", "DEFAULT_CHANGED", "SCHEMA_REMOVED", "TYPE_EXTENDED",
        "MAX_LENGTH_INCREASED", "MAX_LENGTH_REMOVED", "MIN_LENGTH_DECREASED", "MIN_LENGTH_REMOVED", "PATTERN_REMOVED",
        "MAXIMUM_INCREASED", "MAXIMUM_REMOVED", "MINIMUM_DECREASED", "MINIMUM_REMOVED",
        "EXCLUSIVE_MAXIMUM_INCREASED", "EXCLUSIVE_MAXIMUM_REMOVED", "EXCLUSIVE_MINIMUM_DECREASED",
        "EXCLUSIVE_MINIMUM_REMOVED", "MULTIPLE_OF_REDUCED", "MULTIPLE_OF_REMOVED",
        "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED", "REQUIRED_ATTRIBUTE_REMOVED", "DEPENDENCY_ARRAY_NARROWED",
        "DEPENDENCY_ARRAY_REMOVED", "DEPENDENCY_SCHEMA_REMOVED", "MAX_PROPERTIES_INCREASED", "MAX_PROPERTIES_REMOVED",
        "MIN_PROPERTIES_DECREASED", "MIN_PROPERTIES_REMOVED", "ADDITIONAL_PROPERTIES_ADDED",
        "ADDITIONAL_PROPERTIES_EXTENDED", "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
        "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
        "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "MAX_ITEMS_INCREASED", "MAX_ITEMS_REMOVED", "MIN_ITEMS_DECREASED", "MIN_ITEMS_REMOVED", "UNIQUE_ITEMS_REMOVED",
        "MAX_CONTAINS_INCREASED", "MAX_CONTAINS_REMOVED", "MIN_CONTAINS_DECREASED", "MIN_CONTAINS_REMOVED",
        "ADDITIONAL_ITEMS_ADDED", "ADDITIONAL_ITEMS_EXTENDED", "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
        "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL", "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL",
        "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL", "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "ENUM_ARRAY_EXTENDED", "COMBINED_TYPE_EXTENDED", "PRODUCT_TYPE_NARROWED", "SUM_TYPE_EXTENDED",
        "NOT_TYPE_NARROWED",
    }
)  # fmt: skip

# What an incompatible difference means for a user, for the messages.
_EXPLAINED = {
    "TYPE_CHANGED": "the type changed",
    "TYPE_NARROWED": "the type narrowed (number → integer)",
    "SCHEMA_ADDED": "a schema was added where any value was allowed",
    "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL": "a property was added to an open content model (old data may hold "
    "that name with any value; close the model with additionalProperties: false, or give it an empty schema)",
    "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL": "a property was removed from a closed content model",
    "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL": "a property was added that the old "
    "additionalProperties/patternProperties schema does not cover",
    "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL": "a property was removed that the new "
    "additionalProperties/patternProperties schema does not cover",
    "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL": "a required property without a default was added",
    "REQUIRED_ATTRIBUTE_ADDED": "a property became required without a default",
    "ADDITIONAL_PROPERTIES_REMOVED": "additional properties are no longer allowed",
    "ADDITIONAL_PROPERTIES_NARROWED": "additional properties are now restricted by a schema",
    "ENUM_ARRAY_NARROWED": "enum values were removed",
    "ENUM_ARRAY_CHANGED": "enum values changed",
    "SUM_TYPE_NARROWED": "a branch of anyOf/oneOf was removed",
    "COMBINED_TYPE_SUBSCHEMAS_CHANGED": "the branches of allOf/anyOf/oneOf changed incompatibly",
    "COMBINED_TYPE_CHANGED": "the combination (allOf/anyOf/oneOf) changed",
}


@dataclass(frozen=True)
class SchemaNode:
    """A subschema and the resolver its `$ref`s resolve with."""

    contents: object
    resolver: Resolver[object]


def compare(original: SchemaNode, update: SchemaNode) -> list[str]:
    """The incompatible differences from `original` (data written with it) to `update` (its reader), as messages."""
    ctx = _Context(set())
    _compare(ctx, original, update)
    return [
        f"{kind} at {path}" + (f": {_EXPLAINED[kind]}" if kind in _EXPLAINED else "")
        for kind, path in ctx.differences
        if kind not in COMPATIBLE_CHANGES
    ]


@dataclass
class _Context:
    in_progress: set[tuple[int, int]]  # pairs being compared up the stack: a recursive schema's cycle
    path: list[str] = field(default_factory=list)
    differences: list[tuple[str, str]] = field(default_factory=list)

    def sub(self) -> _Context:
        return _Context(self.in_progress, list(self.path))

    @property
    def compatible(self) -> bool:
        return all(kind in COMPATIBLE_CHANGES for kind, _ in self.differences)

    def add(self, kind: str, *segments: str) -> None:
        self.differences.append((kind, "#/" + "/".join([*self.path, *segments])))

    @contextmanager
    def at(self, *segments: str) -> Iterator[None]:
        self.path.extend(segments)
        try:
            yield
        finally:
            del self.path[len(self.path) - len(segments) :]


# --- what kind of schema a node is (everit's model: Object, Array, String, Number, Combined, Enum, ...) -----------

_ANNOTATIONS = frozenset(
    {"$schema", "$id", "id", "title", "description", "default", "examples", "$comment", "definitions", "$defs",
     "readOnly", "writeOnly", "deprecated", "$anchor", "contentMediaType", "contentEncoding"}
)  # fmt: skip
_COMBINERS = ("allOf", "anyOf", "oneOf")
_KEYWORDS_OF = {
    "object": ("properties", "required", "additionalProperties", "patternProperties", "minProperties",
               "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}  # fmt: skip


@dataclass(frozen=True)
class _View:
    kind: str  # false, empty, enum, not, combined, object, array, string, number, boolean, null
    node: SchemaNode
    criterion: str = ""  # combined: allOf / anyOf / oneOf
    subs: tuple[SchemaNode, ...] = ()  # combined: the branches
    integer: bool = False  # number: "type": "integer"


def _resolve(node: SchemaNode) -> SchemaNode:
    seen = 0
    while isinstance(node.contents, dict) and isinstance(node.contents.get("$ref"), str) and seen < 100:
        try:
            resolved = node.resolver.lookup(node.contents["$ref"])
        except referencing.exceptions.Unresolvable:
            return SchemaNode(True, node.resolver)  # compile_json refuses these; compare what remains
        node, seen = SchemaNode(resolved.contents, resolved.resolver), seen + 1
    return node


def _view(node: SchemaNode) -> _View:
    contents = node.contents
    if contents is False:
        return _View("false", node)
    if not isinstance(contents, dict):
        return _View("empty", node)
    assertions = {k: v for k, v in contents.items() if k not in _ANNOTATIONS}
    parts = [SchemaNode({k: assertions[k]}, node.resolver) for k in _COMBINERS if k in assertions]
    for key in ("enum", "const", "not"):
        if key in assertions and len(assertions) > 1:
            parts.append(SchemaNode({key: assertions[key]}, node.resolver))
    if parts:  # a combiner (or enum / not) beside other keywords: everit makes an allOf of the parts
        rest = {k: v for k, v in assertions.items() if k not in (*_COMBINERS, "enum", "const", "not")}
        if rest:
            parts.insert(0, SchemaNode(rest, node.resolver))
        if len(parts) > 1:
            return _View("combined", node, "allOf", tuple(parts))
        only = parts[0].contents
        assert isinstance(only, dict)
        if any(k in only for k in _COMBINERS):
            criterion = next(k for k in _COMBINERS if k in only)
            branches = only[criterion] if isinstance(only[criterion], list) else []
            return _View("combined", node, criterion, tuple(SchemaNode(b, node.resolver) for b in branches))
    if "enum" in assertions or "const" in assertions:
        return _View("enum", node)
    if "not" in assertions:
        return _View("not", node)
    declared = assertions.get("type")
    if isinstance(declared, list):
        types = list(dict.fromkeys(t for t in declared if isinstance(t, str)))
        if len(types) != 1:
            branches = tuple(SchemaNode({**assertions, "type": t}, node.resolver) for t in types)
            return _View("combined", node, "anyOf", branches)
        declared = types[0]
    if isinstance(declared, str):
        if declared == "integer":
            return _View("number", node, integer=True)
        return _View(declared, node)
    for kind, keywords in _KEYWORDS_OF.items():
        if any(k in assertions for k in keywords):
            return _View(kind, node)
    return _View("empty", node)


# --- the walk ------------------------------------------------------------------------------------------------


def _compare(ctx: _Context, original: SchemaNode | None, update: SchemaNode | None) -> None:
    if original is None or update is None:
        if original is not None:
            ctx.add("SCHEMA_REMOVED")
        elif update is not None:
            ctx.add("SCHEMA_ADDED")
        return
    original, update = _resolve(original), _resolve(update)
    pair = (id(original.contents), id(update.contents))
    if pair in ctx.in_progress:
        return  # a recursive schema met itself: the enclosing comparison decides
    ctx.in_progress.add(pair)
    try:
        _compare_views(ctx, _view(original), _view(update))
    finally:
        ctx.in_progress.discard(pair)


def _compare_views(ctx: _Context, old: _View, new: _View) -> None:
    if old.kind != "combined" and new.kind == "combined":
        if len(new.subs) == 1 and _try(ctx, old.node, new.subs[0]):
            return
        if len(new.subs) > 1 and new.criterion in ("anyOf", "oneOf"):
            for branch in new.subs:
                if _try(ctx, old.node, branch):
                    ctx.add("SUM_TYPE_EXTENDED")
                    return
    elif old.kind == "combined" and new.kind != "combined" and len(old.subs) == 1 and _try(ctx, old.subs[0], new.node):
        return
    if old.kind != new.kind:
        if old.kind != "false" and new.kind != "empty":  # false accepts nothing, empty accepts everything
            ctx.add("TYPE_CHANGED")
        return
    old_contents, new_contents = old.node.contents, new.node.contents
    if isinstance(old_contents, dict) and isinstance(new_contents, dict):
        for key, kind in (("$id", "ID"), ("title", "TITLE"), ("description", "DESCRIPTION"), ("default", "DEFAULT")):
            if old_contents.get(key) != new_contents.get(key):
                ctx.add(f"{kind}_CHANGED")
    compare_kind = _BY_KIND.get(old.kind)
    if compare_kind is not None:
        compare_kind(ctx, old, new)


def _try(ctx: _Context, original: SchemaNode, update: SchemaNode) -> bool:
    """Compare in a subcontext; keep its differences only when compatible."""
    sub = ctx.sub()
    _compare(sub, original, update)
    if sub.compatible:
        ctx.differences.extend(sub.differences)
    return sub.compatible


def _get(view: _View, key: str) -> object:
    contents = view.node.contents
    return contents.get(key) if isinstance(contents, dict) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bound(ctx: _Context, old: _View, new: _View, keyword: str, kind: str) -> None:
    """A numeric keyword: <KIND>_ADDED / _REMOVED / _INCREASED / _DECREASED (compatibility per COMPATIBLE_CHANGES)."""
    before, after = _number(_get(old, keyword)), _number(_get(new, keyword))
    if before == after:
        return
    if before is None:
        ctx.add(f"{kind}_ADDED", keyword)
    elif after is None:
        ctx.add(f"{kind}_REMOVED", keyword)
    else:
        ctx.add(f"{kind}_INCREASED" if before < after else f"{kind}_DECREASED", keyword)


def _string(ctx: _Context, old: _View, new: _View) -> None:
    _bound(ctx, old, new, "maxLength", "MAX_LENGTH")
    _bound(ctx, old, new, "minLength", "MIN_LENGTH")
    before, after = _get(old, "pattern"), _get(new, "pattern")
    if before is None and after is not None:
        ctx.add("PATTERN_ADDED", "pattern")
    elif before is not None and after is None:
        ctx.add("PATTERN_REMOVED", "pattern")
    elif before != after:
        ctx.add("PATTERN_CHANGED", "pattern")


def _numeric(ctx: _Context, old: _View, new: _View) -> None:
    _bound(ctx, old, new, "maximum", "MAXIMUM")
    _bound(ctx, old, new, "minimum", "MINIMUM")
    _bound(ctx, old, new, "exclusiveMaximum", "EXCLUSIVE_MAXIMUM")
    _bound(ctx, old, new, "exclusiveMinimum", "EXCLUSIVE_MINIMUM")
    before, after = _number(_get(old, "multipleOf")), _number(_get(new, "multipleOf"))
    if before != after:
        if before is None:
            ctx.add("MULTIPLE_OF_ADDED", "multipleOf")
        elif after is None:
            ctx.add("MULTIPLE_OF_REMOVED", "multipleOf")
        elif (after / before).is_integer():
            ctx.add("MULTIPLE_OF_EXPANDED", "multipleOf")
        elif (before / after).is_integer():
            ctx.add("MULTIPLE_OF_REDUCED", "multipleOf")
        else:
            ctx.add("MULTIPLE_OF_CHANGED", "multipleOf")
    if old.integer != new.integer:
        ctx.add("TYPE_EXTENDED" if old.integer else "TYPE_NARROWED")


def _enum_values(view: _View) -> list[str]:
    contents = view.node.contents
    assert isinstance(contents, dict)
    values = contents["enum"] if "enum" in contents else [contents.get("const")]
    return [json.dumps(v, sort_keys=True) for v in (values if isinstance(values, list) else [])]


def _enum(ctx: _Context, old: _View, new: _View) -> None:
    before, after = set(_enum_values(old)), set(_enum_values(new))
    if before == after:
        return
    if after >= before:
        ctx.add("ENUM_ARRAY_EXTENDED", "enum")
    elif before >= after:
        ctx.add("ENUM_ARRAY_NARROWED", "enum")
    else:
        ctx.add("ENUM_ARRAY_CHANGED", "enum")


def _not(ctx: _Context, old: _View, new: _View) -> None:
    with ctx.at("not"):
        sub = ctx.sub()  # what the update forbids must have been forbidden before: compare reversed
        _compare(sub, SchemaNode(_get(new, "not"), new.node.resolver), SchemaNode(_get(old, "not"), old.node.resolver))
        ctx.add("NOT_TYPE_NARROWED" if sub.compatible else "NOT_TYPE_EXTENDED")


# --- combined schemas (allOf / anyOf / oneOf) ---------------------------------------------------------------


def _combined(ctx: _Context, old: _View, new: _View) -> None:
    if old.criterion != new.criterion:
        if (
            new.criterion == "anyOf"
            or (new.criterion == "oneOf" and len(old.subs) == 1)
            or (new.criterion == "allOf" and len(old.subs) == 1 and len(new.subs) == 1)
        ):
            ctx.add("COMBINED_TYPE_EXTENDED")
        else:
            ctx.add("COMBINED_TYPE_CHANGED")
            return
    before, after = _distinct(old.subs), _distinct(new.subs)
    if len(before) != len(after):
        grew = len(before) < len(after)
        product = new.criterion == "allOf"
        ctx.add(("PRODUCT_TYPE_" if product else "SUM_TYPE_") + ("EXTENDED" if grew else "NARROWED"))
    edges: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for i, branch in enumerate(before):
        with ctx.at(f"{old.criterion}/{i}"):
            for j, other in enumerate(after):
                sub = ctx.sub()
                _compare(sub, branch, other)
                if sub.compatible:
                    edges[(i, j)] = sub.differences
    matching = _maximum_matching(len(before), len(after), edges)
    for edge in matching:
        ctx.differences.extend(edges[edge])
    if len(matching) < min(len(before), len(after)):
        ctx.add("COMBINED_TYPE_SUBSCHEMAS_CHANGED")


def _distinct(branches: Sequence[SchemaNode]) -> list[SchemaNode]:
    seen: dict[str, SchemaNode] = {}
    for branch in branches:
        seen.setdefault(json.dumps(branch.contents, sort_keys=True, default=str), branch)
    return list(seen.values())


def _maximum_matching(
    left: int, right: int, edges: dict[tuple[int, int], list[tuple[str, str]]]
) -> list[tuple[int, int]]:
    """A maximum bipartite matching of compatible branch pairs (Kuhn's augmenting paths; branch lists are short)."""
    match_of_right: dict[int, int] = {}

    def augment(i: int, visited: set[int]) -> bool:
        for j in range(right):
            if (i, j) in edges and j not in visited:
                visited.add(j)
                if j not in match_of_right or augment(match_of_right[j], visited):
                    match_of_right[j] = i
                    return True
        return False

    for i in range(left):
        augment(i, set())
    return [(i, j) for j, i in match_of_right.items()]


# --- objects ------------------------------------------------------------------------------------------------


def _dict(view: _View, key: str) -> dict[str, object]:
    value = _get(view, key)
    return value if isinstance(value, dict) else {}


def _additional(view: _View) -> tuple[bool, SchemaNode | None]:
    """(additional properties permitted, their schema: None when any value goes)."""
    value = _get(view, "additionalProperties")
    if value is False:
        return False, None
    if isinstance(value, dict) and value:
        return True, SchemaNode(value, view.node.resolver)
    return True, None


def _is_open(view: _View) -> bool:
    permits, schema = _additional(view)
    return permits and schema is None and not _dict(view, "patternProperties")


def _partial(view: _View, name: str) -> SchemaNode | None:
    """The schema a partially open object gives an undeclared property `name` (None: none, or fully open)."""
    for pattern, schema in _dict(view, "patternProperties").items():
        try:
            if re.search(pattern, name):
                return SchemaNode(schema, view.node.resolver)
        except re.error:
            continue
    return _additional(view)[1]


def _required(view: _View) -> set[str]:
    value = _get(view, "required")
    return {v for v in value if isinstance(v, str)} if isinstance(value, list) else set()


def _has_default(view: _View, name: str) -> bool:
    node = _resolve(SchemaNode(_dict(view, "properties").get(name), view.node.resolver))
    return isinstance(node.contents, dict) and "default" in node.contents


def _object(ctx: _Context, old: _View, new: _View) -> None:
    _object_required(ctx, old, new)
    _object_properties(ctx, old, new)
    _object_dependencies(ctx, old, new)
    _object_additional(ctx, old, new)
    _bound(ctx, old, new, "maxProperties", "MAX_PROPERTIES")
    _bound(ctx, old, new, "minProperties", "MIN_PROPERTIES")


def _object_required(ctx: _Context, old: _View, new: _View) -> None:
    before, after = _required(old), _required(new)
    both = [name for name in _dict(old, "properties") if name in _dict(new, "properties")]
    for name in both:
        if name in before and name not in after:
            ctx.add("REQUIRED_ATTRIBUTE_REMOVED", "required", name)
        elif name in after and name not in before:
            kind = "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED" if _has_default(new, name) else "REQUIRED_ATTRIBUTE_ADDED"
            ctx.add(kind, "required", name)


def _object_properties(ctx: _Context, old: _View, new: _View) -> None:
    before, after = _dict(old, "properties"), _dict(new, "properties")
    for name in dict.fromkeys([*before, *after]):
        with ctx.at("properties", name):
            if name not in after:
                _property_removed(ctx, SchemaNode(before[name], old.node.resolver), new, name)
            elif name not in before:
                _property_added(ctx, old, SchemaNode(after[name], new.node.resolver), new, name)
            else:
                _compare(ctx, SchemaNode(before[name], old.node.resolver), SchemaNode(after[name], new.node.resolver))


def _property_removed(ctx: _Context, removed: SchemaNode, new: _View, name: str) -> None:
    # only the update's content model matters: a property can go when the update still accepts it
    if _is_open(new):
        ctx.add("PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL")
        return
    covering = _partial(new, name)
    if covering is not None:
        covered = _try_keep(ctx, removed, covering)
        ctx.add(f"PROPERTY_REMOVED_{'IS' if covered else 'NOT'}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
    elif _resolve(removed).contents is False:
        ctx.add("PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL")
    else:
        ctx.add("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL")


def _property_added(ctx: _Context, old: _View, added: SchemaNode, new: _View, name: str) -> None:
    # only the original's content model matters: old data may hold the new name unless it was closed
    if _is_open(old):
        empty = _view(_resolve(added)).kind == "empty"
        ctx.add(f"PROPERTY_{'WITH_EMPTY_SCHEMA_' if empty else ''}ADDED_TO_OPEN_CONTENT_MODEL")
        return
    covering = _partial(old, name)
    if covering is not None:
        covered = _try_keep(ctx, covering, added)
        ctx.add(f"PROPERTY_ADDED_{'IS' if covered else 'NOT'}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
    if name in _required(new):
        with_default = _has_default(new, name)
        ctx.add(f"REQUIRED_PROPERTY_{'WITH_DEFAULT_' if with_default else ''}ADDED_TO_UNOPEN_CONTENT_MODEL")
    else:
        ctx.add("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL")


def _try_keep(ctx: _Context, original: SchemaNode, update: SchemaNode) -> bool:
    """Compare in a subcontext, keep all its differences, say whether they were compatible."""
    sub = ctx.sub()
    _compare(sub, original, update)
    ctx.differences.extend(sub.differences)
    return sub.compatible


def _dependencies(view: _View) -> tuple[dict[str, set[str]], dict[str, object]]:
    arrays: dict[str, set[str]] = {}
    schemas: dict[str, object] = {}
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        for name, value in _dict(view, key).items():
            if isinstance(value, list):
                arrays[name] = {v for v in value if isinstance(v, str)}
            else:
                schemas[name] = value
    return arrays, schemas


def _object_dependencies(ctx: _Context, old: _View, new: _View) -> None:
    (old_arrays, old_schemas), (new_arrays, new_schemas) = _dependencies(old), _dependencies(new)
    with ctx.at("dependencies"):
        for name in dict.fromkeys([*old_arrays, *new_arrays]):
            before, after = old_arrays.get(name), new_arrays.get(name)
            if after is None:
                ctx.add("DEPENDENCY_ARRAY_REMOVED", name)
            elif before is None:
                ctx.add("DEPENDENCY_ARRAY_ADDED", name)
            elif before != after:
                grew, shrank = after >= before, before >= after
                kind = "EXTENDED" if grew else "NARROWED" if shrank else "CHANGED"
                ctx.add(f"DEPENDENCY_ARRAY_{kind}", name)
        for name in dict.fromkeys([*old_schemas, *new_schemas]):
            if name not in new_schemas:
                ctx.add("DEPENDENCY_SCHEMA_REMOVED", name)
            elif name not in old_schemas:
                ctx.add("DEPENDENCY_SCHEMA_ADDED", name)
            else:
                with ctx.at(name):
                    old_node = SchemaNode(old_schemas[name], old.node.resolver)
                    _compare(ctx, old_node, SchemaNode(new_schemas[name], new.node.resolver))


def _compare_additional(
    ctx: _Context,
    keyword: str,
    difference: str,
    old: tuple[bool, SchemaNode | None],
    new: tuple[bool, SchemaNode | None],
) -> None:
    """additionalProperties / additionalItems: (permitted, schema) pairs, Confluent's <difference>_* types."""
    (old_permits, old_schema), (new_permits, new_schema) = old, new
    with ctx.at(keyword):
        if old_permits != new_permits:
            ctx.add(f"{difference}_ADDED" if new_permits else f"{difference}_REMOVED")
        elif old_schema is None and new_schema is not None:
            ctx.add(f"{difference}_NARROWED")
        elif old_schema is not None and new_schema is None:
            ctx.add(f"{difference}_EXTENDED")
        else:
            _compare(ctx, old_schema, new_schema)


def _object_additional(ctx: _Context, old: _View, new: _View) -> None:
    _compare_additional(ctx, "additionalProperties", "ADDITIONAL_PROPERTIES", _additional(old), _additional(new))


# --- arrays -------------------------------------------------------------------------------------------------


def _items(view: _View) -> tuple[SchemaNode | None, list[SchemaNode], object]:
    """(the schema of every item, the positional item schemas, the additionalItems keyword's value)."""
    resolver = view.node.resolver
    prefix, items = _get(view, "prefixItems"), _get(view, "items")
    if isinstance(prefix, list):  # draft 2020-12: prefixItems + items (the items after them)
        return None, [SchemaNode(s, resolver) for s in prefix], items
    if isinstance(items, list):
        return None, [SchemaNode(s, resolver) for s in items], _get(view, "additionalItems")
    return (SchemaNode(items, resolver) if items is not None else None), [], _get(view, "additionalItems")


def _additional_items(view: _View) -> tuple[bool, SchemaNode | None]:
    value = _items(view)[2]
    if value is False:
        return False, None
    if isinstance(value, dict) and value:
        return True, SchemaNode(value, view.node.resolver)
    return True, None


def _array(ctx: _Context, old: _View, new: _View) -> None:
    old_all, old_items, _ = _items(old)
    new_all, new_items, _ = _items(new)
    with ctx.at("items"):
        _compare(ctx, old_all, new_all)
    _array_positional(ctx, old, old_items, new, new_items)
    _array_additional(ctx, old, new)
    _bound(ctx, old, new, "maxItems", "MAX_ITEMS")
    _bound(ctx, old, new, "minItems", "MIN_ITEMS")
    _bound(ctx, old, new, "maxContains", "MAX_CONTAINS")
    _bound(ctx, old, new, "minContains", "MIN_CONTAINS")
    if bool(_get(old, "uniqueItems")) != bool(_get(new, "uniqueItems")):
        ctx.add("UNIQUE_ITEMS_REMOVED" if _get(old, "uniqueItems") else "UNIQUE_ITEMS_ADDED", "uniqueItems")


def _array_positional(
    ctx: _Context, old: _View, old_items: list[SchemaNode], new: _View, new_items: list[SchemaNode]
) -> None:
    for index in range(max(len(old_items), len(new_items))):
        with ctx.at(f"items/{index}"):
            if index < len(old_items) and index < len(new_items):
                _compare(ctx, old_items[index], new_items[index])
            elif index < len(old_items):
                _item_removed(ctx, old_items[index], new)
            else:
                _item_added(ctx, old, new_items[index])


def _item_removed(ctx: _Context, removed: SchemaNode, new: _View) -> None:
    permits, covering = _additional_items(new)
    if permits and covering is None:
        ctx.add("ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL")
    elif covering is not None:
        covered = _try_keep(ctx, removed, covering)
        ctx.add(f"ITEM_REMOVED_{'IS' if covered else 'NOT'}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
    elif _resolve(removed).contents is False:
        ctx.add("ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL")
    else:
        ctx.add("ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL")


def _item_added(ctx: _Context, old: _View, added: SchemaNode) -> None:
    permits, covering = _additional_items(old)
    if permits and covering is None:
        empty = _view(_resolve(added)).kind == "empty"
        ctx.add(f"ITEM_{'WITH_EMPTY_SCHEMA_' if empty else ''}ADDED_TO_OPEN_CONTENT_MODEL")
    elif covering is not None:
        covered = _try_keep(ctx, covering, added)
        ctx.add(f"ITEM_ADDED_{'IS' if covered else 'NOT'}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
    else:
        ctx.add("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL")


def _array_additional(ctx: _Context, old: _View, new: _View) -> None:
    _compare_additional(ctx, "additionalItems", "ADDITIONAL_ITEMS", _additional_items(old), _additional_items(new))


_BY_KIND = {
    "string": _string,
    "number": _numeric,
    "enum": _enum,
    "not": _not,
    "combined": _combined,
    "object": _object,
    "array": _array,
}
