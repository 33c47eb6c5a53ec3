"""One archived partition as an offset range source of the log: plan with pyiceberg, read with pyarrow, build batches.

Planning: the partition's data files come from pyiceberg's scan planning (the identity partition on
kafka.partition prunes manifests; delete files and deletion vectors ride along with each file), ordered
by the file's kafka.offset lower bound. The plan is cached per table snapshot. Reading: a file's rows for
the partition (pyiceberg's ArrowScan applies deletes and projects evolved schemas by field id), in
offset order, become record batches grouped by `kafka.batch_start`; a file's batches are cached (an LRU
bounded by bytes, shared by every partition) keyed by the data file and its delete files, which never
change, so compaction and snapshot expiry simply make other files current.

Everything here runs on worker threads (Fetch reads off the event loop) or in the broker's background
refresh; `start_offset`/`end_offset` only read the cached plan, so the event loop can ask them.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from icelog.errors import ErrorCode, KafkaApiError
from icelog.readback.batches import header_section
from icelog.readback.columnar import as_binary, encode_batches
from icelog.readback.lake import LakeTables
from icelog.schema.archive.iceberg_types import RAW
from icelog.schema.archive.rebuild import Rebuilder, Schemas, rebuild_headers

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class FileSlice:
    """One data file of the partition: its scan task and the kafka.offset / event time bounds of its rows."""

    task: Any
    lower: int
    upper: int
    max_timestamp_ms: int  # upper bound of kafka.event_timestamp (ms); large when unknown
    size: int

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return (self.task.file.file_path, frozenset(d.file_path for d in self.task.delete_files))


@dataclass
class BuiltFile:
    """A file's rows as record batches: (base, last offset, bytes) each, plus (offset, timestamp) of each row."""

    bases: list[int] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)
    batches: list[bytes] = field(default_factory=list)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    timestamps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: int = 0


