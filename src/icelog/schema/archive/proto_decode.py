"""Decoding one side (key or value) of archived records with its Protobuf schema, in Spark's Python workers.

The driver ships a `SideDecoding` (serialized FileDescriptorSets by schema id, the target column); each
worker builds message classes from it once (google.protobuf.message_factory.GetMessageClass) and turns
payloads into dicts shaped like the side's struct column:
  - a payload with Confluent's envelope is decoded with its schema id and message indexes; a schema id
    other than those the driver shipped (an older version) is fetched from the registry by the worker,
    once per task, and its fields fill the columns of the same name and type;
  - a payload without an envelope is decoded with the configured message (else the first message);
  - `__prefix__` holds the envelope bytes when present; a payload that does not decode sets `__err__`
    and `__raw__` only; `key.__raw__` is always set, `value.__raw__` only on error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, message_factory

from icelog.schema.archive.iceberg_types import ERR, PREFIX, RAW, Column
from icelog.schema.archive.proto_values import FieldPart, column_values, struct_converter, struct_parts
from icelog.schema.protobuf_schema import build_pool, main_file_of, message_name_at, parse_envelope


@dataclass(frozen=True)
class SideDecoding:
    """What a worker needs to decode one side of a topic (picklable)."""

    side: str
    column: Column  # the side's struct column (current, non-deleted columns)
    latest_id: int
    schemas: dict[int, bytes]  # schema id → serialized FileDescriptorSet (main file last)
    message_name: str | None = None  # configured message for payloads without an envelope
    registry_url: str | None = None  # for schema ids not shipped (older versions)


Decoded = tuple[Callable[[bytes], Any], Callable[[Any], dict[str, Any]], list[FieldPart]]
DecoderKey = tuple[int, tuple[int, ...] | None]


class SideDecoder:
    """Decodes payloads of one side into row dicts; caches a message class per (schema id, indexes)."""

    def __init__(self, decoding: SideDecoding) -> None:
        self.decoding = decoding
        self._sets: dict[int, descriptor_pb2.FileDescriptorSet] = {}
        self._pools: dict[int, Any] = {}
        self._decoders: dict[DecoderKey, Decoded] = {}
        self._always_raw = decoding.side == "key"

    def _fds(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        if schema_id not in self._sets:
            data = self.decoding.schemas.get(schema_id)
            fds = descriptor_pb2.FileDescriptorSet()
            if data is not None:
                fds.ParseFromString(data)
            else:
                fds = fetch_schema_by_id(self.decoding.registry_url, schema_id)
            self._sets[schema_id] = fds
            self._pools[schema_id] = build_pool(fds)
        return self._sets[schema_id]

    def _decoder(self, schema_id: int, indexes: tuple[int, ...] | None) -> Decoded:
        key = (schema_id, indexes)
        found = self._decoders.get(key)
        if found is None:
            fds = self._fds(schema_id)
            if indexes is None and self.decoding.message_name:
                name = self.decoding.message_name.lstrip(".")
            else:
                name = message_name_at(main_file_of(fds), list(indexes or [0]))
            descriptor = self._pools[schema_id].FindMessageTypeByName(name)
            cls = message_factory.GetMessageClass(descriptor)
            column = self.decoding.column
            found = (cls.FromString, struct_converter(descriptor, column), struct_parts(descriptor, column))
            self._decoders[key] = found
        return found

    def _parse(self, payload: bytes) -> tuple[DecoderKey, Any, bytes | None]:
        """(decoder key, message, envelope bytes or None); raises if the payload does not decode."""
        envelope = parse_envelope(payload)
        if envelope is None:
            key: DecoderKey = (self.decoding.latest_id, None)
            return key, self._decoder(*key)[0](payload), None
        schema_id, indexes, offset = envelope
        key = (schema_id, tuple(indexes))
        return key, self._decoder(*key)[0](payload[offset:]), payload[:offset]

    def decode(self, payload: bytes | None) -> dict[str, Any] | None:
        """The side's struct value for one payload (None for a null payload)."""
        if payload is None:
            return None
        try:
            key, message, prefix = self._parse(payload)
            row = self._decoders[key][1](message)
        except Exception as exc:  # a payload that does not decode is data, not a failed pass
            return error_row(exc, payload)
        row[PREFIX] = prefix
        if self._always_raw:
            row[RAW] = payload
        return row

    def decode_many(self, payloads: list[bytes | None], struct_type: Any) -> Any:
        """An Arrow struct array of many payloads, built column by column (no dict per row).

        Payloads of the batch's most common message type fill the columns directly; others (another
        schema version, errors) go through `decode` and are merged in.
        """
        import pyarrow as pa

        n = len(payloads)
        main: DecoderKey | None = None
        rows: list[int] = []
        messages: list[Any] = []
        prefixes: list[bytes | None] = [None] * n
        others: dict[int, dict[str, Any]] = {}
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            try:
                key, message, prefix = self._parse(payload)
            except Exception as exc:
                others[i] = error_row(exc, payload)
                continue
            if main is None:
                main = key
            if key == main:
                rows.append(i)
                messages.append(message)
                prefixes[i] = prefix
            else:
                others[i] = self.decode(payload) or {}
        try:
            filled = column_values(self._decoders[main][2], messages) if main is not None else {}
        except Exception:  # some message does not convert: find which, row by row
            return pa.array([self.decode(p) for p in payloads], type=struct_type)
        arrays = []
        for field in struct_type:
            name = field.name
            if name == PREFIX:
                column: list[Any] = prefixes
            elif name == RAW and self._always_raw:
                column = list(payloads)
            else:
                column = [None] * n
                for i, value in zip(rows, filled.get(name, ()), strict=False):
                    column[i] = value
            for i, row in others.items():
                column[i] = row.get(name)
            arrays.append(pa.array(column, type=field.type))
        mask = pa.array([p is None for p in payloads], type=pa.bool_())
        return pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=mask)


def error_row(exc: Exception, payload: bytes) -> dict[str, Any]:
    """The row of a payload that does not decode: only __err__ and __raw__."""
    return {ERR: f"{type(exc).__name__}: {exc}"[:1000] or type(exc).__name__, RAW: payload}


def fetch_schema_by_id(url: str | None, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
    """A schema (and its references) by id from the registry, compiled."""
    from icelog.schema.archive.registry_source import RegistrySchemas

    if not url:
        raise LookupError(f"schema id {schema_id} is unknown and no registry is configured")
    return RegistrySchemas(url).by_id(schema_id)
