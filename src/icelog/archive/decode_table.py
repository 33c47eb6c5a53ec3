"""Decoding archives into the `table` layout (Fluss's; table/layout.py), in Spark's Python workers.

The raw decoder (decode.py) gives rows of the record layout; this module spreads them over the table's
top-level columns: a side with a schema is decoded by the same SideDecoder as the record layout (so a row
keeps exactly the bytes the record layout would: __value when the columns do not provably rebuild the
payload), and its struct's fields become columns; the key's bytes always go to __key; headers to
__headers; kafka.partition / offset / event_timestamp / batch_start to __bucket / __offset / __timestamp /
__batch_start. Columns the table has but this batch does not fill (fields deleted by evolution) are null.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from icelog.archive.decode import decode_archive
from icelog.archive.decode_schema import cached_decoder, gc_paused
from icelog.archive.intake_source import ChunkSource
from icelog.archive.plan import PlannedArchive
from icelog.schema.codec.sides import SideDecoder, SideDecoding
from icelog.table.arrow import struct_array
from icelog.table.config import (
    BATCH_START,
    BUCKET,
    HEADERS,
    KEY_BYTES,
    KEY_ERR,
    OFFSET,
    TIMESTAMP,
    VALUE_BYTES,
    VALUE_ERR,
    VALUE_PREFIX,
)
from icelog.table.iceberg_types import ERR, PREFIX, RAW

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray

_EXTRA = (PREFIX, ERR, RAW)
# Where a side's __prefix__ / __err__ / __raw__ go in the table (the key's prefix is inside __key already).
_SIDE_COLUMNS = {
    "key": {ERR: KEY_ERR, RAW: KEY_BYTES},
    "value": {PREFIX: VALUE_PREFIX, ERR: VALUE_ERR, RAW: VALUE_BYTES},
}


def _side_type(decoding: SideDecoding, schema: pa.Schema) -> pa.StructType:
    """The Arrow struct a SideDecoder fills for one side: its columns' table types, then the three extras."""
    import pyarrow as pa

    fields = [schema.field(c.name) for c in decoding.column.children if c.name not in _EXTRA]
    fields += [pa.field(PREFIX, pa.binary()), pa.field(ERR, pa.string()), pa.field(RAW, pa.binary())]
    return pa.struct(fields)


def decode_archive_table(
    intake_dir: str | Path | ChunkSource,
    archive: PlannedArchive,
    key: SideDecoding | None,
    value: SideDecoding | None,
    schema: pa.Schema,
    decoders: dict[str, SideDecoder] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of one archive in the table layout's schema (iceberg_types.arrow_schema)."""
    import pyarrow as pa

    cache = decoders if decoders is not None else {}
    sides = [
        (name, column, decoding, cached_decoder(cache, name, decoding), _side_type(decoding, schema))
        for name, column, decoding in (("key", 0, key), ("value", 1, value))
        if decoding is not None
    ]
    for batch in decode_archive(intake_dir, archive):
        kafka = struct_array(batch.column(3))
        columns: dict[str, ArrowArray] = {
            KEY_BYTES: struct_array(batch.column(0)).field(RAW),
            VALUE_BYTES: struct_array(batch.column(1)).field(RAW),
            HEADERS: batch.column(2),
            BATCH_START: kafka.field("batch_start"),
            BUCKET: kafka.field("partition"),
            OFFSET: kafka.field("offset"),
            TIMESTAMP: kafka.field("event_timestamp"),
        }
        for name, index, _decoding, decoder, side_type in sides:
            with gc_paused():
                decoded = decoder.decode_many(struct_array(batch.column(index)).field(RAW).to_pylist(), side_type)
            renamed = _SIDE_COLUMNS[name]
            for field, array in zip(side_type, decoded.flatten(), strict=True):
                if field.name in _EXTRA:
                    if field.name in renamed:
                        columns[renamed[field.name]] = array
                else:
                    columns[field.name] = array
        arrays = [
            columns[f.name].cast(f.type) if f.name in columns else pa.nulls(batch.num_rows, f.type) for f in schema
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
