"""Field-ID allocation and schema evolution state of an archive table (pure; persisted by the metadata store).

The state of a table is one record per column path ("value", "value.amount", "value.tags.element",
"value.attrs.key"), holding the column's Iceberg field id, its type signature and whether it is deleted.
Evolving it against a newly computed column tree (iceberg_types.table_columns) follows Bufstream's rules:
  - an unchanged column keeps its field id (also when it comes back after having been removed);
  - a new column gets a new id, above every id the table ever used;
  - a removed column stays in the table, marked deleted (null in new rows, old rows still read);
  - a column whose type changed incompatibly is renamed `<name>__v<N>` (first free N), marked deleted,
    keeping its id (so old data files still resolve), and a new column with a new id takes the name.
  Safe Iceberg promotions (int → long, float → double) keep the id and change the type.
A list's element or a map's key/value changing type counts as a change of the list or map field itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TableColumn:
    """One column of an archive table with a schema: its Iceberg field id, allocated once and kept.

    `path` is the column's dotted path in the table ("value.amount", "value.tags.element"); `signature`
    its type ("long", "struct", "list", ...); `deleted` marks a column no longer in the schema (kept, null).
    """

    path: str
    field_id: int
    signature: str
    deleted: bool = False


@dataclass(frozen=True)
class Column:
    """A column as computed from a schema: its name, type signature and children.

    signature: a primitive Iceberg type ("int", "decimal(20,0)", ...) or "struct" / "list" / "map";
    children: a struct's fields, a list's ("element",), a map's ("key", "value").
    """

    name: str
    signature: str
    children: tuple[Column, ...] = ()


FieldIdRecord = TableColumn
PROMOTIONS = {("int", "long"), ("float", "double")}
CONTAINERS = ("list", "map")


def leaf_name(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def parent_path(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def child_paths(by_path: Mapping[str, FieldIdRecord]) -> dict[str, list[FieldIdRecord]]:
    """parent path ("" for top level) → its children, ordered by field id (so new columns come last)."""
    children: dict[str, list[FieldIdRecord]] = {}
    for record in sorted(by_path.values(), key=lambda r: r.field_id):
        children.setdefault(parent_path(record.path), []).append(record)
    return children


def shape(column: Column) -> str:
    """A column's type with the element types of lists and maps (struct members evolve on their own)."""
    if column.signature in CONTAINERS:
        return f"{column.signature}<{','.join(shape(c) for c in column.children)}>"
    return column.signature


def _record_shape(path: str, state: Mapping[str, FieldIdRecord]) -> str:
    signature = state[path].signature
    if signature not in CONTAINERS:
        return signature
    names = ("element",) if signature == "list" else ("key", "value")
    return f"{signature}<{','.join(_record_shape(f'{path}.{n}', state) for n in names)}>"


def compatible(old_shape: str, new_shape: str) -> bool:
    return old_shape == new_shape or (old_shape, new_shape) in PROMOTIONS


def evolve(columns: Sequence[Column], known: Iterable[FieldIdRecord], floor_id: int = 0) -> list[FieldIdRecord]:
    """The table's column records after computing `columns` from the latest schema.

    `floor_id` is the table's last assigned column id: new ids are always above it and every known id.
    """
    state: dict[str, FieldIdRecord] = {r.path: r for r in known}
    next_id = max([floor_id, *(r.field_id for r in state.values())]) + 1
    seen: set[str] = set()

    def retire(path: str) -> None:
        n = 1
        while f"{path}__v{n}" in state:
            n += 1
        renamed = f"{path}__v{n}"
        for old in [p for p in state if p == path or p.startswith(path + ".")]:
            record = state.pop(old)
            new_path = renamed + old[len(path) :]
            state[new_path] = dataclasses.replace(record, path=new_path, deleted=True)

    def visit(column: Column, parent: str, in_container: bool) -> None:
        nonlocal next_id
        path = f"{parent}.{column.name}" if parent else column.name
        record = state.get(path)
        # Inside a list/map the container's own shape check already covered this column.
        if record is not None and not in_container and not compatible(_record_shape(path, state), shape(column)):
            retire(path)
            record = None
        if record is None:
            record = FieldIdRecord(path, next_id, column.signature)
            next_id += 1
        else:
            record = dataclasses.replace(record, signature=column.signature, deleted=False)
        state[path] = record
        seen.add(path)
        for child in column.children:
            visit(child, path, column.signature in CONTAINERS)

    for column in columns:
        visit(column, "", False)
    for path, record in list(state.items()):
        if path not in seen and not record.deleted:
            state[path] = dataclasses.replace(record, deleted=True)
    return sorted(state.values(), key=lambda r: r.field_id)


def changed(before: Iterable[FieldIdRecord], after: Iterable[FieldIdRecord]) -> bool:
    return sorted(before, key=lambda r: r.field_id) != sorted(after, key=lambda r: r.field_id)