class BatchCache:
    """Built files, least recently used first out, bounded by their bytes; shared by all partitions."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: OrderedDict[Any, BuiltFile] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> BuiltFile | None:
        with self._lock:
            built = self._files.get(key)
            if built is not None:
                self._files.move_to_end(key)
            return built

    def put(self, key: Any, built: BuiltFile) -> None:
        with self._lock:
            if key in self._files:
                return
            self._files[key] = built
            self._bytes += built.size
            while self._bytes > self.max_bytes and len(self._files) > 1:
                _, old = self._files.popitem(last=False)
                self._bytes -= old.size


@dataclass(frozen=True)
class _Plan:
    snapshot_id: int | None
    slices: list[FileSlice]
    lowers: list[int]

    @property
    def start(self) -> int | None:
        return self.slices[0].lower if self.slices else None

    @property
    def end(self) -> int | None:
        return max(s.upper for s in self.slices) + 1 if self.slices else None


_EMPTY = _Plan(None, [], [])


class TableSource:
    """The archived offsets of one topic-partition (implements log.partition.OffsetRangeSource)."""

    def __init__(
        self, tables: LakeTables, identifier: tuple[str, str], partition: int, schemas: Schemas,
        cache: BatchCache, log_append_time: bool = False,
    ) -> None:
        self.tables = tables
        self.identifier = identifier
        self.partition = partition
        self.log_append_time = log_append_time
        self._cache = cache
        self._keys = Rebuilder(schemas)
        self._values = Rebuilder(schemas)
        self._plan = _EMPTY
        self._lock = threading.Lock()
        self._groups: dict[str, list[tuple[int, int]]] = {}  # data file → kafka.offset range of each row group
        self._raw = False  # the table has the raw layout (key and value are only `__raw__`)

    # -- the plan ------------------------------------------------------------------------------
    def refresh(self, fresh: bool = False) -> None:
        """Re-plan if the table has a new snapshot (worker thread / background)."""
        table = self.tables.table(self.identifier, fresh)
        snapshot = None if table is None else table.current_snapshot()
        snapshot_id = None if snapshot is None else snapshot.snapshot_id
        with self._lock:
            if snapshot_id == self._plan.snapshot_id and (snapshot_id is not None or not self._plan.slices):
                return
        plan = _EMPTY if snapshot is None else _plan_partition(table, snapshot.snapshot_id, self.partition)
        with self._lock:
            self._plan = plan
            self._raw = table is not None and _raw_layout(table.schema())
            current = {s.task.file.file_path for s in plan.slices}
            self._groups = {path: groups for path, groups in self._groups.items() if path in current}

    def start_offset(self) -> int | None:
        """The first offset the table holds for the partition (cached plan; None: nothing archived)."""
        return self._plan.start

    def end_offset(self) -> int | None:
        """One past the last offset the table holds (cached plan)."""
        return self._plan.end

    def _current(self, offset: int) -> _Plan:
        self.refresh()
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
            for group in self._row_groups(plan.slices[index], offset):
                built = self._built(plan.slices[index], group)
                start = bisect.bisect_left(built.lasts, offset)
                for i in range(start, len(built.batches)):
                    batch = built.batches[i]
                    if out and size + len(batch) > max_bytes:
                        return out
                    out.append(batch)
                    size += len(batch)
                if size >= max_bytes:
                    return out
                if out:
                    offset = max(offset, built.lasts[-1] + 1)
        return out

    def _row_groups(self, file_slice: FileSlice, offset: int) -> list[int | None]:
        """The units a file is read in: its row groups holding offsets >= `offset` when it can be read
        straight with pyarrow (so a seek decodes one row group, not the file), else the whole file (None)."""
        if file_slice.task.delete_files or not self._raw:
            return [None]
        path = file_slice.task.file.file_path
        groups = self._groups.get(path)
        if groups is None:
            groups = _offset_ranges(self.tables.table(self.identifier), path)
            with self._lock:
                self._groups[path] = groups
        return [index for index, (_low, high) in enumerate(groups) if high >= offset]

    def retention_start(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int | None:
        """The first offset Kafka retention keeps, by whole data files as Kafka does by segments (cached plan).

        A file goes once all its records are older than retention.ms, or while the files after it still
        hold retention.bytes; the start moves past the last file that goes (not to the next file's first
        row: rows deleted from the table never move it). None: nothing goes (or nothing is archived).
        """
        slices = self._plan.slices
        remaining = sum(s.size for s in slices)
        moved: int | None = None
        for file_slice in slices:
            too_old = retention_ms >= 0 and file_slice.max_timestamp_ms < now_ms - retention_ms
            too_big = retention_bytes >= 0 and remaining - file_slice.size >= retention_bytes
            if not (too_old or too_big):
                break
            moved = max(moved or 0, file_slice.upper + 1)
            remaining -= file_slice.size
        return moved

    def offset_for_timestamp(self, timestamp_ms: int, min_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first archived record at or past min_offset whose timestamp is >= timestamp_ms."""
        try:
            plan = self._current(0)
        except Exception:
            log.exception("read-back: planning %s partition %d failed", ".".join(self.identifier), self.partition)
            plan = self._plan
        for file_slice in plan.slices:
            if file_slice.max_timestamp_ms < timestamp_ms or file_slice.upper < min_offset:
                continue
            for group in self._row_groups(file_slice, min_offset):
                built = self._built(file_slice, group)
                hits = np.flatnonzero((built.timestamps >= timestamp_ms) & (built.offsets >= min_offset))
                if len(hits):
                    return int(built.offsets[hits[0]]), int(built.timestamps[hits[0]])
        return None

    def _built(self, file_slice: FileSlice, group: int | None = None) -> BuiltFile:
        key = (file_slice.key, group, self.partition, self.log_append_time)
        built = self._cache.get(key)
        if built is None:
            started = time.perf_counter()
            rows = self._read_rows(self.tables.table(self.identifier), file_slice, group)
            read_s = time.perf_counter() - started
            built = build_file(rows, self.log_append_time)
            self._cache.put(key, built)
            log.info("read-back: %s partition %d: %d rows of %s in %d batches (read %.2fs, built %.2fs)",
                     ".".join(self.identifier), self.partition, len(rows.offsets), file_slice.task.file.file_path,
                     len(built.batches), read_s, time.perf_counter() - started - read_s)
        return built

    def _read_rows(self, table: Any, file_slice: FileSlice, group: int | None) -> Columns:
        if group is not None:
            # Nothing to apply and no evolved columns: read the row group straight with pyarrow (the
            # identity partition puts one Kafka partition in a file), skipping pyiceberg's projection.
            import pyarrow.parquet as pq

            with table.io.new_input(file_slice.task.file.file_path).open() as stream:
                arrow = pq.ParquetFile(stream).read_row_group(group, columns=list(_RAW_COLUMNS))
            return self._columns(_sorted(arrow))
        from pyiceberg.expressions.parser import parse
        from pyiceberg.io.pyarrow import ArrowScan

        scan = ArrowScan(table.metadata, table.io, table.schema(), parse(f"kafka.partition = {self.partition}"))
        return self._columns(_sorted(scan.to_table([file_slice.task])))

    def _columns(self, arrow: Any) -> Columns:
        """The file's rows as columns, payloads as produced (`__raw__`, or rebuilt from decoded columns)."""
        import pyarrow.compute as pc

        kafka = arrow.column("kafka")
        if len(arrow) == 0:
            return Columns.empty()

        def ints(values: Any) -> np.ndarray:
            return np.asarray(values.to_numpy(zero_copy_only=False), np.int64)

        event_us = ints(pc.struct_field(kafka, "event_timestamp").cast("int64"))
        return Columns(
            ints(pc.struct_field(kafka, "offset")), event_us // 1000, ints(pc.struct_field(kafka, "batch_start")),
            _payloads(arrow.column("key"), self._keys), _payloads(arrow.column("value"), self._values),
            _headers(arrow.column("headers")),
        )


