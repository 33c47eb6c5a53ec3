"""The inverse of the archive's decoding: the key, value and headers bytes a consumer read, from a table row.

A side's bytes come back from its `__raw__` when the row kept it; otherwise from `__prefix__` (the
Confluent envelope, naming the schema id and, for Protobuf, the message) followed by the message rebuilt
from the columns and serialized (Avro: the datum re-encoded with its writer schema, record_decode.py; JSON
rows always keep `__raw__`). The decoder (proto_decode.py) leaves `__raw__` null only when this is exact: the payload
had an envelope, `invertible` holds for its message and the column tree, and the parsed message
re-serialized to the very same bytes. Rows read back with Spark (`Row.asDict(recursive=True)`) or pyiceberg
(`to_pylist()`) both work. Reused by serving Kafka Fetch from the Iceberg table.

A `table` layout row (Fluss's, top-level columns) rebuilds the same way: `table_side_row` gives the side's
struct-shaped view (__key → the key's __raw__; __value / __value_prefix / __value_err → the value's
__raw__ / __prefix__ / __err__ next to the top-level field columns), and `rebuild_table_row` the whole record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icelog.schema.avro_schema import AvroSchema
from icelog.schema.codec.avro_codec import AvroRows
from icelog.schema.codec.record_decode import ENVELOPE_BYTES, split_envelope
from icelog.schema.compiled import CompiledSchema, record_fields
from icelog.schema.protobuf_schema import build_pool, main_file_of, message_name_at, parse_envelope
from icelog.table.config import HEADERS, KEY_BYTES, VALUE_BYTES, VALUE_ERR, VALUE_PREFIX
from icelog.table.field_ids import compatible, shape
from icelog.table.iceberg_types import ERR, PREFIX, RAW, Column
from icelog.table.protobuf_types import WRAPPERS, descriptor_of, enum_of, field_signature, is_map, message_of

if TYPE_CHECKING:
    from google.protobuf.message import Message

_MESSAGE_KINDS = (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP)
_RENAMED = re.compile(r"^(?P<name>.+)__v\d+$")
# Fields whose column is not an exact image of the field: sub-µs nanos are dropped, JSON is not canonical,
# map order is not kept by re-serialization. Rows of such messages keep __raw__.
_NOT_INVERTIBLE = frozenset(
    {
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
        "google.protobuf.Any",
    }
)


class Schemas(Protocol):
    """Compiled schemas by id: registry_source.StoreSchemaSource (the embedded registry's metadata store) or
    registry_client.RegistryClient (a registry's REST API)."""

    def by_id(self, schema_id: int) -> CompiledSchema: ...


def _child(column: Column, name: str) -> Column | None:
    for child in column.children:
        if child.name == name:
            return child
    return None


def invertible(descriptor: Descriptor, column: Column, ancestors: tuple[str, ...] = ()) -> bool:
    """Whether every field of the message has a column holding it exactly (so the message can be rebuilt)."""
    inside = (*ancestors, descriptor.full_name)
    for field in descriptor.fields:
        child = _child(column, field.name)
        if child is None or not compatible(shape(field_signature(field, inside)), shape(child)):
            return False  # a field without a column of its type would be lost
        if is_map(field):
            return False
        if field.type in _MESSAGE_KINDS:
            message = message_of(field)
            name = message.full_name
            if field.type == FieldDescriptor.TYPE_GROUP or name in _NOT_INVERTIBLE:
                return False
            if name in WRAPPERS:
                continue
            target = child.children[0] if field.is_repeated else child
            if target.signature != "struct" or not invertible(message, target, inside):
                return False
    return True


def _pick(row: Mapping[str, Any], name: str) -> Any:
    """A field's value; a column renamed by evolution (`name__vN`) holds it for rows written before."""
    value = row.get(name)
    if value is not None:
        return value
    for key, other in row.items():
        match = _RENAMED.match(key)
        if other is not None and match is not None and match.group("name") == name:
            return other
    return None


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = enum_of(field).values_by_name.get(value)
        return known.number if known is not None else int(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return bytes(value)
    if field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return int(value)
    return value


def fill_message(message: Message, row: Mapping[str, Any]) -> None:
    """Set a message's fields from a struct value shaped like its columns (the inverse of proto_values)."""
    for field in descriptor_of(message).fields:
        value = _pick(row, field.name)
        if value is None:
            continue
        if field.type in _MESSAGE_KINDS and message_of(field).full_name in WRAPPERS:
            wrapped = message_of(field).fields_by_name["value"]
            if field.is_repeated:
                for item in value:
                    getattr(message, field.name).add().value = _scalar(wrapped, item)
            else:
                getattr(message, field.name).value = _scalar(wrapped, value)
        elif field.type in _MESSAGE_KINDS:
            if field.is_repeated:
                for item in value:
                    fill_message(getattr(message, field.name).add(), _as_dict(item))
            else:
                target = getattr(message, field.name)
                target.SetInParent()  # a set message with no fields is still set
                fill_message(target, _as_dict(value))
        elif field.is_repeated:
            getattr(message, field.name).extend(_scalar(field, v) for v in value)
        else:
            setattr(message, field.name, _scalar(field, value))


def _as_dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else value.asDict(recursive=True)


class Rebuilder:
    """Rebuilds payloads of one side; caches message classes per (schema id, message indexes)."""

    def __init__(self, schemas: Schemas) -> None:
        self.schemas = schemas
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}
        self._avro: dict[int, AvroRows] = {}

    def _class(self, schema_id: int, indexes: Sequence[int]) -> type[Message]:
        key = (schema_id, tuple(indexes))
        if key not in self._classes:
            fds = self.schemas.by_id(schema_id)
            if not isinstance(fds, descriptor_pb2.FileDescriptorSet):
                raise ValueError(f"schema id {schema_id} is not a Protobuf schema")
            pool = build_pool(fds)
            descriptor = pool.FindMessageTypeByName(message_name_at(main_file_of(fds), list(indexes)))
            self._classes[key] = message_factory.GetMessageClass(descriptor)
        return self._classes[key]

    def payload(self, side_row: Mapping[str, Any] | None) -> bytes | None:
        """The side's bytes as produced: `__raw__` when kept, else the envelope and the rebuilt message."""
        if side_row is None:
            return None
        row = _as_dict(side_row)
        raw = row.get(RAW)
        if raw is not None:
            return bytes(raw)
        prefix = row.get(PREFIX)
        if prefix is None:
            raise ValueError(f"row has neither {RAW} nor {PREFIX}: it cannot be rebuilt ({row.get(ERR)})")
        if len(prefix) == ENVELOPE_BYTES:  # Avro's envelope has no message indexes (JSON rows always keep __raw__)
            return bytes(prefix) + self._avro_rows(bytes(prefix)).encode(row)
        envelope = parse_envelope(bytes(prefix))
        if envelope is None:
            raise ValueError(f"{PREFIX} {bytes(prefix)!r} is not a Confluent envelope")
        schema_id, indexes, _ = envelope
        message = self._class(schema_id, indexes)()
        fill_message(message, row)
        body: bytes = message.SerializeToString()
        return bytes(prefix) + body


    def _avro_rows(self, prefix: bytes) -> AvroRows:
        envelope = split_envelope(prefix)
        assert envelope is not None
        schema_id = envelope[0]
        if schema_id not in self._avro:
            schema = self.schemas.by_id(schema_id)
            if not isinstance(schema, AvroSchema):
                raise ValueError(f"schema id {schema_id} is not an Avro schema")
            self._avro[schema_id] = AvroRows(schema, Column("value", "struct", record_fields(schema, "value")))
        return self._avro[schema_id]


def rebuild_payload(side_row: Mapping[str, Any] | None, schemas: Schemas) -> bytes | None:
    """The key or value bytes a consumer read, from the row's `key` or `value` struct (None: a null payload)."""
    return Rebuilder(schemas).payload(side_row)


def rebuild_headers(headers: Sequence[Any] | None) -> list[tuple[str, bytes | None]]:
    """The record's headers, in order, from the row's `headers` list."""
    out: list[tuple[str, bytes | None]] = []
    for header in headers or ():
        item = _as_dict(header)
        value = item.get("value")
        out.append((str(item["key"]), None if value is None else bytes(value)))
    return out


def table_side_row(row: Mapping[str, Any], side: str) -> Mapping[str, Any] | None:
    """A table layout row's key or value as the record layout's struct would hold it (None: a null payload)."""
    if side == "key":
        raw = row.get(KEY_BYTES)
        return None if raw is None else {RAW: raw}
    raw, prefix = row.get(VALUE_BYTES), row.get(VALUE_PREFIX)
    if raw is None and prefix is None:  # the decoder keeps one of them for every non-null value
        return None
    return {**row, RAW: raw, PREFIX: prefix, ERR: row.get(VALUE_ERR)}


Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def rebuild_table_row(row: Mapping[str, Any], keys: Rebuilder, values: Rebuilder) -> Record:
    """(key, value, headers) a consumer read, from a table layout row (a Spark Row or a pyiceberg dict)."""
    item = _as_dict(row)
    return (
        keys.payload(table_side_row(item, "key")),
        values.payload(table_side_row(item, "value")),
        rebuild_headers(item.get(HEADERS)),
    )
