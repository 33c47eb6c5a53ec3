"""Decoding one side of archived records with its Avro or JSON schema, in Spark's Python workers.

Confluent's envelope for Avro and JSON Schema is the magic byte 0 and the schema id (4 bytes, big-endian);
the body follows (no message indexes: such a schema has one top-level type). A payload with an envelope is
decoded with the schema its id names (shipped by the driver, else read from the schema source once per
task); one without, with the subject's latest schema. Rows are built by avro_codec.AvroRows /
json_codec.JSONRows, column by column for the batch's most common schema id.

What keeps the produced bytes (`__raw__`):
  - Avro: binary Avro is canonical, so a value row whose payload had an envelope and whose columns hold
    every field of its writer schema (`invertible`) is re-encoded from the row on read-back; `__raw__` is
    kept null only when that re-encoding was checked to give the very same bytes.
  - JSON: the text's spelling (whitespace, key order, number forms, escapes) is not in the row, so `__raw__`
    is always kept.
  - keys: always kept (Kafka compares keys byte for byte).
A registry that cannot be reached raises RegistryUnavailableError: the task and the pass fail (retried).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from icelog.schema.avro_schema import AvroSchema
from icelog.schema.codec import json_columns
from icelog.schema.codec.avro_codec import AvroRows
from icelog.schema.codec.avro_columns import ColumnDecoder
from icelog.schema.codec.json_codec import JSONRows
from icelog.schema.codec.registry_source import SchemaSource, open_source
from icelog.schema.codec.sides import SideDecoding, each_row, error_row, side_array
from icelog.schema.compiled import AVRO, CompiledSchema
from icelog.schema.json_schema import JSONSchema
from icelog.schema.registry_client import RegistryUnavailableError
from icelog.table.iceberg_types import PREFIX, RAW, Column

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray

ENVELOPE_BYTES = 5  # magic byte 0 + schema id


class Rows(Protocol):
    """A schema's rows codec (AvroRows, JSONRows)."""

    def decode(self, body: bytes) -> dict[str, object]: ...

    def decode_many(self, bodies: Sequence[bytes]) -> dict[str, list[object]]: ...


def split_envelope(payload: bytes) -> tuple[int, bytes, bytes] | None:
    """(schema id, envelope bytes, body) of a payload in Confluent's Avro/JSON framing, or None without one."""
    if len(payload) < ENVELOPE_BYTES or payload[0] != 0:
        return None
    return struct.unpack_from(">I", payload, 1)[0], payload[:ENVELOPE_BYTES], payload[ENVELOPE_BYTES:]


def rows_codec(schema: CompiledSchema, column: Column) -> AvroRows | JSONRows:
    """The rows codec of an Avro or JSON schema for a side's struct column."""
    if isinstance(schema, AvroSchema):
        return AvroRows(schema, column)
    if isinstance(schema, JSONSchema):
        return JSONRows(schema, column)
    raise TypeError("a Protobuf schema in an Avro/JSON side (the subject changed type)")


