"""One archived partition as an offset range source of the log: its files from the table's plan, read with pyarrow.

Planning: the partition's data files come from the table's plan (readback/plan.py: one per table and snapshot,
shared by its partitions; the partition column, kafka.partition or the table layout's __bucket, selects a file by
identity partition or by file statistics; delete files and deletion vectors ride along with each file), ordered by
the file's offset lower bound; files whose offset ranges overlap (a table partitioned by value columns spreads an
archive over several) form one segment. A file's Parquet footer is read when the file is first read. Reading: a
segment's rows for the partition (pyiceberg's ArrowScan applies deletes and projects evolved schemas by field id; a
raw file without deletes is read one row group at a time with pyarrow), in offset order, become record batches
grouped by the batch start, framed lazily a chunk of rows at a time; a segment's rows and batches are cached (an
LRU bounded by bytes, shared by every partition) keyed by its data files and their delete files, which never
change, so compaction and snapshot expiry simply make other files current.
A primary-key table (deletion vectors on replaced rows) so reads back as after Kafka's log compaction.

Everything here runs on worker threads (Fetch reads off the event loop) or in the broker's background
refresh; `start_offset`/`end_offset` only read the cached plan, so the event loop can ask them.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

import numpy as np

from icelog.errors import ErrorCode, KafkaApiError
from icelog.readback.batches import header_section
from icelog.readback.columnar import as_binary, encode_batches
from icelog.readback.file_copies import FileCopies
from icelog.readback.lake import LakeTables
from icelog.readback.plan import RECORD_LAYOUT, FileSlice, Layout, TablePlan
from icelog.schema.codec.rebuild import Rebuilder, Schemas, rebuild_headers, table_side_row
from icelog.table.config import (
    BATCH_START,
    HEADERS,
    KEY_BYTES,
    OFFSET,
    SYSTEM_COLUMNS,
    TIMESTAMP,
    VALUE_BYTES,
    VALUE_ERR,
    VALUE_PREFIX,
)
from icelog.table.iceberg_types import RAW

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io import InputStream
    from pyiceberg.table import Table

    from icelog.table.arrow import ArrowArray, ArrowChunkedArray

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
# A unit read with more rows or bytes (its row groups' uncompressed, encoded bytes) than these is read in windows of
# offsets of about this size: a compaction's output can be one row group of 100+ MB of records (a dictionary-encoded
# column says far fewer bytes than it decodes to, hence the rows too), which built whole held ~1 GB for one seek.
UNIT_MAX_BYTES = 32 * 1024 * 1024
UNIT_MAX_ROWS = 32 * 1024
WINDOW_READ_ROWS = 4096  # a window's row group is decoded this many rows at a time
WINDOW_READ_BYTES = 1024 * 1024  # ... through a buffered stream: its column chunks are read as the pages are decoded


@dataclass(frozen=True)
class RowGroups:
    """Row groups read as one unit: (file's index in its segment, row group index) pairs, and when the unit is
    read in windows, the offsets [first, last] of this one (rows outside it are dropped as soon as read)."""

    groups: tuple[tuple[int, int], ...]
    window: tuple[int, int] | None = None


Unit = RowGroups | None  # None: the whole segment, deletes applied
# a segment's files and their delete files, its unit, the partition, log append time
CacheKey = tuple[tuple[tuple[str, frozenset[str]], ...], Unit, int, bool]


@dataclass(frozen=True)
class Segment:
    """Data files of the partition whose offset ranges overlap, read as one unit (usually one file).

    An archive of the record layout, or of the table layout's default spec, is one file per Kafka partition;
    with icelog.table.partition.by one archive's rows of a Kafka partition are spread over a file per
    Iceberg partition, their offsets interleaved: those files are merged in offset order.
    """

    files: tuple[FileSlice, ...]

    @property
    def lower(self) -> int:
        return min(f.lower for f in self.files)

    @property
    def upper(self) -> int:
        return max(f.upper for f in self.files)

    @property
    def max_timestamp_ms(self) -> int:
        return max(f.max_timestamp_ms for f in self.files)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def key(self) -> tuple[tuple[str, frozenset[str]], ...]:
        return tuple(f.key for f in self.files)


CHUNK_ROWS = 1024  # a segment's batches are framed in chunks of about this many rows, when first read


class BuiltFile:
    """A segment's rows, framed as record batches chunk by chunk on first read (a seek frames one chunk, not the
    row group or file); (offset, timestamp) of each row. Thread-safe: a chunk framed twice at once is the same."""

    def __init__(self, columns: Columns, log_append_time: bool) -> None:
        self.offsets, self.timestamps = columns.offsets, columns.timestamps
        self._columns: Columns | None = columns
        self._log_append_time = log_append_time
        n = len(columns.offsets)
        # Chunk bounds fall on batch boundaries (a run of rows sharing the batch start is one batch).
        runs = (np.flatnonzero(np.diff(columns.starts)) + 1).tolist() if n else []
        bounds = [0]
        for run in runs:
            if run - bounds[-1] >= CHUNK_ROWS:
                bounds.append(run)
        bounds.append(n)
        self._bounds = bounds if n else [0]
        self.chunk_lasts = [int(columns.offsets[end - 1]) for end in self._bounds[1:]]
        self._chunks: list[tuple[list[int], list[bytes]] | None] = [None] * len(self.chunk_lasts)
        self._missing = len(self._chunks)
        self._lock = threading.Lock()
        payload = sum(int(_payload_bytes(side)) for side in (columns.keys, columns.values))
        # Columns until every chunk is framed, then batches: about twice the payloads at the peak.
        self.size = 2 * payload + 40 * n + sum(len(h) for h in columns.headers or ())

    def _chunk(self, index: int) -> tuple[list[int], list[bytes]]:
        chunk = self._chunks[index]
        if chunk is not None:
            return chunk
        with self._lock:
            columns = self._columns
        if columns is None:  # framed meanwhile (the columns go once every chunk is)
            chunk = self._chunks[index]
            assert chunk is not None
            return chunk
        start, end = self._bounds[index], self._bounds[index + 1]
        framed = encode_batches(
            columns.offsets[start:end], columns.timestamps[start:end], columns.starts[start:end],
            columns.keys.slice(start, end - start), columns.values.slice(start, end - start),
            None if columns.headers is None else columns.headers[start:end], self._log_append_time,
        )
        chunk = ([last for _base, last, _batch in framed], [batch for _base, _last, batch in framed])
        with self._lock:
            if self._chunks[index] is None:
                self._chunks[index] = chunk
                self._missing -= 1
                if not self._missing:
                    self._columns = None
        return chunk

    def batches_from(self, offset: int) -> Iterator[tuple[int, bytes]]:
        """(last offset, bytes) of each batch from the one holding `offset` (or the next), in offset order."""
        for index in range(bisect.bisect_left(self.chunk_lasts, offset), len(self.chunk_lasts)):
            lasts, batches = self._chunk(index)
            for i in range(bisect.bisect_left(lasts, offset), len(batches)):
                yield lasts[i], batches[i]

    @property
    def last(self) -> int | None:
        return self.chunk_lasts[-1] if self.chunk_lasts else None


def _payload_bytes(payloads: ArrowArray) -> int:
    """Total bytes of a binary array's payloads."""
    import pyarrow.compute as pc

    total = pc.sum(pc.binary_length(payloads)).as_py()
    return int(total or 0)


