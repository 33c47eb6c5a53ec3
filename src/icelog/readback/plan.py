"""An archive table's data files by Kafka partition at one snapshot: planned once per table, kept current by appends.

A table is planned once for all its partitions (pyiceberg's scan planning with no filter: partition and metrics
pruning need nothing, delete files and deletion vectors ride along with each data file), and each file is given
the Kafka partitions it may hold (the identity partition on the partition column when the spec has one, else the
file's statistics of that column), which is what pyiceberg's planning with a filter on one partition keeps
(tests/readback/test_readback_plan.py compares the two on archived tables). When the snapshots since the planned one are
all appends on top of it, only the data files they added are read (the manifests those snapshots wrote, entries
whose snapshot is one of them): an append adds data files and nothing else, so the files planned before keep their
delete files and the new ones have none. Anything else (compaction, an overwrite or delete, a rollback or an
expired ancestor, another table under the name, a new layout) is planned in full again. Parquet footers are not
read here: readback/source.py reads a file's footer when it first reads the file.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from icelog.table.config import BATCH_START, BUCKET, LAYOUT_TABLE, OFFSET, TIMESTAMP, VALUE_PREFIX
from icelog.table.iceberg_types import RAW
from icelog.table.layout import OFFSETS_PROPERTY, TOPIC_ID_PROPERTY, layout_of_properties

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table
    from pyiceberg.types import PrimitiveType, StructType

log = logging.getLogger(__name__)

MAX_APPENDS = 1000  # more snapshots than this since the planned one: plan in full (also bounds the ancestry walk)
ANY_PARTITION = (-(2**31), 2**31 - 1)  # the Kafka partitions a file without statistics or partition value may hold
# Positions in pyiceberg's DataFile of its column statistics: column sizes, value, null and NaN counts, lower and
# upper bounds (read once, when the file is planned).
_STATISTICS = (6, 7, 8, 9, 10, 11)


@dataclass(frozen=True)
class Layout:
    """Where a table layout keeps what a record needs (column paths)."""

    partition: str
    offset: str
    timestamp: str
    batch_start: str
    table: bool  # Fluss's layout: the value's fields and the system columns are top-level


RECORD_LAYOUT = Layout("kafka.partition", "kafka.offset", "kafka.event_timestamp", "kafka.batch_start", False)
TABLE_LAYOUT = Layout(BUCKET, OFFSET, TIMESTAMP, BATCH_START, True)


def layout_of(table: Table) -> Layout:
    """The layout a table was created with (table/layout.py records it in the table property icelog.layout)."""
    return TABLE_LAYOUT if layout_of_properties(table.properties) == LAYOUT_TABLE else RECORD_LAYOUT


@dataclass(frozen=True)
class FileSlice:
    """One data file of the partition: its scan task and the offset / event time bounds of its rows."""

    task: FileScanTask
    lower: int
    upper: int
    max_timestamp_ms: int  # upper bound of the event timestamp (ms); large when unknown
    size: int

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return (self.task.file.file_path, frozenset(d.file_path for d in self.task.delete_files))


@dataclass(frozen=True)
class PlannedFile:
    """A data file of the table and the Kafka partitions it may hold (first, last)."""

    slice: FileSlice
    partitions: tuple[int, int]


@dataclass(frozen=True)
class TablePlan:
    """A table version and its data files (None: no table, or no snapshot yet)."""

    location: str | None  # the metadata file planned; another one means the table changed
    table: Table | None  # the pyiceberg table version (its metadata, schema and io serve the reads)
    snapshot_id: int | None = None
    files: tuple[PlannedFile, ...] = ()
    layout: Layout = RECORD_LAYOUT
    owner: str | None = None  # the topic id the newest archive commit records
    covered: dict[int, int] = field(default_factory=dict)  # next offset per partition the archive commits cover
    raw: bool = False  # every row holds its payloads as produced (no column to rebuild them from)
    appended: int | None = None  # data files read incrementally to reach this plan (None: planned in full)

    def slices(self, partition: int) -> list[FileSlice]:
        """The data files that may hold rows of the Kafka partition."""
        return [f.slice for f in self.files if f.partitions[0] <= partition <= f.partitions[1]]


NO_TABLE = TablePlan(None, None)


def plan_table(table: Table | None, location: str | None, before: TablePlan = NO_TABLE) -> TablePlan:
    """The table's current data files: from `before` plus what the appends since added, else planned in full."""
    snapshot = None if table is None else table.current_snapshot()
    if table is None or snapshot is None:
        return TablePlan(location, table, raw=table is not None and _raw_layout(table.schema(), layout_of(table)))
    layout = layout_of(table)
    owner, covered = archive_summary(table)
    raw = _raw_layout(table.schema(), layout)
    planned = TablePlan(location, table, snapshot.snapshot_id, (), layout, owner, covered, raw)
    added = _appended_since(before, table, layout)
    if added is not None:
        return replace(planned, files=before.files + tuple(added), appended=len(added))
    tasks = table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
    return replace(planned, files=tuple(_planned_files(table, tasks, layout)))


