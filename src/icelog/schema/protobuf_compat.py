"""Protobuf compatibility rules, after Confluent's Protobuf schema diff.

`incompatibilities(old, new)` lists why readers of one schema cannot read data of the other. What is
checked, message by message of the main file (nested messages included, matched by full name):

* syntax (proto2/proto3) changed, package changed — incompatible.
* a message of the old schema removed — incompatible (adding messages is fine).
* per field number: the kind changed (scalar / message / enum / group) — incompatible; a scalar type
  changed to one with another wire encoding — incompatible. Protobuf's compatible groups are kept:
  {int32, uint32, int64, uint64, bool}, {sint32, sint64}, {fixed32, sfixed32}, {fixed64, sfixed64},
  {string, bytes}; a message or enum field changed to another named type — incompatible.
* a field changed between repeated and singular — incompatible unless it is a numeric scalar
  (packed and unpacked encodings are read either way).
* maps: the key and value types are compared by the same rules (a map field may be renamed).
* a required field added or removed — incompatible; an optional field removed or added — fine.
* oneofs: a field moved into an existing oneof, several existing fields moved into a new oneof, or a
  field removed from a oneof — incompatible; a new oneof of new fields, or one existing field becoming
  a oneof of its own — fine.

The levels that call these rules are in registry/compat.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from google.protobuf import descriptor_pb2

from icelog.schema.protobuf_schema import main_file_of

FDP = descriptor_pb2.FieldDescriptorProto
_WIRE_GROUPS = [
    {FDP.TYPE_INT32, FDP.TYPE_UINT32, FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_BOOL},
    {FDP.TYPE_SINT32, FDP.TYPE_SINT64},
    {FDP.TYPE_FIXED32, FDP.TYPE_SFIXED32},
    {FDP.TYPE_FIXED64, FDP.TYPE_SFIXED64},
    {FDP.TYPE_STRING, FDP.TYPE_BYTES},
]
_NUMERIC = {
    FDP.TYPE_INT32, FDP.TYPE_UINT32, FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_BOOL, FDP.TYPE_SINT32,
    FDP.TYPE_SINT64, FDP.TYPE_FIXED32, FDP.TYPE_SFIXED32, FDP.TYPE_FIXED64, FDP.TYPE_SFIXED64,
    FDP.TYPE_FLOAT, FDP.TYPE_DOUBLE, FDP.TYPE_ENUM,
}


def _kind(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type == FDP.TYPE_MESSAGE:
        return "message"
    if field.type == FDP.TYPE_ENUM:
        return "enum"
    if field.type == FDP.TYPE_GROUP:
        return "group"
    return "scalar"


def _type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    name: str = FDP.Type.Name(field.type).removeprefix("TYPE_").lower() if not field.type_name else field.type_name
    return name


def _wire_compatible(a: int, b: int) -> bool:
    return a == b or any(a in group and b in group for group in _WIRE_GROUPS)


def _messages(
    messages: Sequence[descriptor_pb2.DescriptorProto], prefix: str
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    for message in messages:
        name = f"{prefix}.{message.name}" if prefix else message.name
        if message.options.map_entry:
            continue  # map entries are part of their field
        yield name, message
        yield from _messages(message.nested_type, name)


def _oneof_of(message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto) -> str | None:
    # proto3 `optional` is a synthetic oneof; it is not a real oneof for compatibility.
    if not field.HasField("oneof_index") or field.proto3_optional:
        return None
    name: str = message.oneof_decl[field.oneof_index].name
    return name


def _map_entry(
    message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
) -> descriptor_pb2.DescriptorProto | None:
    if field.type != FDP.TYPE_MESSAGE or field.label != FDP.LABEL_REPEATED:
        return None
    short = field.type_name.rsplit(".", 1)[-1]
    for nested in message.nested_type:
        if nested.name == short and nested.options.map_entry:
            return nested
    return None


def _compare_message(name: str, old: descriptor_pb2.DescriptorProto, new: descriptor_pb2.DescriptorProto) -> list[str]:
    problems: list[str] = []
    old_fields = {f.number: f for f in old.field}
    new_fields = {f.number: f for f in new.field}
    for number, before in old_fields.items():
        after = new_fields.get(number)
        if after is None:
            if before.label == FDP.LABEL_REQUIRED:
                problems.append(f"{name}: required field {before.name} (#{number}) removed")
            if _oneof_of(old, before) is not None:
                problems.append(f"{name}: field {before.name} (#{number}) removed from oneof {_oneof_of(old, before)}")
            continue
        where = f"{name}.{after.name} (#{number})"
        old_entry, new_entry = _map_entry(old, before), _map_entry(new, after)
        if old_entry is not None and new_entry is not None:
            # A map's entry type is named after the field: compare the key and value types instead.
            problems.extend(f"{where}: map {p}" for p in _compare_message("entry", old_entry, new_entry))
            continue
        if _kind(before) != _kind(after):
            problems.append(f"{where}: kind changed from {_kind(before)} to {_kind(after)}")
        elif _kind(before) == "scalar" and not _wire_compatible(before.type, after.type):
            problems.append(f"{where}: type changed from {_type_name(before)} to {_type_name(after)}")
        elif before.type_name and before.type_name != after.type_name:
            problems.append(f"{where}: type changed from {before.type_name} to {after.type_name}")
        repeated = (before.label == FDP.LABEL_REPEATED, after.label == FDP.LABEL_REPEATED)
        if repeated[0] != repeated[1] and not (before.type in _NUMERIC and after.type in _NUMERIC):
            problems.append(f"{where}: changed between repeated and singular")
        if (before.label == FDP.LABEL_REQUIRED) != (after.label == FDP.LABEL_REQUIRED):
            problems.append(f"{where}: required label changed")
    for number, after in new_fields.items():
        if number not in old_fields and after.label == FDP.LABEL_REQUIRED:
            problems.append(f"{name}: required field {after.name} (#{number}) added")
    problems.extend(_compare_oneofs(name, old, new, old_fields, new_fields))
    return problems


def _compare_oneofs(
    name: str,
    old: descriptor_pb2.DescriptorProto,
    new: descriptor_pb2.DescriptorProto,
    old_fields: dict[int, descriptor_pb2.FieldDescriptorProto],
    new_fields: dict[int, descriptor_pb2.FieldDescriptorProto],
) -> list[str]:
    problems: list[str] = []
    old_oneofs = {o.name for i, o in enumerate(old.oneof_decl)}
    moved_into: dict[str, list[int]] = {}
    for number, after in new_fields.items():
        before = old_fields.get(number)
        if before is None:
            continue
        was, now = _oneof_of(old, before), _oneof_of(new, after)
        if now is not None and was != now:
            moved_into.setdefault(now, []).append(number)
        elif was is not None and now is None:
            problems.append(f"{name}: field {after.name} (#{number}) moved out of oneof {was}")
    for oneof, numbers in moved_into.items():
        if oneof in old_oneofs:
            problems.append(f"{name}: fields {numbers} moved into existing oneof {oneof}")
        elif len(numbers) > 1:
            problems.append(f"{name}: several existing fields {numbers} moved into new oneof {oneof}")
    return problems


def incompatibilities(
    old: descriptor_pb2.FileDescriptorSet, new: descriptor_pb2.FileDescriptorSet
) -> list[str]:
    """Why data written with `old` cannot be read with `new` (empty: compatible)."""
    old_main, new_main = main_file_of(old), main_file_of(new)
    problems: list[str] = []
    if (old_main.syntax or "proto2") != (new_main.syntax or "proto2"):
        problems.append(f"syntax changed from {old_main.syntax or 'proto2'} to {new_main.syntax or 'proto2'}")
    if old_main.package != new_main.package:
        problems.append(f"package changed from {old_main.package!r} to {new_main.package!r}")
        return problems  # every message name moved; listing each would only repeat this
    new_messages = dict(_messages(new_main.message_type, ""))
    for name, message in _messages(old_main.message_type, ""):
        counterpart = new_messages.get(name)
        if counterpart is None:
            problems.append(f"message {name} removed")
        else:
            problems.extend(_compare_message(name, message, counterpart))
    return problems