class BatchCache:
    """Built segments, least recently used first out, bounded by their bytes; shared by all partitions."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: OrderedDict[CacheKey, BuiltFile] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # look-ups answered from the cache, and not (the broker's metrics read both)
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._files)

    def get(self, key: CacheKey) -> BuiltFile | None:
        with self._lock:
            built = self._files.get(key)
            if built is not None:
                self._files.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return built

    def put(self, key: CacheKey, built: BuiltFile) -> None:
        """Keep `built`, dropping the least recently used past the bound; one larger than the bound is not kept."""
        with self._lock:
            if key in self._files or built.size > self.max_bytes:
                return
            self._files[key] = built
            self._bytes += built.size
            while self._bytes > self.max_bytes and len(self._files) > 1:
                _, old = self._files.popitem(last=False)
                self._bytes -= old.size


@dataclass(frozen=True)
class _Plan:
    snapshot_id: int | None
    slices: list[Segment]
    lowers: list[int]
    layout: Layout = RECORD_LAYOUT
    covered: int | None = None  # the next offset the archive commits say the table covers (rows or not)
    table: Table | None = None  # the pyiceberg table version planned (its metadata, schema and io serve the reads)

    @property
    def start(self) -> int | None:
        return self.slices[0].lower if self.slices else None

    @property
    def end(self) -> int | None:
        """One past the last offset the table answers for: its last row, or past records it holds no row of
        (a primary-key table's tombstones and replaced records, rows deleted by an analyst) as its commits say."""
        if not self.slices:
            return None
        return max(max(s.upper for s in self.slices) + 1, self.covered or 0)


_EMPTY = _Plan(None, [], [])


class TableSource:
    """The archived offsets of one topic-partition (implements log.partition.OffsetRangeSource).

    `topic_id`: the topic's id; a table whose archive commits came from another topic (deleted, then
    re-created under the same name) is not served (nothing archived), so the new topic never reads the old rows.
    """

    def __init__(
        self, tables: LakeTables, identifier: tuple[str, str], partition: int, schemas: Schemas,
        cache: BatchCache, log_append_time: bool = False, topic_id: str | None = None,
        copies: FileCopies | None = None,
    ) -> None:
        self.tables = tables
        self._copies = copies or FileCopies(Path(), 0)  # none: data files are read where they are
        self.identifier = identifier
        self.partition = partition
        self.log_append_time = log_append_time
        self.topic_id = topic_id
        self._cache = cache
        self._keys = Rebuilder(schemas)
        self._values = Rebuilder(schemas)
        self._plan = _EMPTY
        self._planned: TablePlan | None = None  # the table's plan self._plan was taken from
        self._lock = threading.Lock()
        # data file → its Parquet footer and the offset range of each row group
        self._groups: dict[str, tuple[pq.FileMetaData, list[tuple[int, int]]]] = {}
        # (data file, row group) → whether its rows were found in offset order (the archive writes them so): a
        # window of such a row group stops reading past its last offset
        self._in_order: dict[tuple[str, int], bool] = {}
        self._raw = False  # payloads are stored as produced in every row (no column to rebuild them from)

    # -- the plan ------------------------------------------------------------------------------
    def refresh(self, fresh: bool = False) -> None:
        """Take the table's current plan (worker thread / background); nothing to do while it is the one taken."""
        planned = self.tables.plan(self.identifier, fresh)
        with self._lock:
            if planned is self._planned:
                return
        plan = self._partition_plan(planned)
        with self._lock:
            self._planned, self._plan, self._raw = planned, plan, planned.raw
            current = {f.task.file.file_path for s in plan.slices for f in s.files}
            self._groups = {path: groups for path, groups in self._groups.items() if path in current}
            self._in_order = {key: v for key, v in self._in_order.items() if key[0] in current}

    def _partition_plan(self, planned: TablePlan) -> _Plan:
        """The partition's files of the table's plan, in offset order."""
        if planned.snapshot_id is None:
            return _EMPTY
        if self.topic_id is not None and planned.owner is not None and planned.owner != self.topic_id:
            log.warning("read-back: table %s holds the archive of another topic (id %s, this one is %s); "
                        "not served", ".".join(self.identifier), planned.owner, self.topic_id)
            return _Plan(planned.snapshot_id, [], [], table=planned.table)
        segments = _segments(planned.slices(self.partition))
        return _Plan(planned.snapshot_id, segments, [s.lower for s in segments], planned.layout,
                     planned.covered.get(self.partition), planned.table)

    def start_offset(self) -> int | None:
        """The first offset the table holds for the partition (cached plan; None: nothing archived)."""
        return self._plan.start

    def end_offset(self) -> int | None:
        """One past the last offset the table holds (cached plan)."""
        return self._plan.end

    def _current(self, offset: int) -> _Plan:
        """The plan to read `offset` with: the cached one (the broker's background refresh keeps it current, so a
        read loads no table metadata), re-planned now only when the offset is past it."""
        plan = self._plan
        if plan.end is None or offset >= plan.end:
            self.refresh(fresh=True)  # the archiver may just have committed what is asked for
            plan = self._plan
        return plan

    # -- reads ---------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int) -> list[bytes]:
        """Batches from the one holding `offset` (or the next present), about max_bytes (at least one).

        A table that cannot be read answers KAFKA_STORAGE_ERROR, which consumers retry.
        """
        try:
            try:
                return self._read(offset, max_bytes)
            except OSError:
                # A file of a plan up to a second old may be gone (snapshot expiry after a compaction).
                self.refresh(fresh=True)
                return self._read(offset, max_bytes)
        except KafkaApiError:
            raise
        except Exception as exc:
            log.exception("read-back of %s partition %d at offset %d failed", ".".join(self.identifier),
                          self.partition, offset)
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"reading the archive table failed: {exc}") from exc

    def _read(self, offset: int, max_bytes: int) -> list[bytes]:
        plan = self._current(offset)
        out: list[bytes] = []
        size = 0
        for index in _slices_from(plan, offset):
            for group in self._row_groups(plan, plan.slices[index], offset):
                built = self._built(plan.slices[index], plan, group)
                for _last, batch in built.batches_from(offset):
                    if out and size + len(batch) > max_bytes:
                        return out
                    out.append(batch)
                    size += len(batch)
                if size >= max_bytes:
                    return out
                if out and built.last is not None:
                    offset = max(offset, built.last + 1)
        return out

    def _row_groups(self, plan: _Plan, segment: Segment, offset: int) -> list[Unit]:
        """The units a segment is read in, those holding offsets >= `offset`, when its files can be read straight
        with pyarrow (so a seek decodes a row group, not the files): each row group of its one file; of several
        files (a compaction's outputs whose offset runs interleave), the row groups whose offset ranges overlap,
        read and merged together. Else all of it (None): its rows, deletes applied, in one piece."""
        if any(f.task.delete_files for f in segment.files) or not self._raw:
            return [None]
        footers = [self._footer(plan, f.task.file.file_path) for f in segment.files]
        ranges = [(low, high, i, g) for i, (_meta, groups) in enumerate(footers)
                  for g, (low, high) in enumerate(groups)]
        units: list[tuple[int, int, list[tuple[int, int]]]] = []  # (lowest, highest offset, row groups)
        for low, high, i, g in (ranges if len(segment.files) == 1 else sorted(ranges)):
            if len(segment.files) > 1 and units and low <= units[-1][1]:
                units[-1] = (units[-1][0], max(units[-1][1], high), [*units[-1][2], (i, g)])
            else:
                units.append((low, high, [(i, g)]))
        out: list[Unit] = []
        for low, high, pairs in units:
            if high < offset:
                continue
            size = sum(footers[i][0].row_group(g).total_byte_size for i, g in pairs)
            rows = sum(footers[i][0].row_group(g).num_rows for i, g in pairs)
            windows = max(-(-size // UNIT_MAX_BYTES), -(-rows // UNIT_MAX_ROWS))
            if windows <= 1:
                out.append(RowGroups(tuple(pairs)))
                continue
            span = -(-(high - low + 1) // windows)  # the offsets a window holds
            for first in range(low, high + 1, span):
                if first + span > offset:
                    out.append(RowGroups(tuple(pairs), (first, min(first + span - 1, high))))
        return out

    def _footer(self, plan: _Plan, path: str) -> tuple[pq.FileMetaData, list[tuple[int, int]]]:
        """A data file's footer and its row groups' offset ranges: read on the file's first read, then kept."""
        groups = self._groups.get(path)
        if groups is None:
            assert plan.table is not None  # a plan with files has its table
            groups = _offset_ranges(plan.table, path, plan.layout)
            with self._lock:
                self._groups[path] = groups
        return groups

    def retention_start(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int | None:
        """The first offset Kafka retention keeps, by whole data files as Kafka does by segments (cached plan).

        A file goes once all its records are older than retention.ms, or while the files after it still
        hold retention.bytes; the start moves past the last file that goes (not to the next file's first
        row: rows deleted from the table never move it). None: nothing goes (or nothing is archived).
        """
        slices = self._plan.slices
        remaining = sum(s.size for s in slices)
        moved: int | None = None
        for segment in slices:
            too_old = retention_ms >= 0 and segment.max_timestamp_ms < now_ms - retention_ms
            too_big = retention_bytes >= 0 and remaining - segment.size >= retention_bytes
            if not (too_old or too_big):
                break
            moved = max(moved or 0, segment.upper + 1)
            remaining -= segment.size
        return moved

    def offset_for_timestamp(self, timestamp_ms: int, min_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first archived record at or past min_offset whose timestamp is >= timestamp_ms."""
        try:
            plan = self._current(0)
        except Exception:
            log.exception("read-back: planning %s partition %d failed", ".".join(self.identifier), self.partition)
            plan = self._plan
        for segment in plan.slices:
            if segment.max_timestamp_ms < timestamp_ms or segment.upper < min_offset:
                continue
            for group in self._row_groups(plan, segment, min_offset):
                built = self._built(segment, plan, group)
                hits = np.flatnonzero((built.timestamps >= timestamp_ms) & (built.offsets >= min_offset))
                if len(hits):
                    return int(built.offsets[hits[0]]), int(built.timestamps[hits[0]])
        return None

    def max_timestamp_offset(self, min_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the archived record at or past min_offset with the largest timestamp (the first
        such record on a tie), or None. Reads only segments whose timestamp statistics can hold it."""
        try:
            plan = self._current(0)
        except Exception:
            log.exception("read-back: planning %s partition %d failed", ".".join(self.identifier), self.partition)
            plan = self._plan
        best: tuple[int, int] | None = None
        for segment in sorted(plan.slices, key=lambda s: -s.max_timestamp_ms):
            if best is not None and segment.max_timestamp_ms < best[1]:
                break
            if segment.upper < min_offset:
                continue
            for group in self._row_groups(plan, segment, min_offset):
                built = self._built(segment, plan, group)
                keep = built.offsets >= min_offset
                if not keep.any():
                    continue
                top = int(built.timestamps[keep].max())
                offset = int(built.offsets[keep][np.flatnonzero(built.timestamps[keep] == top)[0]])
                if best is None or top > best[1] or (top == best[1] and offset < best[0]):
                    best = (offset, top)
        return best

    def _built(self, segment: Segment, plan: _Plan, group: Unit = None) -> BuiltFile:
        key = (segment.key, group, self.partition, self.log_append_time)
        built = self._cache.get(key)
        if built is None:
            started = time.perf_counter()
            assert plan.table is not None  # a plan with files has its table
            rows = self._read_rows(plan.table, segment, plan.layout, group)
            read_s = time.perf_counter() - started
            built = BuiltFile(rows, self.log_append_time)
            self._cache.put(key, built)
            log.info("read-back: %s partition %d: %d rows of %d file(s) from %s (read %.2fs)",
                     ".".join(self.identifier), self.partition, len(rows.offsets), len(segment.files),
                     segment.files[0].task.file.file_path, read_s)
        return built

    def _read_rows(self, table: Table, segment: Segment, layout: Layout, group: Unit) -> Columns:
        if group is not None:
            # Nothing to apply and nothing to rebuild: read the row groups straight with pyarrow (the identity
            # partition puts one Kafka partition in a file), skipping pyiceberg's projection.
            import pyarrow as pa
            import pyarrow.parquet as pq

            parts = []
            for file_index, row_group in group.groups:
                path = segment.files[file_index].task.file.file_path
                known = self._groups.get(path)  # the footer read by _row_groups: not parsed again
                with self._copies.open(table.io, path) as stream:
                    parquet = pq.ParquetFile(_readable(stream), metadata=None if known is None else known[0],
                                             buffer_size=0 if group.window is None else WINDOW_READ_BYTES)
                    if group.window is None:
                        parts.append(parquet.read_row_group(row_group, columns=_raw_columns(layout)))
                        continue
                    # A window of a large row group: its pages decoded a batch at a time, only the window's rows
                    # kept, so the row group is never whole in memory. Once a read of the whole row group found its
                    # rows in offset order, a window stops at the first batch past its last offset (the later
                    # windows of a row group then read less of it; on object storage, fewer GETs).
                    in_order = self._in_order.get((path, row_group))
                    last = -1
                    ordered = True
                    for batch in parquet.iter_batches(WINDOW_READ_ROWS, [row_group], _raw_columns(layout)):
                        rows = pa.Table.from_batches([batch])
                        if not len(rows):
                            continue
                        offsets = _offset_values(rows, layout)  # None: a row has no offset
                        if in_order is None:
                            ordered = (ordered and offsets is not None and last <= offsets[0]
                                       and bool((np.diff(offsets) >= 0).all()))
                            last = -1 if offsets is None else int(offsets[-1])
                        parts.append(_within(rows, layout, group.window))
                        if in_order and offsets is not None and offsets[0] > group.window[1]:
                            break
                    else:
                        if in_order is None:
                            with self._lock:
                                self._in_order[(path, row_group)] = ordered
            arrow = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
            return self._columns(_sorted(arrow, layout), layout)
        from pyiceberg.expressions.parser import parse
        from pyiceberg.io.pyarrow import ArrowScan

        # pyiceberg applies delete files and deletion vectors, and projects evolved schemas by field id.
        scan = ArrowScan(table.metadata, table.io, table.schema(), parse(f"{layout.partition} = {self.partition}"))
        return self._columns(_sorted(scan.to_table([f.task for f in segment.files]), layout), layout)

    def _columns(self, arrow: pa.Table, layout: Layout) -> Columns:
        """The rows as columns, payloads as produced (stored bytes, or rebuilt from decoded columns)."""
        import pyarrow.compute as pc

        if len(arrow) == 0:
            return Columns.empty()

        def ints(values: ArrowArray | ArrowChunkedArray) -> np.ndarray:
            return np.asarray(values.to_numpy(zero_copy_only=False), np.int64)

        if layout.table:
            return Columns(
                ints(arrow.column(OFFSET)), ints(arrow.column(TIMESTAMP).cast("int64")) // 1000,
                ints(arrow.column(BATCH_START)), as_binary(arrow.column(KEY_BYTES)),
                _table_values(arrow, self._values), _headers(arrow.column(HEADERS)),
            )
        kafka = arrow.column("kafka")
        event_us = ints(pc.struct_field(kafka, "event_timestamp").cast("int64"))
        return Columns(
            ints(pc.struct_field(kafka, "offset")), event_us // 1000, ints(pc.struct_field(kafka, "batch_start")),
            _payloads(arrow.column("key"), self._keys), _payloads(arrow.column("value"), self._values),
            _headers(arrow.column("headers")),
        )


@dataclass(frozen=True)
class Columns:
    """A segment's rows (offset order): offsets, timestamps (ms), batch starts, keys, values, headers."""

    offsets: np.ndarray
    timestamps: np.ndarray
    starts: np.ndarray
    keys: ArrowArray  # large_binary arrays
    values: ArrowArray
    headers: list[bytes] | None  # each row's encoded headers section; None: no row has any

    @staticmethod
    def empty() -> Columns:
        none = np.zeros(0, np.int64)
        return Columns(none, none, none, as_binary([]), as_binary([]), None)


def _raw_columns(layout: Layout) -> list[str]:
    """The columns a raw row group is read with."""
    if layout.table:
        return [KEY_BYTES, VALUE_BYTES, HEADERS, BATCH_START, OFFSET, TIMESTAMP]
    return ["key", "value", "headers", "kafka"]


def _readable(stream: InputStream) -> IO[bytes]:
    """pyiceberg's input stream as the file pyarrow reads (it is one: a readable, seekable binary file)."""
    return cast("IO[bytes]", stream)


def _offset_ranges(table: Table, path: str, layout: Layout) -> tuple[pq.FileMetaData, list[tuple[int, int]]]:
    """A data file's Parquet footer and the (min, max) offset of each row group, from its statistics (read where
    the file is: a footer is a ranged GET of a bucket, no reason to copy the file)."""
    import pyarrow.parquet as pq

    with table.io.new_input(path).open() as stream:
        metadata = pq.ParquetFile(_readable(stream)).metadata
    out = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        low, high = 0, 2**62  # no statistics: the row group may hold any offset
        for column in range(group.num_columns):
            chunk = group.column(column)
            stats = chunk.statistics
            if chunk.path_in_schema == layout.offset and stats is not None and stats.has_min_max:
                assert stats.min is not None and stats.max is not None  # (has_min_max)
                low, high = int(stats.min), int(stats.max)
        out.append((low, high))
    return metadata, out


def _within(arrow: pa.Table, layout: Layout, window: tuple[int, int]) -> pa.Table:
    """The rows whose offsets are within `window` (first, last)."""
    import pyarrow.compute as pc

    offsets = _offsets_of(arrow, layout)
    return arrow.filter(pc.and_(pc.greater_equal(offsets, window[0]), pc.less_equal(offsets, window[1])))


def _offset_values(arrow: pa.Table, layout: Layout) -> np.ndarray | None:
    """The rows' offsets as int64, or None when a row has none (such a row group is never taken as in order)."""
    offsets = _offsets_of(arrow, layout)
    if offsets.null_count:
        return None
    return np.asarray(offsets.to_numpy(zero_copy_only=False), np.int64)


def _offsets_of(arrow: pa.Table, layout: Layout) -> ArrowChunkedArray | ArrowArray:
    import pyarrow.compute as pc

    return arrow.column(OFFSET) if layout.table else pc.struct_field(arrow.column("kafka"), "offset")


def _sorted(arrow: pa.Table, layout: Layout) -> pa.Table:
    """Rows in offset order (a compacted file, or the files of a segment, may hold them in any order)."""
    import pyarrow.compute as pc

    if len(arrow) < 2:
        return arrow
    offsets = _offsets_of(arrow, layout)
    if pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py():
        return arrow  # an archive's file is written in offset order: no copy
    return arrow.take(pc.sort_indices(offsets))


def _headers(column: ArrowChunkedArray) -> list[bytes] | None:
    """Each row's encoded headers section, or None when no row has headers (most topics)."""
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(column), 0)
    if not pc.max(lengths).as_py():
        return None
    out = [b"\x00"] * len(column)
    for index in pc.indices_nonzero(lengths).to_pylist():
        out[index] = header_section(rebuild_headers(column[index].as_py()))
    return out


def _payloads(column: ArrowChunkedArray | ArrowArray, rebuilder: Rebuilder) -> ArrowArray:
    """A side's bytes per row (large_binary): straight from `__raw__` when the struct holds nothing else."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if isinstance(kind, pa.StructType) and kind.num_fields == 1 and kind.field(0).name == RAW:
        raw = pc.struct_field(column, RAW)
        if column.null_count:  # a null side (no key at all) is a null payload whatever its child holds
            raw = pc.if_else(column.is_valid(), raw, pa.scalar(None, raw.type))
        return as_binary(raw)
    return as_binary([rebuilder.payload(side) for side in column.to_pylist()])


_VALUE_KEPT = (VALUE_BYTES, VALUE_PREFIX, VALUE_ERR)


def _table_values(arrow: pa.Table, rebuilder: Rebuilder) -> ArrowArray:
    """A table layout's values per row: `__value` when kept, else rebuilt from `__value_prefix` and the value's
    top-level columns (schema/codec/rebuild.py); neither: a null value."""
    import pyarrow.compute as pc

    values = arrow.column(VALUE_BYTES)
    if VALUE_PREFIX not in arrow.column_names:
        return as_binary(values)
    rebuild = pc.and_(pc.is_null(values), pc.is_valid(arrow.column(VALUE_PREFIX)))
    indexes = pc.indices_nonzero(rebuild).to_pylist()
    if not indexes:
        return as_binary(values)
    fields = [name for name in arrow.column_names if name not in SYSTEM_COLUMNS or name in _VALUE_KEPT]
    out = values.to_pylist()
    for index, row in zip(indexes, arrow.select(fields).take(indexes).to_pylist(), strict=True):
        out[index] = rebuilder.payload(table_side_row(row, "value"))
    return as_binary(out)


def _slices_from(plan: _Plan, offset: int) -> list[int]:
    """Indexes of the segments holding offsets >= `offset`, in offset order."""
    first = max(bisect.bisect_right(plan.lowers, offset) - 1, 0)
    return [i for i in range(first, len(plan.slices)) if plan.slices[i].upper >= offset]


def _segments(slices: list[FileSlice]) -> list[Segment]:
    """Files in offset order, those whose offset ranges overlap grouped into one segment."""
    out: list[list[FileSlice]] = []
    upper = -1
    for file_slice in sorted(slices, key=lambda s: (s.lower, s.upper)):
        if out and file_slice.lower <= upper:
            out[-1].append(file_slice)
        else:
            out.append([file_slice])
        upper = max(upper, file_slice.upper)
    return [Segment(tuple(files)) for files in out]