@dataclass(frozen=True)
class Columns:
    """A data file's rows (offset order): offsets, timestamps (ms), batch starts, keys, values, headers."""

    offsets: np.ndarray
    timestamps: np.ndarray
    starts: np.ndarray
    keys: Any  # large_binary arrays
    values: Any
    headers: list[bytes] | None  # each row's encoded headers section; None: no row has any

    @staticmethod
    def empty() -> Columns:
        none = np.zeros(0, np.int64)
        return Columns(none, none, none, as_binary([]), as_binary([]), None)


_RAW_COLUMNS = ("key", "value", "headers", "kafka")


def _offset_ranges(table: Any, path: str) -> list[tuple[int, int]]:
    """(min, max) kafka.offset of each row group of a data file, from its Parquet footer statistics."""
    import pyarrow.parquet as pq

    with table.io.new_input(path).open() as stream:
        metadata = pq.ParquetFile(stream).metadata
    out = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        low, high = 0, 2**62  # no statistics: the row group may hold any offset
        for column in range(group.num_columns):
            chunk = group.column(column)
            if chunk.path_in_schema == "kafka.offset" and chunk.statistics is not None and chunk.statistics.has_min_max:
                low, high = int(chunk.statistics.min), int(chunk.statistics.max)
        out.append((low, high))
    return out


def _raw_layout(schema: Any) -> bool:
    """Whether key and value hold only `__raw__` (the layout of topics without a schema, lake/layout.py)."""
    return all(
        [f.name for f in schema.find_field(side).field_type.fields] == [RAW] for side in ("key", "value")
    )