def _appended_since(before: TablePlan, table: Table, layout: Layout) -> list[PlannedFile] | None:
    """The data files the snapshots since `before`'s added, when those are all appends on top of it; else None."""
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.table import ManifestGroupPlanner
    from pyiceberg.table.snapshots import Operation

    if (before.table is None or before.snapshot_id is None or layout != before.layout
            or table.metadata.table_uuid != before.table.metadata.table_uuid
            or _field_ids(table, layout) != _field_ids(before.table, layout)):
        return None
    current = table.current_snapshot()
    if current is None:  # plan_table asks only about a table with a snapshot
        return None
    snapshot = current
    appends: set[int] = set()
    while snapshot.snapshot_id != before.snapshot_id:
        operation = None if snapshot.summary is None else snapshot.summary.operation
        if operation != Operation.APPEND or len(appends) >= MAX_APPENDS or snapshot.parent_snapshot_id is None:
            return None
        appends.add(snapshot.snapshot_id)
        parent = table.snapshot_by_id(snapshot.parent_snapshot_id)
        if parent is None:  # an ancestor expired: the lineage back to the plan is unknown
            return None
        snapshot = parent
    if not appends:
        return []
    # The files an append added are in manifests it wrote (a later append may merge them into its own manifest,
    # as existing entries that keep the snapshot that added them).
    manifests = [m for m in current.manifests(table.io) if m.added_snapshot_id in appends]
    if any(m.content != ManifestContent.DATA for m in manifests):
        return None
    tasks = ManifestGroupPlanner(table.metadata, table.io).plan_files(
        manifests, manifest_entry_filter=lambda entry: entry.snapshot_id in appends)
    return _planned_files(table, tasks, layout)


def _field_ids(table: Table, layout: Layout) -> tuple[int, int, int]:
    schema = table.schema()
    partition, offset, timestamp = (schema.find_field(path).field_id
                                    for path in (layout.partition, layout.offset, layout.timestamp))
    return partition, offset, timestamp