class RecordSideDecoder:
    """Decodes Avro or JSON payloads of one side; caches a rows codec per schema id."""

    def __init__(self, decoding: SideDecoding) -> None:
        self.decoding = decoding
        self._codecs: dict[int, AvroRows | JSONRows] = {}
        self._column_decoders: dict[tuple[int, pa.StructType], ColumnDecoder | None] = {}
        self._json_decoders: dict[tuple[int, pa.StructType], json_columns.ColumnDecoder | None] = {}
        self._source: SchemaSource | None = None
        self._may_drop_raw = decoding.side == "value" and decoding.schema_type == AVRO

    def _codec(self, schema_id: int) -> AvroRows | JSONRows:
        found = self._codecs.get(schema_id)
        if found is None:
            schema = self.decoding.schemas.get(schema_id)
            if schema is None:
                if self.decoding.source is None:
                    raise LookupError(f"schema id {schema_id} is unknown and no registry is configured")
                if self._source is None:
                    self._source = open_source(self.decoding.source)
                schema = self._source.by_id(schema_id)  # RegistryUnavailableError propagates: the pass fails
            found = self._codecs[schema_id] = rows_codec(schema, self.decoding.column)
        return found

    def _split(self, payload: bytes) -> tuple[int, bytes | None, bytes]:
        envelope = split_envelope(payload)
        if envelope is None:
            return self.decoding.latest_id, None, payload
        return envelope

    def _keeps_raw(self, codec: AvroRows | JSONRows, row: Mapping[str, object], prefix: bytes | None,
                   body: bytes) -> bool:
        if not self._may_drop_raw or prefix is None or not isinstance(codec, AvroRows) or not codec.invertible:
            return True
        try:
            return codec.encode(row) != body
        except Exception:  # a row that does not encode back: keep the bytes
            return True

    def decode(self, payload: bytes | None) -> dict[str, object] | None:
        """The side's struct value for one payload (None for a null payload)."""
        if payload is None:
            return None
        try:
            schema_id, prefix, body = self._split(payload)
            codec = self._codec(schema_id)
            row = codec.decode(body)
        except RegistryUnavailableError:
            raise  # an outage is not a property of the payload: fail the task, retry the pass
        except Exception as exc:  # a payload that does not decode is data, not a failed pass
            return error_row(exc, payload)
        row[PREFIX] = prefix
        row[RAW] = payload if self._keeps_raw(codec, row, prefix, body) else None
        return row

    def _column_decoder(self, schema_id: int, codec: AvroRows, struct_type: pa.StructType) -> ColumnDecoder | None:
        key = (schema_id, struct_type)
        if key not in self._column_decoders:
            self._column_decoders[key] = ColumnDecoder.for_schema(codec.writer, self.decoding.column, struct_type)
        return self._column_decoders[key]

    def _json_decoder(self, schema_id: int, codec: JSONRows, struct_type: pa.StructType
                      ) -> json_columns.ColumnDecoder | None:
        key = (schema_id, struct_type)
        if key not in self._json_decoders:
            self._json_decoders[key] = json_columns.ColumnDecoder.for_rows(codec, struct_type)
        return self._json_decoders[key]

    def decode_many(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray:
        """An Arrow struct array of many payloads: the most common schema id's rows column by column (Avro and
        JSON batches of one schema id through the compiled decoders, avro_columns.py and json_columns.py, where
        they cover the schema)."""
        import pyarrow as pa

        taken = self._decode_json_compiled(payloads, struct_type)
        if taken is not None:
            return taken
        n = len(payloads)
        main: int | None = None
        rows: list[int] = []
        bodies: list[bytes] = []
        prefixes: list[bytes | None] = [None] * n
        others: dict[int, dict[str, object] | None] = {}
        heads: dict[bytes, int] = {}  # envelope → schema id: a batch's payloads mostly share one
        latest = self.decoding.latest_id
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            head = payload[:ENVELOPE_BYTES]
            prefix: bytes | None = head
            found = heads.get(head)
            if found is not None:
                schema_id, body = found, payload[ENVELOPE_BYTES:]
            elif len(head) == ENVELOPE_BYTES and head[0] == 0:  # split_envelope's rule
                schema_id = heads[head] = struct.unpack_from(">I", head, 1)[0]
                body = payload[ENVELOPE_BYTES:]
            else:
                schema_id, prefix, body = latest, None, payload
            if main is None:
                main = schema_id
            if schema_id == main:
                rows.append(i)
                bodies.append(body)
                prefixes[i] = prefix
            else:
                others[i] = self.decode(payload)
        rebuilt: list[bool] | None = None  # per main row: whether its row rebuilds its body exactly
        try:
            codec = self._codec(main) if main is not None else None
            compiled: ColumnDecoder | json_columns.ColumnDecoder | None = None
            if main is not None and isinstance(codec, AvroRows) and len(rows) == n:
                compiled = self._column_decoder(main, codec, struct_type)
            elif (main is not None and isinstance(codec, JSONRows) and len(rows) == n and prefixes[0] is None
                  and json_columns.COMPILED):  # (with an envelope, _decode_json_compiled had the batch)
                compiled = self._json_decoder(main, codec, struct_type)
            columns = compiled.decode(bodies) if compiled is not None else None
            filled: Mapping[str, Sequence[object] | ArrowArray]
            if codec is None:
                filled = {}
            elif columns is not None:
                # the compiled decoder took the batch; an Avro batch is canonical (every row rebuilds its body), a JSON
                # one keeps its bytes
                filled = columns
                if self._may_drop_raw and isinstance(codec, AvroRows) and codec.invertible:
                    rebuilt = [True] * n
            elif self._may_drop_raw and isinstance(codec, AvroRows) and codec.invertible:
                filled, rebuilt = codec.decode_many_rebuilt(bodies)
            else:
                filled = codec.decode_many(bodies)
        except RegistryUnavailableError:
            raise
        except Exception:  # some payload does not decode (or the schema id is unknown): row by row
            return self.decode_each(payloads, struct_type)
        raws: list[bytes | None] = [None] * n
        for j, i in enumerate(rows):
            # __raw__ is dropped only for an enveloped payload whose row was checked to rebuild it
            raws[i] = None if rebuilt is not None and prefixes[i] is not None and rebuilt[j] else payloads[i]
        try:
            return side_array(struct_type, payloads, rows, filled, prefixes, raws, others)
        except (pa.ArrowException, ValueError, OverflowError, TypeError):  # a value its column cannot hold: row by row
            return self.decode_each(payloads, struct_type)

    def _decode_json_compiled(self, payloads: list[bytes | None], struct_type: pa.StructType
                              ) -> pa.StructArray | None:
        """decode_many's answer for a JSON batch whose payloads all carry the first one's envelope, through the
        compiled decoder (which checks and skips the envelope in C: no Python loop over the payloads); None for any
        other batch, one the compiled decoder does not cover or is not sure of (decode_many then decodes it)."""
        import pyarrow as pa

        if not json_columns.COMPILED or not payloads or payloads[0] is None:
            return None
        envelope = split_envelope(payloads[0])
        if envelope is None:
            return None
        schema_id, head, _ = envelope
        try:
            codec = self._codec(schema_id)
        except RegistryUnavailableError:
            raise
        except Exception:  # an unknown schema id: decode_many's path makes error rows
            return None
        if not isinstance(codec, JSONRows):
            return None
        compiled = self._json_decoder(schema_id, codec, struct_type)
        columns = compiled.decode(payloads, head) if compiled is not None else None
        if columns is None:
            return None
        n = len(payloads)
        try:  # JSON rows keep their bytes: __raw__ is the payload
            return side_array(struct_type, payloads, range(n), columns, [head] * n, list(payloads), {})
        except (pa.ArrowException, ValueError, OverflowError, TypeError):
            return None  # (a bug: every column is built as its Arrow type)

    def decode_each(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray:
        """decode_many's answer reached payload by payload with fastavro (sides.each_row)."""
        return each_row(self.decode, payloads, struct_type)