def _sorted(arrow: Any) -> Any:
    """Rows in kafka.offset order (a compacted file may hold several archives in any order)."""
    import pyarrow.compute as pc

    if len(arrow) < 2:
        return arrow
    offsets = pc.struct_field(arrow.column("kafka"), "offset")
    if pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py():
        return arrow  # an archive's file is written in offset order: no copy
    return arrow.take(pc.sort_indices(offsets))


def _headers(column: Any) -> list[bytes] | None:
    """Each row's encoded headers section, or None when no row has headers (most topics)."""
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(column), 0)
    if not pc.max(lengths).as_py():
        return None
    out = [b"\x00"] * len(column)
    for index in pc.indices_nonzero(lengths).to_pylist():
        out[index] = header_section(rebuild_headers(column[index].as_py()))
    return out


def _payloads(column: Any, rebuilder: Rebuilder) -> Any:
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


def build_file(columns: Columns, log_append_time: bool) -> BuiltFile:
    """Record batches of one file's rows: one per run of rows sharing kafka.batch_start (columnar.py)."""
    built = BuiltFile()
    for base, last, batch in encode_batches(columns.offsets, columns.timestamps, columns.starts, columns.keys,
                                            columns.values, columns.headers, log_append_time):
        built.bases.append(base)
        built.lasts.append(last)
        built.batches.append(batch)
        built.size += len(batch)
    built.offsets, built.timestamps = columns.offsets, columns.timestamps
    built.size += 16 * len(columns.offsets)
    return built


def _slices_from(plan: _Plan, offset: int) -> list[int]:
    """Indexes of the slices holding offsets >= `offset`, in offset order."""
    first = max(bisect.bisect_right(plan.lowers, offset) - 1, 0)
    return [i for i in range(first, len(plan.slices)) if plan.slices[i].upper >= offset]


def _slices(table: Any, snapshot_id: int, row_filter: str | None) -> list[tuple[int, FileSlice]]:
    """(Kafka partition, slice) of each data file the scan plans (pyiceberg: partition pruning, delete files)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import IntegerType, LongType, TimestamptzType

    schema = table.schema()
    ids = {name: schema.find_field(f"kafka.{name}").field_id for name in ("partition", "offset", "event_timestamp")}

    def bound(bounds: Any, name: str, kind: Any, default: int) -> int:
        raw = bounds.get(ids[name]) if bounds else None
        return default if raw is None else int(from_bytes(kind, raw))

    out = []
    from pyiceberg.expressions import AlwaysTrue

    for task in table.scan(row_filter=row_filter or AlwaysTrue(), snapshot_id=snapshot_id).plan_files():
        data = task.file
        out.append((bound(data.lower_bounds, "partition", IntegerType(), -1), FileSlice(
            task,
            bound(data.lower_bounds, "offset", LongType(), 0),
            bound(data.upper_bounds, "offset", LongType(), 2**62),
            bound(data.upper_bounds, "event_timestamp", TimestamptzType(), 2**62 * 1000) // 1000,
            int(data.file_size_in_bytes),
        )))
    return out


def _plan_partition(table: Any, snapshot_id: int, partition: int) -> _Plan:
    """The partition's data files in offset order."""
    slices = sorted((s for _, s in _slices(table, snapshot_id, f"kafka.partition = {partition}")),
                    key=lambda s: (s.lower, s.upper))
    return _Plan(snapshot_id, slices, [s.lower for s in slices])


def partition_ranges(table: Any) -> dict[int, tuple[int, int, int]]:
    """Per Kafka partition: (first offset, one past the last, data file bytes), from one scan plan (status)."""
    snapshot = table.current_snapshot()
    out: dict[int, tuple[int, int, int]] = {}
    if snapshot is None:
        return out
    for partition, file_slice in _slices(table, snapshot.snapshot_id, None):
        first, end, size = out.get(partition, (2**62, 0, 0))
        out[partition] = (min(first, file_slice.lower), max(end, file_slice.upper + 1), size + file_slice.size)
    return out