def _planned_files(table: Table, tasks: Iterable[FileScanTask], layout: Layout) -> list[PlannedFile]:
    """Each scan task's slice (offset and time bounds from the file's statistics) and its Kafka partitions."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import IntegerType, LongType, TimestamptzType

    partition_id, offset_id, timestamp_id = _field_ids(table, layout)
    # Per spec, the position of an identity partition on the partition column (None: the spec has none).
    identity = {
        spec.spec_id: next((i for i, f in enumerate(spec.fields)
                            if f.source_id == partition_id and isinstance(f.transform, IdentityTransform)), None)
        for spec in table.metadata.partition_specs
    }

    def bound(bounds: dict[int, bytes] | None, field_id: int, kind: PrimitiveType, default: int) -> int:
        raw = bounds.get(field_id) if bounds else None
        return default if raw is None else int(from_bytes(kind, raw))

    out = []
    for task in tasks:
        data = task.file
        first = bound(data.lower_bounds, partition_id, IntegerType(), ANY_PARTITION[0])
        last = bound(data.upper_bounds, partition_id, IntegerType(), ANY_PARTITION[1])
        position = identity.get(data.spec_id)
        if position is not None:
            value = data.partition[position]
            first, last = (1, 0) if value is None else (max(first, value), min(last, value))
        values, nulls = data.value_counts or {}, data.null_value_counts or {}
        if values.get(partition_id) is not None and values.get(partition_id) == nulls.get(partition_id):
            first, last = 1, 0  # only nulls: no partition's filter keeps it
        out.append(PlannedFile(FileSlice(
            _without_statistics(task),
            bound(data.lower_bounds, offset_id, LongType(), 0),
            bound(data.upper_bounds, offset_id, LongType(), 2**62),
            bound(data.upper_bounds, timestamp_id, TimestamptzType(), 2**62 * 1000) // 1000,
            int(data.file_size_in_bytes),
        ), (first, last)))
    return out


def _without_statistics(task: FileScanTask) -> FileScanTask:
    """The task with a copy of its data file less the column statistics, which nothing reads once it is planned:
    they were ~4 KB of the ~5 KB a plan held per data file, for as long as the table's files are current (a copy:
    pyiceberg's cached manifests share the original)."""
    from pyiceberg.table import FileScanTask

    data = copy.copy(task.file)
    data._data = list(data._data)
    for position in _STATISTICS:
        data._data[position] = None
    return FileScanTask(data, task.delete_files, task.residual)


def archive_summary(table: Table, max_ancestors: int = 1000) -> tuple[str | None, dict[int, int]]:
    """(topic id, next offset per partition) the newest archive commit on the current lineage records (None, {}:
    none left to say; snapshots of others, compaction or deletes, record nothing: archive/reconcile.py)."""
    from pyiceberg.table.snapshots import ancestors_of

    for hops, snapshot in enumerate(ancestors_of(table.current_snapshot(), table.metadata)):
        if hops >= max_ancestors:
            break
        summary = snapshot.summary
        offsets = None if summary is None else summary.get(OFFSETS_PROPERTY)
        if offsets is not None:
            topic_id = summary.get(TOPIC_ID_PROPERTY) if summary is not None else None
            covered = {int(p): int(o) for p, o in json.loads(str(offsets)).items()}
            return (None if topic_id is None else str(topic_id)), covered
    return None, {}


def _raw_layout(schema: Schema, layout: Layout) -> bool:
    """Whether every row holds its payloads as produced: the record layout's key and value structs hold only
    `__raw__`, or a table layout table has no value columns to rebuild from (no __value_prefix: no schema)."""
    if layout.table:
        return VALUE_PREFIX not in {f.name for f in schema.fields}
    return all(
        [f.name for f in cast("StructType", schema.find_field(side).field_type).fields] == [RAW]
        for side in ("key", "value")
    )


def partition_ranges(table: Table, topic_id: str) -> dict[int, tuple[int, int, int]] | None:
    """Per Kafka partition: (first offset, one past the last, data file bytes), from one scan plan (status); None
    when the table's archive commits came from another topic (read-back does not serve it to this one)."""
    out: dict[int, tuple[int, int, int]] = {}
    plan = plan_table(table, None)
    if plan.owner is not None and plan.owner != topic_id:
        return None
    for planned in plan.files:
        file_slice, partition = planned.slice, planned.partitions[0]
        if partition == ANY_PARTITION[0]:
            partition = -1  # no statistics and no partition value: unknown
        first, end, size = out.get(partition, (2**62, 0, 0))
        out[partition] = (min(first, file_slice.lower), max(end, file_slice.upper + 1), size + file_slice.size)
    return out
