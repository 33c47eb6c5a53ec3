"""Protobuf messages → Python values shaped like their Iceberg columns (runs in Spark's Python workers).

A converter is compiled once per (message descriptor, target column) and then applied to every record:
the column tree says which fields to fill; a field the message lacks, or whose type differs from its
column (a payload written with an older schema version), is left null.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable
from operator import attrgetter, methodcaller
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icelog.table.field_ids import compatible, shape
from icelog.table.iceberg_types import Column
from icelog.table.protobuf_types import WRAPPERS, descriptor_of, enum_of, field_signature, is_map, message_of

if TYPE_CHECKING:
    from google.protobuf.message import Message

Convert = Callable[[Any], Any]
_US = 1_000_000


def _identity(value: Any) -> Any:
    return value


def _to_decimal(value: int) -> decimal.Decimal:
    return decimal.Decimal(value)


def message_json(message: Message) -> str:
    """A message as compact JSON (Struct, Value, Any, or a message nested past the depth limit)."""
    try:
        body = json_format.MessageToDict(
            message, preserving_proto_field_name=True, descriptor_pool=descriptor_of(message).file.pool
        )
    except Exception:  # an Any whose type the pool does not know: keep its bytes
        body = {"@type": getattr(message, "type_url", ""), "value_base64": _b64(getattr(message, "value", b""))}
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _timestamp_us(message: Any) -> int:
    return int(message.seconds) * _US + int(message.nanos) // 1000


_SECONDS, _NANOS = attrgetter("seconds"), attrgetter("nanos")


class _EnumNames:
    """An enum number → its name (the number as text where the schema names none)."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def __call__(self, number: int) -> str:
        return self.names.get(number, str(number))


def _wrapper(signature: str) -> Convert:
    if signature == "decimal(20,0)":
        return lambda m: decimal.Decimal(m.value)
    return lambda m: m.value


def element_converter(field: FieldDescriptor, column: Column, ancestors: tuple[str, ...]) -> Convert:
    """Converter of one (non-repeated) value of `field` into `column`'s shape."""
    if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        message = message_of(field)
        full_name = message.full_name
        if full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
            return _timestamp_us
        if full_name in WRAPPERS:
            return _wrapper(WRAPPERS[full_name])
        if column.signature == "string":  # Struct/Value/ListValue/Any, or recursive / past the depth limit
            return message_json
        return struct_converter(message, column, ancestors)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _EnumNames({v.number: v.name for v in enum_of(field).values})
    if column.signature == "decimal(20,0)":
        return _to_decimal
    return _identity


def _field_converter(field: FieldDescriptor, column: Column, ancestors: tuple[str, ...]) -> Convert:
    if is_map(field):
        entry = message_of(field)
        key = element_converter(entry.fields_by_name["key"], column.children[0], ancestors)
        value = element_converter(entry.fields_by_name["value"], column.children[1], ancestors)
        return lambda mapping: [(key(k), value(v)) for k, v in mapping.items()]
    if field.is_repeated:
        element = element_converter(field, column.children[0], ancestors)
        if element is _identity:
            return list  # scalars: one C-level copy instead of a Python call per element
        return lambda items: [element(x) for x in items]
    return element_converter(field, column, ancestors)


FieldPart = tuple[str, bool, Convert]  # column name, null when unset, value converter


def struct_parts(descriptor: Descriptor, column: Column, ancestors: tuple[str, ...] = ()) -> list[FieldPart]:
    """The fields of a message that fill `column`'s children, each with its converter."""
    parts: list[FieldPart] = []
    inside = (*ancestors, descriptor.full_name)
    for child in column.children:
        field = descriptor.fields_by_name.get(child.name)
        if field is None:
            continue
        if not compatible(shape(field_signature(field, inside)), shape(child)):
            continue  # an older schema's field of another type: its column stays null
        # Unset singular fields with presence (messages, oneof members, proto3 `optional`) are null;
        # plain proto3 scalars read their default, as Protobuf itself does.
        presence = field.has_presence and not field.is_repeated
        parts.append((child.name, presence, _field_converter(field, child, inside)))
    return parts


def struct_converter(
    descriptor: Descriptor, column: Column, ancestors: tuple[str, ...] = ()
) -> Callable[[Message], dict[str, Any]]:
    """Converter of a message into a dict of `column`'s children (missing keys are null)."""
    parts = struct_parts(descriptor, column, ancestors)

    def convert(message: Message) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, presence, fn in parts:
            if presence and not message.HasField(name):
                continue
            out[name] = fn(getattr(message, name))
        return out

    return convert


def column_values(parts: list[FieldPart], messages: list[Message]) -> dict[str, list[Any]]:
    """Column-wise values of many messages of one type (the top level of a batch, no dict per row).

    The common columns are read with C-level loops (map over attrgetter) and converted inline, not by a Python
    call per value; what they give is exactly what each part's converter gives.
    """
    columns: dict[str, list[Any]] = {}
    for name, presence, fn in parts:
        if fn is _timestamp_us:  # a singular Timestamp / Duration (a message: it has presence)
            subs = list(map(attrgetter(name), messages))
            present = map(methodcaller("HasField", name), messages)
            columns[name] = [
                seconds * _US + nanos // 1000 if p else None
                for p, seconds, nanos in zip(present, map(_SECONDS, subs), map(_NANOS, subs), strict=True)
            ]
        elif presence:
            columns[name] = [fn(getattr(m, name)) if m.HasField(name) else None for m in messages]
        elif fn is _identity:  # scalars as read
            columns[name] = list(map(attrgetter(name), messages))
        elif isinstance(fn, _EnumNames):
            names = fn.names
            columns[name] = [names[v] if v in names else str(v) for v in map(attrgetter(name), messages)]
        else:
            columns[name] = list(map(fn, map(attrgetter(name), messages)))
    return columns
