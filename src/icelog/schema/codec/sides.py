"""What a Spark worker needs to decode one side (key or value) of a topic, and the decoder for its schema type.

The driver ships a `SideDecoding` (the compiled schemas by id, the side's struct column, the latest schema
id, for Protobuf the table's message); archive/decode_schema.py's `side_decoder` picks the decoder of its
schema type: proto_decode.ProtoSideDecoder (Protobuf: message indexes, message classes) or
record_decode.RecordSideDecoder (Avro and JSON Schema: one top-level type per schema). Both fill the side's
struct: the schema's field columns plus `__prefix__` (the envelope bytes), `__err__` (why a payload did not
decode) and `__raw__` (the payload, kept unless the row provably rebuilds it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from icelog.schema.codec.registry_source import SourceSpec
from icelog.schema.compiled import PROTOBUF, CompiledSchema
from icelog.table.arrow import struct_array
from icelog.table.iceberg_types import ERR, PREFIX, RAW, Column

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray


@dataclass(frozen=True)
class SideDecoding:
    """What a worker needs to decode one side of a topic (picklable)."""

    side: str
    column: Column  # the side's struct column (current, non-deleted columns)
    latest_id: int
    schemas: dict[int, CompiledSchema]  # schema id → compiled schema (every version of the subject the driver had)
    message_name: str | None = None  # Protobuf: the table's message (payloads of another message are __err__ rows)
    source: SourceSpec | None = None  # where schema ids not shipped are read (None: nowhere)
    schema_type: str = PROTOBUF


class SideDecoder(Protocol):
    """Payloads of one side → the side's struct values."""

    def decode(self, payload: bytes | None) -> dict[str, object] | None:
        """The side's struct value for one payload (None for a null payload)."""

    def decode_many(self, payloads: list[bytes | None], struct_type: pa.StructType) -> pa.StructArray:
        """An Arrow struct array of many payloads."""


def error_row(exc: Exception, payload: bytes) -> dict[str, object]:
    """The row of a payload that does not decode: only __err__ and __raw__."""
    return {ERR: f"{type(exc).__name__}: {exc}"[:1000] or type(exc).__name__, RAW: payload}


def each_row(decode: Callable[[bytes | None], Mapping[str, object] | None], payloads: Sequence[bytes | None],
             struct_type: pa.StructType) -> pa.StructArray:
    """A side's struct array reached payload by payload: a decoder's fallback, and the reference its batch path
    must equal. A row holding a value its column cannot (fastavro reads an Avro int of any width, a Protobuf
    Timestamp may be past what 64-bit microseconds hold, json.loads lets a lone surrogate into a string) is a row
    that did not decode, `__err__` and the payload:
    one such record never fails the task (which a retry would fail again, stalling the partition)."""
    import pyarrow as pa

    rows = [decode(p) for p in payloads]
    try:
        return struct_array(pa.array(rows, type=struct_type))
    except (pa.ArrowException, ValueError, OverflowError, TypeError):
        pass
    for i, (payload, row) in enumerate(zip(payloads, rows, strict=True)):
        try:
            pa.array([row], type=struct_type)
        except (pa.ArrowException, ValueError, OverflowError, TypeError) as exc:
            assert payload is not None  # a null payload's row is null
            rows[i] = error_row(exc, payload)
    return struct_array(pa.array(rows, type=struct_type))


def side_array(
    struct_type: pa.StructType,
    payloads: Sequence[bytes | None],
    rows: Sequence[int],
    filled: Mapping[str, Sequence[object] | ArrowArray],
    prefixes: list[bytes | None],
    raws: list[bytes | None],
    others: Mapping[int, Mapping[str, object] | None],
) -> pa.StructArray:
    """A side's Arrow struct array: the main rows' values from `filled` (column name → values, one per index in
    `rows`; an Arrow array when every payload is a main row), the other rows (other schemas, errors) from their
    dicts, `__prefix__` and `__raw__` as given."""
    import pyarrow as pa

    n = len(payloads)
    arrays = []
    for field in struct_type:
        name = field.name
        if name == PREFIX:
            column: list[object] = list(prefixes)
        elif name == RAW:
            column = list(raws)
        elif len(rows) == n and name in filled:  # every payload is a main row: the codec's column as is
            values = filled[name]
            if isinstance(values, pa.Array):  # the compiled Avro decoder's (avro_columns.py)
                arrays.append(values if values.type == field.type else values.cast(field.type))
                continue
            column = list(values) if not isinstance(values, list) else values
        else:
            column = [None] * n
            for i, value in zip(rows, filled.get(name, ()), strict=False):  # (lists: arrays only come for all rows)
                column[i] = value
        for i, row in others.items():
            column[i] = None if row is None else row.get(name)
        arrays.append(pa.array(column, type=field.type))
    mask = pa.array([p is None for p in payloads], type=pa.bool_())
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=mask)
