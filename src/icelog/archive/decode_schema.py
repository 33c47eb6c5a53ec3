"""Decoding archives of topics with a schema, Avro, JSON or Protobuf (runs in Spark's Python workers).

The raw decoder (decode.py) turns stored batches into Arrow rows of the raw layout; this module replaces
their `key` and `value` structs by the decoded payloads (schema/codec/sides.py picks the decoder of the
side's schema type) and keeps `headers` and `kafka` as they are. Topics without a schema never come here,
so the raw path keeps its speed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from icelog.archive.decode import decode_archive
from icelog.archive.intake_source import ChunkSource
from icelog.archive.plan import PlannedArchive
from icelog.schema.codec.proto_decode import ProtoSideDecoder
from icelog.schema.codec.record_decode import RecordSideDecoder
from icelog.schema.codec.sides import SideDecoder, SideDecoding
from icelog.schema.compiled import PROTOBUF
from icelog.table.arrow import struct_array
from icelog.table.iceberg_types import RAW

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.table.arrow import ArrowArray


def side_decoder(decoding: SideDecoding) -> SideDecoder:
    """The decoder of the side's schema type."""
    if decoding.schema_type == PROTOBUF:
        return ProtoSideDecoder(decoding)
    return RecordSideDecoder(decoding)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch is decoded (on again after, if it was on).

    Decoding a batch allocates a few objects per value and keeps them all until its Arrow arrays are built, so
    the collector would walk the growing heap again and again, for nothing: decoded values form no cycles. In
    the Spark worker, not in the codecs, which the broker also calls.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def cached_decoder(cache: dict[str, SideDecoder], side: str, decoding: SideDecoding) -> SideDecoder:
    """The side's decoder from a task's cache, built on first use (message classes and codecs are built once)."""
    if side not in cache:
        cache[side] = side_decoder(decoding)
    return cache[side]


def _side_array(raw_struct: pa.StructArray, decoder: SideDecoder | None, target: pa.DataType) -> ArrowArray:
    import pyarrow as pa

    payloads = raw_struct.field(RAW)
    if decoder is None:
        if raw_struct.type == target:
            return raw_struct
        rows: list[dict[str, bytes] | None] = [None if p is None else {RAW: p} for p in payloads.to_pylist()]
        return pa.array(rows, type=target)
    assert isinstance(target, pa.StructType)  # a side's column is a struct
    with gc_paused():
        return decoder.decode_many(payloads.to_pylist(), target)


def decode_archive_schema(
    intake_dir: str | Path | ChunkSource,
    archive: PlannedArchive,
    key: SideDecoding | None,
    value: SideDecoding | None,
    schema: pa.Schema,
    decoders: dict[str, SideDecoder] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of one archive in the table's schema (`schema`, from iceberg_types.arrow_schema).

    `decoders` caches SideDecoders across the archives of one task (message classes are built once).
    """
    import pyarrow as pa

    cache = decoders if decoders is not None else {}
    sides = {name: None if decoding is None else cached_decoder(cache, name, decoding)
             for name, decoding in (("key", key), ("value", value))}
    for batch in decode_archive(intake_dir, archive):
        arrays = [
            _side_array(struct_array(batch.column(0)), sides["key"], schema.field("key").type),
            _side_array(struct_array(batch.column(1)), sides["value"], schema.field("value").type),
            batch.column(2).cast(schema.field("headers").type),
            batch.column(3).cast(schema.field("kafka").type),
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
