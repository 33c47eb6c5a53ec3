"""Decoding one side (key or value) of archived records with its Protobuf schema, in Spark's Python workers.

The driver ships a `SideDecoding` (sides.py: FileDescriptorSets by schema id, the target column, the
table's message); each worker builds message classes from it once (message_factory.GetMessageClass)
and turns payloads into dicts shaped like the side's struct column:
  - a payload with Confluent's envelope is decoded with its schema id and message indexes; a schema id
    the driver did not ship is read from the schema source (metadata store or registry) once per task;
  - a payload without an envelope is decoded with the table's message;
  - a payload of another message than the table's, or one that does not decode, sets `__err__` (why)
    and `__raw__` (the whole payload) only;
  - `__prefix__` holds the envelope bytes; `__raw__` is always set for keys and for values it is left
    null only when the row provably rebuilds the payload (schema/codec/rebuild.py): the payload has an
    envelope, its message is fully invertible from the columns, and it re-serializes to the same bytes.
A batch whose payloads are all of one message goes first to the compiled decoder (proto_columns.py), which
writes the Arrow columns straight from the bytes and takes the batch only if every body is exactly what upb
would re-serialize (so the last rule holds without re-serializing); any other batch is parsed with upb.
A registry that cannot be reached raises RegistryUnavailableError: the task and the pass fail (retried),
so an outage never becomes an `__err__` row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, message_factory

from icelog.schema.codec.proto_columns import COMPILED, ColumnDecoder
from icelog.schema.codec.proto_values import FieldPart, column_values, struct_converter, struct_parts
from icelog.schema.codec.rebuild import invertible
from icelog.schema.codec.registry_source import SchemaSource, open_source
from icelog.schema.codec.sides import SideDecoding, each_row, error_row, side_array
from icelog.schema.protobuf_schema import build_pool, main_file_of, message_name_at, parse_envelope
from icelog.schema.registry_client import RegistryUnavailableError
from icelog.table.iceberg_types import PREFIX, RAW

if TYPE_CHECKING:
    import pyarrow as pa
    from google.protobuf.descriptor import Descriptor
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message import Message


class OtherMessageError(ValueError):
    """A payload of another message than the table's (its fields would not fill the table's columns)."""


@dataclass(frozen=True)
class Decoded:
    """A message class's parse function, its converters into the side's column, and invertibility."""

    descriptor: Descriptor
    parse: Callable[[bytes], Message]
    convert: Callable[[Message], dict[str, Any]]
    parts: list[FieldPart]
    invertible: bool  # the columns hold every field exactly: rebuild.py can re-serialize the message


DecoderKey = tuple[int, tuple[int, ...] | None]


class ProtoSideDecoder:
    """Decodes Protobuf payloads of one side into row dicts; caches a message class per (schema id, indexes)."""

    def __init__(self, decoding: SideDecoding) -> None:
        self.decoding = decoding
        self._sets: dict[int, descriptor_pb2.FileDescriptorSet] = {}
        self._pools: dict[int, DescriptorPool] = {}
        self._decoders: dict[DecoderKey, Decoded] = {}
        self._always_raw = decoding.side == "key"
        self._source: SchemaSource | None = None
        self._column_decoders: dict[tuple[DecoderKey, pa.StructType], ColumnDecoder | None] = {}

    def _fds(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        if schema_id not in self._sets:
            shipped = self.decoding.schemas.get(schema_id)
            fds = shipped if shipped is not None else self._fetch(schema_id)
            if not isinstance(fds, descriptor_pb2.FileDescriptorSet):
                raise OtherMessageError(f"schema id {schema_id} is not a Protobuf schema")
            self._sets[schema_id] = fds
            self._pools[schema_id] = build_pool(fds)
        return self._sets[schema_id]

    def _fetch(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        """A schema id the driver did not ship (RegistryUnavailableError propagates: the pass fails)."""
        if self.decoding.source is None:
            raise LookupError(f"schema id {schema_id} is unknown and no registry is configured")
        if self._source is None:
            self._source = open_source(self.decoding.source)
        fds = self._source.by_id(schema_id)
        if not isinstance(fds, descriptor_pb2.FileDescriptorSet):
            raise OtherMessageError(f"schema id {schema_id} is not a Protobuf schema")
        return fds

    def _decoder(self, schema_id: int, indexes: tuple[int, ...] | None) -> Decoded:
        key = (schema_id, indexes)
        found = self._decoders.get(key)
        if found is None:
            fds = self._fds(schema_id)
            table_message = (self.decoding.message_name or "").lstrip(".")
            if indexes is None and table_message:
                name = table_message
            else:
                name = message_name_at(main_file_of(fds), list(indexes or [0]))
            if table_message and name != table_message:
                raise OtherMessageError(
                    f"payload is a {name} (schema id {schema_id}), the table's {self.decoding.side} columns are "
                    f"{table_message}'s; set icelog.schema.{self.decoding.side}.message to choose the table's message"
                )
            descriptor = self._pools[schema_id].FindMessageTypeByName(name)
            cls = message_factory.GetMessageClass(descriptor)
            column = self.decoding.column
            found = Decoded(
                descriptor,
                cls.FromString,
                struct_converter(descriptor, column),
                struct_parts(descriptor, column),
                invertible(descriptor, column),
            )
            self._decoders[key] = found
        return found

    def _parse(self, payload: bytes) -> tuple[DecoderKey, Message, bytes | None]:
        """(decoder key, message, envelope bytes or None); raises if the payload does not decode."""
        envelope = parse_envelope(payload)
        if envelope is None:
            key: DecoderKey = (self.decoding.latest_id, None)
            return key, self._decoder(*key).parse(payload), None
        schema_id, indexes, offset = envelope
        key = (schema_id, tuple(indexes))
        return key, self._decoder(*key).parse(payload[offset:]), payload[:offset]

    def _keeps_raw(self, key: DecoderKey, message: Message, payload: bytes, prefix: bytes | None) -> bool:
        """Whether `__raw__` must be kept: always for keys; for values unless the row provably rebuilds it."""
        if self._always_raw or prefix is None or not self._decoders[key].invertible:
            return True
        # Unknown fields re-serialize but have no column: drop them (recursively) before comparing.
        message.DiscardUnknownFields()
        try:
            return bool(message.SerializeToString() != payload[len(prefix) :])
        except Exception:  # upb parses a proto2 message missing a required field but will not serialize it: keep
            return True

    def decode(self, payload: bytes | None) -> dict[str, Any] | None:
        """The side's struct value for one payload (None for a null payload)."""
        if payload is None:
            return None
        try:
            key, message, prefix = self._parse(payload)
            row = self._decoders[key].convert(message)
        except RegistryUnavailableError:
            raise  # an outage is not a property of the payload: fail the task, retry the pass
        except Exception as exc:  # a payload that does not decode is data, not a failed pass
            return error_row(exc, payload)
        row[PREFIX] = prefix
        if self._keeps_raw(key, message, payload, prefix):
            row[RAW] = payload
        return row

    def decode_many(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray:
        """An Arrow struct array of many payloads, built column by column (no dict per row).

        Payloads of the batch's most common message type fill the columns directly; others (another
        schema version, errors) go through `decode` and are merged in. A batch of one message that the
        compiled decoder takes (proto_columns.py) is not parsed with upb at all.
        """
        import pyarrow as pa

        compiled = self._decode_compiled(payloads, struct_type)
        if compiled is not None:
            return compiled
        n = len(payloads)
        main: DecoderKey | None = None
        rows: list[int] = []
        messages: list[Message] = []
        prefixes: list[bytes | None] = [None] * n
        raws: list[bytes | None] = [None] * n
        others: dict[int, dict[str, Any]] = {}
        # Envelope → (decoder key, parse, envelope) for the common 6-byte envelope (message index [0]): a batch's
        # payloads mostly share one, so it is parsed once, not once per payload.
        heads: dict[bytes, tuple[DecoderKey, Callable[[bytes], Message], bytes]] = {}
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            try:
                hit = heads.get(payload[:6])
                if hit is None:
                    key, message, prefix = self._parse(payload)
                    if prefix is not None and len(prefix) == 6:
                        heads[prefix] = (key, self._decoders[key].parse, prefix)
                else:
                    key, parse, prefix = hit
                    message = parse(payload[6:])
            except RegistryUnavailableError:
                raise
            except Exception as exc:
                others[i] = error_row(exc, payload)
                continue
            if main is None:
                main = key
            if key == main:
                rows.append(i)
                messages.append(message)
                prefixes[i] = prefix
                if self._keeps_raw(key, message, payload, prefix):
                    raws[i] = payload
            else:
                others[i] = self.decode(payload) or {}
        try:
            filled = column_values(self._decoders[main].parts, messages) if main is not None else {}
        except Exception:  # some message does not convert: find which, row by row
            return self.decode_each(payloads, struct_type)
        try:
            return side_array(struct_type, payloads, rows, filled, prefixes, raws, others)
        except (pa.ArrowException, ValueError, OverflowError, TypeError):  # a value its column cannot hold: row by row
            return self.decode_each(payloads, struct_type)

    def _decode_compiled(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray | None:
        """decode_many's answer through the compiled decoder, or None: a null payload, payloads of several decoder
        keys, a key that does not resolve, a message it does not cover or a batch it is not sure of."""
        import pyarrow as pa

        if not COMPILED or not payloads or payloads[0] is None:
            return None
        n = len(payloads)
        bodies: list[bytes | None]
        prefixes: list[bytes | None]
        envelope = parse_envelope(payloads[0])
        if envelope is not None and envelope[2] == 6:
            # The common envelope (message index [0], written as one byte 0): parse_envelope reads only these 6
            # bytes, so every payload that starts with them has the same key; the C decoder checks that they do
            # (and that none is null) and skips them.
            head = payloads[0][:6]
            main: DecoderKey | None = (envelope[0], tuple(envelope[1]))
            bodies, prefixes = payloads, [head] * n
        else:
            head, main, bodies, prefixes = b"", None, [], []
            for payload in payloads:
                if payload is None:
                    return None
                found = parse_envelope(payload)
                prefix: bytes | None = None
                if found is None:
                    key: DecoderKey = (self.decoding.latest_id, None)
                else:
                    key, prefix = (found[0], tuple(found[1])), payload[: found[2]]
                if main is None:
                    main = key
                elif key != main:
                    return None
                bodies.append(payload if prefix is None else payload[len(prefix) :])
                prefixes.append(prefix)
        assert main is not None
        try:
            decoded = self._decoder(*main)
        except RegistryUnavailableError:
            raise
        except Exception:  # an unknown schema id, another message than the table's: upb's path makes error rows
            return None
        cache = (main, struct_type)
        if cache not in self._column_decoders:
            self._column_decoders[cache] = ColumnDecoder.for_message(decoded.descriptor, self.decoding.column,
                                                                     struct_type)
        columns = self._column_decoders[cache]
        filled = columns.decode(bodies, head) if columns is not None else None
        if filled is None:
            return None
        # Every body is what upb would re-serialize: an enveloped value of an invertible message rebuilds it.
        drop = not self._always_raw and decoded.invertible and main[1] is not None
        raws: list[bytes | None] = [None] * n if drop else list(payloads)
        try:
            return side_array(struct_type, payloads, range(n), filled, prefixes, raws, {})
        except (pa.ArrowException, ValueError, OverflowError, TypeError):
            return None  # a value its column cannot hold: upb's path decides

    def decode_each(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray:
        """decode_many's answer reached payload by payload (sides.each_row)."""
        return each_row(self.decode, payloads, struct_type)

