"""Decoding stored record batches into Arrow rows of the archive layout (runs in Spark's Python workers).

Records are read by icelog's one record-batch reader, `icelog.records.walk.read_batch`: compiled
(`_records.c`), with its pure-Python twin as the fallback (bench/archive_bench.py measures both). Both
handle every codec (gzip, snappy, lz4, zstd).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from icelog.archive.intake_source import ChunkSource, source_of
from icelog.archive.plan import PlannedArchive
from icelog.errors import IcelogError
from icelog.records.batch import iter_stored_batches
from icelog.records.record_format import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    ATTRIBUTES_LOW_BYTE,
    CRC,
    HEADER_SIZE,
    INT64,
    PRODUCER_ID,
    UINT32,
    batch_crc,
)
from icelog.records.walk import COMPILED, Record, read_batch

if TYPE_CHECKING:
    import pyarrow as pa

ROWS_PER_ARROW_BATCH = 65536

# The record timestamps (ms) a table row can hold: years 1 to 9999, what every reader takes (Spark SQL's range,
# Python's datetime: pyiceberg's column statistics, pyarrow's to_pylist). Iceberg's own type (microseconds in a
# long) reaches year 294247, but a value past 9999 fails pyiceberg's statistics when a file is written and Spark SQL
# readers. A batch with a timestamp outside goes to the dead-letter table (Kafka allows any long once a topic widens
# message.timestamp.before.max.ms / after.max.ms).
TABLE_MIN_TIMESTAMP_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
TABLE_MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def timestamp_problem(timestamps: Sequence[int]) -> str | None:
    """Why a batch's record timestamps (ms) cannot all be rows of an Iceberg table, or None if they can.

    The one check of the archive's decoder and of `find_dead_letters`, so a batch the decoder refuses is one the
    driver dead-letters."""
    if not timestamps:
        return None
    low, high = min(timestamps), max(timestamps)
    if low >= TABLE_MIN_TIMESTAMP_MS and high <= TABLE_MAX_TIMESTAMP_MS:
        return None
    bad = high if high > TABLE_MAX_TIMESTAMP_MS else low
    return (f"record timestamp {bad} ms is outside the years 1 to 9999 a table's timestamp holds for every reader "
            f"({TABLE_MIN_TIMESTAMP_MS} to {TABLE_MAX_TIMESTAMP_MS} ms)")


class _Columns:
    """Column buffers of up to ROWS_PER_ARROW_BATCH rows."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_offsets: list[int] = [0]
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.event_us: list[int] = []
        self.ingest_us: list[int] = []
        self.batch_starts: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, records: Sequence[Record], ingest_us: int, batch_start: int) -> None:
        """Append records of one batch (at least one), a column at a time."""
        offsets, timestamps, keys, values, headers = zip(*records, strict=True)
        problem = timestamp_problem(timestamps)
        if problem is not None:
            raise UndecodableBatchError(f"offset {offsets[0]}: {problem}")
        n = len(offsets)
        self.offsets += offsets
        self.keys += keys
        self.values += values
        self.event_us += [timestamp * 1000 for timestamp in timestamps]
        self.ingest_us += [ingest_us] * n
        self.batch_starts += [batch_start] * n
        if any(headers):
            for record_headers in headers:
                for hkey, hvalue in record_headers:
                    self.header_keys.append(hkey)
                    self.header_values.append(hvalue)
                self.header_offsets.append(len(self.header_keys))
        else:
            self.header_offsets += [len(self.header_keys)] * n

    def to_arrow(self, partition: int) -> pa.RecordBatch:
        import pyarrow as pa

        from icelog.table.layout import arrow_schema

        schema = arrow_schema()
        n = len(self.offsets)

        def raw_struct(items: list[bytes | None], field: pa.Field[pa.StructType]) -> pa.StructArray:
            raw = pa.array(items, pa.binary())
            return pa.StructArray.from_arrays([raw], fields=list(field.type), mask=raw.is_null())

        header_struct = pa.StructArray.from_arrays(
            [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
            fields=list(schema.field("headers").type.value_type),
        )
        headers = pa.ListArray.from_arrays(
            pa.array(self.header_offsets, pa.int32()), header_struct, type=schema.field("headers").type
        )
        ts_type = pa.timestamp("us", tz="UTC")
        kafka = pa.StructArray.from_arrays(
            [
                pa.array([partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.event_us, pa.int64()).cast(ts_type),
                pa.array(self.ingest_us, pa.int64()).cast(ts_type),
                pa.array(self.batch_starts, pa.int64()),
            ],
            fields=list(schema.field("kafka").type),
        )
        return pa.RecordBatch.from_arrays(
            [
                raw_struct(self.keys, schema.field("key")),
                raw_struct(self.values, schema.field("value")),
                headers,
                kafka,
            ],
            schema=schema,
        )


@dataclass(frozen=True)
class DeadLetter:
    """A stored batch the archive cannot decode: it goes to the dead-letter table, its offsets are passed."""

    partition: int
    base_offset: int
    last_offset: int
    batch: bytes
    error: str


def _archive_batches(source: ChunkSource, archive: PlannedArchive) -> Iterator[tuple[bytes, int, int, str, int]]:
    """(batch bytes, base offset, last offset, error, ingest ms) of the archive's data batches, in offset order.

    Control batches, aborted transactions' batches and batches outside [start, end) are left out. Bytes
    whose batch framing is broken (a length running past the chunk) come out once, to the chunk's end,
    with a framing error; a batch whose CRC-32C no longer matches its bytes (changed on disk after the broker
    checked it at produce) comes out with that error; dead letters named by the plan (`archive.dead_letters`)
    are left out.
    """
    start, end = archive.start_offset, archive.end_offset
    skip = set(archive.dead_letters)
    for ref, view in source.chunks(archive):
        previous_end = ref.base_offset
        for pos, size, base, last in iter_stored_batches(view):
            if size < HEADER_SIZE or pos + size > len(view) or not previous_end <= base <= last:
                # The framing is broken: nothing after this point can be told apart. One dead letter,
                # from the last good batch to the chunk's end.
                first = max(previous_end, start)
                if first < min(ref.end_offset, end) and first not in skip:
                    error = f"broken batch framing at byte {pos} of the chunk (length {size}, base {base})"
                    yield bytes(view[pos:]), first, min(ref.end_offset, end) - 1, error, ref.ingest_ms
                break
            previous_end = last + 1
            if last < start or base >= end or base in skip:
                continue
            attributes = view[pos + ATTRIBUTES_LOW_BYTE]
            if attributes & ATTR_CONTROL:
                continue
            if attributes & ATTR_TRANSACTIONAL and archive.aborted:
                producer_id = INT64.unpack_from(view, pos + PRODUCER_ID)[0]
                if any(pid == producer_id and first <= base <= last for pid, first, last in archive.aborted):
                    continue  # an aborted transaction's records are not records of the topic
            stored, computed = UINT32.unpack_from(view, pos + CRC)[0], batch_crc(view, pos, size)
            error = "" if stored == computed else (
                f"CRC-32C mismatch: the batch says {stored:#010x}, its bytes give {computed:#010x} (changed on disk "
                "after the broker accepted it)")
            yield bytes(view[pos : pos + size]), base, last, error, ref.ingest_ms


def find_dead_letters(
    intake_dir: str | Path | ChunkSource, archive: PlannedArchive, compiled: bool = COMPILED
) -> list[DeadLetter]:
    """The batches of an archive that cannot be decoded (checked in the driver, after a write failed)."""
    out: list[DeadLetter] = []
    for data, base, last, error, _ingest_ms in _archive_batches(source_of(intake_dir), archive):
        if not error:
            try:
                # what decode_archive reads and checks, so that what passes here decodes there
                error = timestamp_problem([record[1] for record in read_batch(data, compiled).records]) or ""
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:2000]
        if error:
            out.append(DeadLetter(archive.partition, base, last, data, error))
    return out


def decode_archive(
    intake_dir: str | Path | ChunkSource, archive: PlannedArchive, compiled: bool = COMPILED
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches holding the records of one archive, in offset order.

    Control batches (transaction markers) are not records and are skipped; so are records outside
    [start_offset, end_offset) and the batches the plan sends to the dead-letter table. A batch that
    cannot be decoded raises (the driver then finds it with find_dead_letters).
    """
    cols = _Columns()
    start, end = archive.start_offset, archive.end_offset
    for data, base, last, error, ingest_ms in _archive_batches(source_of(intake_dir), archive):
        if error:
            raise UndecodableBatchError(f"partition {archive.partition} offset {base}: {error}")
        ingest_us = ingest_ms * 1000
        records = read_batch(data, compiled).records
        if base < start or last >= end:  # a stored batch's records are offsets base..last (checked at produce)
            records = [record for record in records if start <= record[0] < end]
        taken = 0
        while taken < len(records):  # Arrow batches of exactly ROWS_PER_ARROW_BATCH rows, the last one less
            room = ROWS_PER_ARROW_BATCH - len(cols)
            part = records if taken == 0 and len(records) <= room else records[taken : taken + room]
            cols.add(part, ingest_us, base)
            taken += len(part)
            if len(cols) >= ROWS_PER_ARROW_BATCH:
                yield cols.to_arrow(archive.partition)
                cols = _Columns()
    if len(cols):
        yield cols.to_arrow(archive.partition)


class UndecodableBatchError(IcelogError):
    """A stored batch whose framing or records cannot be decoded (it belongs in the dead-letter table)."""


# The pass's decoder of one archive (decode_archive, or its schema or table layout variant), run in the driver.
ArchiveDecoder = Callable[[PlannedArchive], Iterator["pa.RecordBatch"]]


def _decode_failure(decode: ArchiveDecoder, archive: PlannedArchive) -> str | None:
    """Why `decode` fails on `archive` (its rows all built), or None if it does not; a retriable error (the
    schema registry down) is not the archive's fault and is raised."""
    try:
        for _ in decode(archive):
            pass
    except Exception as exc:
        if isinstance(exc, IcelogError) and exc.retriable:
            raise
        return f"{type(exc).__name__}: {exc}"[:2000]
    return None


def find_failing_batch(
    intake_dir: str | Path | ChunkSource, archive: PlannedArchive, decode: ArchiveDecoder
) -> DeadLetter | None:
    """The first stored batch of `archive` on which the pass's own decoder fails, run here in the driver: the
    fallback when a worker failed for good and `find_dead_letters` (the batch checks) found nothing, so that a
    non-retriable failure is isolated to the batch that causes it instead of failing every pass. None if the
    whole archive decodes here (the failure was elsewhere: writing the file, the worker's environment).

    Bisects on prefixes of the archive's batches: log2(batches) decodes of at most the archive.
    """
    error = _decode_failure(decode, archive)
    if error is None:
        return None
    source = source_of(intake_dir)
    spans = [(base, last) for _data, base, last, _error, _ingest in _archive_batches(source, archive)]
    if not spans:
        return None
    low, high = 0, len(spans) - 1  # the first k whose prefix 0..k fails: the prefix 0..high fails
    while low < high:
        middle = (low + high) // 2
        narrowed = dataclasses.replace(archive, end_offset=min(archive.end_offset, spans[middle][1] + 1))
        found = _decode_failure(decode, narrowed)
        if found is None:
            low = middle + 1
        else:
            high, error = middle, found
    base, last = spans[low]
    alone = dataclasses.replace(archive, start_offset=max(archive.start_offset, base),
                                end_offset=min(archive.end_offset, last + 1))
    error = _decode_failure(decode, alone) or error
    data = next(d for d, b, _last, _error, _ingest in _archive_batches(source, alone) if b == base)
    return DeadLetter(archive.partition, base, last, data, f"the archive's decoder failed on it: {error}")
