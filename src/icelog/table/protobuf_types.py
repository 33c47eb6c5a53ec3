"""Protobuf message descriptors → Iceberg column trees (docs/protobuf.md, "Type mapping"). Pure functions.

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

from typing import cast

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from icelog.table.field_ids import Column

MAX_DEPTH = 10  # message nesting kept as structs; deeper message fields become JSON strings


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


def descriptor_of(message: Message) -> Descriptor:
    """A message's descriptor. (upb's descriptor classes pass for google.protobuf.descriptor's at run time, whose
    isinstance says so; types-protobuf declares them apart.)"""
    return cast(Descriptor, message.DESCRIPTOR)


def message_of(field: FieldDescriptor) -> Descriptor:
    """The message type of a message (or group) field."""
    if field.message_type is None:
        raise TypeError(f"{field.full_name} is not a message field")
    return field.message_type


def enum_of(field: FieldDescriptor) -> EnumDescriptor:
    """The enum type of an enum field."""
    if field.enum_type is None:
        raise TypeError(f"{field.full_name} is not an enum field")
    return field.enum_type


def is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def field_signature(field: FieldDescriptor, ancestors: tuple[str, ...]) -> Column:
    """The column of one field; `ancestors`: full names of the enclosing messages, outermost first."""
    if is_map(field):
        entry = message_of(field)
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
        message = message_of(field)
        if message.full_name in WELL_KNOWN:
            return Column(name, WELL_KNOWN[message.full_name])
        if nested_as_json(message.full_name, ancestors):
            return Column(name, "string")
        return Column(name, "struct", message_columns(message, ancestors))
    return Column(name, _SCALARS[field.type])


def message_columns(descriptor: Descriptor, ancestors: tuple[str, ...] = ()) -> tuple[Column, ...]:
    """The columns of a message's fields, in field order (oneof members are plain nullable columns)."""
    inside = (*ancestors, descriptor.full_name)
    return tuple(field_signature(field, inside) for field in descriptor.fields)


def fields_of(descriptor: Descriptor | None) -> tuple[Column, ...] | None:
    """A side's fields as the table's column tree takes them (None: the side has no schema)."""
    return None if descriptor is None else message_columns(descriptor)
