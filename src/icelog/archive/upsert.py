"""Upsert tables: one pass of a primary-key topic becomes one Iceberg commit of data files plus deletion vectors.

A pass (the rows decoded by the archiver's Spark workers, as for an append table):
  1. the table's primary-key index (archive/pk_index.py) is brought to the table's current snapshot (the base):
     it follows REPLACE, APPEND and merge-on-read DELETE/overwrite snapshots since its own (refresh_index),
     or is rebuilt from the table
     (reading only the key and offset columns of each live data file, less the positions of its deletion
     vector); a key the table holds twice (a foreign INSERT of an existing key) keeps the later commit's row,
     and the other becomes a *stale* row of the index;
  2. Spark's Python workers decode every row of the pass, in one job as an append does, and write them as data
     files themselves (pyiceberg's Parquet writer with the table's schema, spec and properties: lake/data_files.py),
     without a commit; each task keeps its archives' offset order (no shuffle, no re-sort); the driver describes
     the files as Iceberg's writers do (metrics from their footers: iceberg_java.parquet_data_files);
  3. the driver reads the key, offset, bucket and value-nullness columns of those files (position = row
     number) and finds the latest row per key in the pass (highest offset) by one pyarrow sort; rows that are
     not their key's latest, tombstones (null value: they delete the key's previous row) and rows without a key
     are marked deleted in their new file's deletion vector, in the same commit;
  4. the driver looks the latest keys up in the index, and writes one deletion vector per data file that holds
     a replaced row, a stale row or a masked row of this pass (BaseDVFileWriter, into one Puffin file; a file's
     existing DV is merged in and replaced, so a data file keeps one DV);
  5. one RowDelta commits the new data files and the DVs, with the offsets map in the snapshot summary
     (exactly-once as for appends: reconcile.py), validated against every commit since the base (a
     concurrent compaction or DELETE of a referenced file fails it; the next pass starts over);
  6. the index takes the new rows and the new snapshot id, and forgets the stale rows, in one transaction
     (unless a concurrent commit landed between the base and this one: then the index stays at the base, and
     the next pass follows both commits, as 1 does); its thread writes the rows while 4 and 5 run, and commits
     with 5's snapshot id while the pass returns (the next pass of the table waits for it: pk_index.settle);
A crash before 5 leaves unreferenced files (orphans, as a failed Spark write leaves); after 5, an index behind the
table, which 1 brings up to it. Never equality deletes, never a data file rewritten on the write path.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from icelog.archive.pk_index import IndexEntry, IndexRows, PrimaryKeyIndex, encode_keys
from icelog.errors import ConfigError, TableChangedError, TableMismatchError
from icelog.lake import iceberg_java
from icelog.lake.data_files import WrittenFile
from icelog.lake.data_files import write_data_files as write_files
from icelog.lake.warehouse import open_file
from icelog.table.arrow import struct_array
from icelog.table.config import (
    BUCKET,
    LAYOUT_TABLE,
    OFFSET,
    VALUE_BYTES,
    VALUE_ERR,
    VALUE_PREFIX,
)
from icelog.table.layout import PRIMARY_KEY_PROPERTY, TableSpec

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from icelog.lake.data_files import TaskDecoder
    from icelog.table.arrow import ArrowArray, ArrowChunkedArray

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassRows:
    """A pass's rows as the archiver's Spark workers decode them: `decode` maps task numbers (of 0..tasks-1) to
    their rows, as Arrow batches of the table's columns."""

    tasks: int
    decode: TaskDecoder
    io_properties: Mapping[str, str]  # how workers reach the warehouse (the catalog's properties)
    key_decoded: bool = False  # the key is decoded with a schema (else its bytes are kept as they are)


class StaleIndexError(TableChangedError):
    """The primary-key index names data files the table no longer has (a commit of another writer removed them):
    the pass is redone at once, the index rebuilt from the table."""


@dataclass(frozen=True)
class UpsertResult:
    """What one upsert commit did."""

    snapshot_id: int
    written: int  # rows written (the latest per key, tombstones excluded)
    tombstones: int  # keys whose latest record in the pass was a tombstone
    replaced: int  # older rows marked deleted in deletion vectors
    index_rebuilt: bool


def offset_column(spec: TableSpec) -> str:
    return OFFSET if spec.layout == LAYOUT_TABLE else "kafka.offset"


def partition_column(spec: TableSpec) -> str:
    return BUCKET if spec.layout == LAYOUT_TABLE else "kafka.partition"


def write_upserts(
    spark: SparkSession,
    table_name: str,
    rows: PassRows,
    spec: TableSpec,
    summary: Mapping[str, str],
    data_dir: str,
    fault: Callable[[str], None] = lambda _stage: None,
    before_commit: Callable[[], None] = lambda: None,
) -> UpsertResult:
    """Upsert the decoded rows of one pass into the table in one commit (see the module docstring)."""
    table = iceberg_java.load_table(spark, table_name)
    key_property = ",".join(spec.primary_key)
    found_key = iceberg_java.table_properties(table).get(PRIMARY_KEY_PROPERTY)
    if found_key != key_property:
        raise TableMismatchError(
            f"table {table_name} is not an upsert table keyed by {key_property} (its {PRIMARY_KEY_PROPERTY} is "
            f"{found_key!r}); a primary key is fixed when a table is created: drop the table, or archive the topic "
            "into another with icelog.archive.iceberg.table"
        )
    if spec.layout != LAYOUT_TABLE and rows.key_decoded:
        # The record layout keeps key.__raw__ only when the decoded fields cannot rebuild the key. (Asked of this
        # pass's decoding, not of the table's key columns: they stay after icelog.schema.key=none.)
        raise ConfigError(
            f"{table_name}: a compacted topic whose key has a schema needs icelog.archive.layout=table (its __key "
            "keeps every key's bytes); recreate the topic with it, or set icelog.schema.key=none"
        )
    current = table.currentSnapshot()
    base = None if current is None else int(current.snapshotId())
    index = PrimaryKeyIndex.for_table(data_dir, iceberg_java.table_uuid(table))
    planner = ThreadPoolExecutor(2, thread_name_prefix="upsert-plan")
    try:
        stages = _Stages()
        rebuilt = refresh_index(spark, table_name, spec, index, base)
        stages.done("index")

        # The base's live data files and their DVs are planned (manifests only) while Spark writes the pass.
        planned = None if base is None else planner.submit(iceberg_java.live_data_files, table, base)
        # One Spark job, as for an append: decode and write every row (superseded ones too), committing nothing.
        written = write_data_files(spark, table, rows)
        stages.done("write")
        # The JVM describes the new files (footer metrics) while the driver reads their keys and looks them up.
        described = planner.submit(iceberg_java.parquet_data_files, spark, table, written)
        batch = read_batch([file.path for file in written], spec)
        stages.done("read-keys")
        new_rows, masked, tombstoned = batch.new_rows, batch.masked, batch.tombstoned
        old = index.lookup([*new_rows.keys, *tombstoned])
        stages.done("lookup")
        data_files = described.result()
        stages.done("describe")
        positions: dict[str, set[int]] = {path: set(poss) for path, poss in index.stale().items()}
        stale = sum(len(p) for p in positions.values())
        for entry in old.values():
            positions.setdefault(entry.file, set()).add(entry.pos)
        referenced = list(positions)  # rows of the base: the commit checks their files are still live

        # The index takes the pass's rows in its own thread while the deletion vectors and the commit are
        # written; its transaction commits with the snapshot id, or aborts (see PreparedUpdate).
        with index.prepare(new_rows, tombstoned, stale_marked=True) as update:
            dvs = iceberg_java.WrittenDVs([], [])
            if positions or masked:
                base_files = {} if planned is None else planned.result()
                files = {path: base_files[path] for path in referenced if path in base_files}
                missing = sorted(set(referenced) - set(files))
                if missing:
                    update.abort()
                    index.forget_snapshot()
                    raise StaleIndexError(
                        f"{table_name}: the primary-key index names data files the table no longer has "
                        f"({missing[0]}{' and more' if len(missing) > 1 else ''}); it is rebuilt on the next pass"
                    )
                previous = {
                    path: iceberg_java.read_deletion_vector(spark, live.dv, _read_blob(live.dv))
                    for path, live in files.items()
                    if live.dv is not None
                }
                for data_file in data_files:  # this pass's own superseded rows, tombstones and keyless rows
                    location = str(data_file.location())
                    if location in masked:
                        files[location] = iceberg_java.LiveDataFile(data_file, None)
                        positions[location] = set(masked[location])
                stages.done("plan")
                dvs = iceberg_java.write_deletion_vectors(spark, table, positions, files, previous)
                stages.done("dvs")
            before_commit()  # (the archiver's fence: raises if another archiver committed since `base`)
            fault("after-write")
            snapshot_id = iceberg_java.commit_row_delta(table, base, data_files, dvs, referenced, summary)
            stages.done("commit")
            fault("after-commit-before-index")
            committed = table.snapshot(snapshot_id)
            if committed is not None and committed.parentId() != base:
                # Another commit the validation allows (e.g. a compaction of files this pass did not touch, an
                # analyst's DELETE elsewhere) landed between the base and this commit: the index stays at the base,
                # and the next pass follows that commit and then this one (or rebuilds, if it cannot follow one).
                update.abort()
                log.info("%s: a concurrent commit landed during the upsert pass; the next pass brings the index "
                         "from snapshot %s through it and this one", table_name, base)
            else:  # the pass is done: its thread ends the index's transaction while the archiver goes on
                update.commit_later(snapshot_id)
            stages.done("index-update")
        replaced = sum(len(p) for p in positions.values()) - sum(len(p) for p in masked.values())
        log.info("upsert %s: %d rows written, %d tombstones, %d rows replaced (%d stale rows of foreign commits) "
                 "(%d deletion vectors); %s", table_name, len(new_rows), len(tombstoned), replaced, stale,
                 len(dvs.added), stages)
        return UpsertResult(snapshot_id, len(new_rows), len(tombstoned), replaced, rebuilt)
    finally:
        planner.shutdown(wait=True, cancel_futures=True)
        index.close()


@dataclass
class Batch:
    """What a pass's new data files hold, found by reading their key, offset, bucket and value columns."""

    new_rows: IndexRows  # each key's latest row in the pass, when it is not a tombstone (in key order)
    masked: dict[str, list[int]]  # positions in the new files of rows that are not their key's latest live row
    tombstoned: list[bytes]  # keys whose latest record in the pass is a tombstone


def read_batch(locations: list[str], spec: TableSpec) -> Batch:
    """The latest row per key among the new data files' rows (highest offset, then highest bucket).

    Every decoded row was written; a row superseded in the pass, a tombstone (null value) or a row without a key
    gets a deletion vector in the same commit (a DV applies to data files of its own commit). One pyarrow sort
    over the key, offset and bucket columns, vectorised key encoding: no Spark shuffle, no second decode, no
    Python work per row but building the keys' bytes.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    width = len(spec.primary_key)
    parts = [_numbered(_read_columns(location, spec), number) for number, location in enumerate(locations)]
    if not parts or not sum(p.num_rows for p in parts):
        return Batch(IndexRows([], [], [], [], []), {}, [])
    rows, first = _sorted_first(pa.concat_tables(parts), width, [("o", "descending"), ("b", "descending")])
    has_key = rows.column("has_key").combine_chunks()
    tombstone = rows.column("t").combine_chunks()
    latest = pc.and_(first, has_key)
    keep = pc.and_(latest, pc.invert(tombstone))

    dropped = rows.filter(pc.invert(keep))
    numbers, positions = dropped.column("f").to_numpy(), dropped.column("pos").to_numpy()
    masked = {locations[n]: positions[numbers == n].tolist() for n in np.unique(numbers).tolist()}
    kept = rows.filter(keep)
    new_rows = IndexRows(_keys(kept, width), locations, _ints(kept.column("f")), _ints(kept.column("pos")),
                         _ints(kept.column("o")))
    return Batch(new_rows, masked, _keys(rows.filter(pc.and_(latest, tombstone)), width))


def _numbered(part: pa.Table, number: int) -> pa.Table:
    """A data file's columns with its number among the files read (f) and each row's position (pos)."""
    import pyarrow as pa

    return part.append_column("f", pa.array(np.full(part.num_rows, number, np.int32))).append_column(
        "pos", pa.array(np.arange(part.num_rows, dtype=np.int64)))


def _sorted_first(rows: pa.Table, width: int, then: list[tuple[str, str]]) -> tuple[pa.Table, pa.BooleanArray]:
    """The rows sorted by key (k0..), then by `then`; and which rows are the first of their key (its latest)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    order = [(name, direction, "at_end") for name, direction in [(f"k{i}", "ascending") for i in range(width)] + then]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    n = rows.num_rows
    first = pa.array([True] * min(n, 1), pa.bool_())
    if n > 1:  # sorted by key: a row is its key's latest when its key differs from the row before
        columns = [rows.column(f"k{i}").combine_chunks() for i in range(width)]
        changed = pc.fill_null(pc.not_equal(columns[0].slice(1), columns[0].slice(0, n - 1)), True)
        for column in columns[1:]:
            changed = pc.or_(changed, pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, n - 1)), True))
        first = pa.concat_arrays([first, changed])
    return rows, first


def _keys(rows: pa.Table, width: int) -> list[bytes]:
    return encode_keys([rows.column(f"k{i}").combine_chunks() for i in range(width)])


class _Stages:
    """Seconds spent per stage of an upsert pass (logged, so a slow pass says where its time went)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._spent: list[tuple[str, float]] = []

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self._spent.append((stage, now - self._last))
        self._last = now

    def __str__(self) -> str:
        return " ".join(f"{stage} {seconds:.2f}s" for stage, seconds in self._spent)


def refresh_index(
    spark: SparkSession, table_name: str, spec: TableSpec, index: PrimaryKeyIndex, base: int | None
) -> bool:
    """Bring the index to the table's snapshot `base`; returns whether it had to be rebuilt.

    The snapshots since the index's are followed one by one when each is a REPLACE (external compaction:
    `rewrite_data_files`, or a rewrite of delete files or manifests) or an APPEND (an `INSERT INTO` by an
    analyst, or a pass of ours whose index update a crash cut short): Nobu's mailbox, applied before the batch.
    Otherwise (no index, a DELETE, UPDATE, MERGE or overwrite by someone else) the index is rebuilt from the
    table: for each live data file of the snapshot (planned from the manifests), pyarrow reads its key and
    offset columns and pyiceberg its deletion vector, whose positions are left out. No Spark job, and the
    driver holds one data file's keys at a time. Either way a key the table holds twice keeps the row of the
    later commit in the index and the other one becomes stale: the next commit marks it deleted.
    """
    known = index.snapshot_id()
    if known == base:
        return False
    if known is not None and base is not None and follow_snapshots(spark, table_name, spec, index, known):
        return False
    if base is None:
        index.rebuild(None, ())
        return True
    files = iceberg_java.live_data_files(iceberg_java.load_table(spark, table_name), base)
    ordered = sorted((int(live.file.dataSequenceNumber() or 0), location, live.dv) for location, live in files.items())

    def parts() -> Iterator[tuple[int, IndexRows, list[int]]]:
        for sequence, location, dv in ordered:
            yield (sequence, *_live_rows(location, dv, spec))

    count = index.rebuild(base, parts())
    stale = sum(len(p) for p in index.stale().values())
    log.info("%s: primary-key index rebuilt from snapshot %d (%d keys, %d stale rows)", table_name, base, count,
             stale)
    return True


def follow_snapshots(spark: SparkSession, table_name: str, spec: TableSpec, index: PrimaryKeyIndex, known: int) -> bool:
    """Follow the REPLACE, APPEND, DELETE and overwrite snapshots since `known`; False if another kind comes (or
    `known` is not an ancestor, a REPLACE comes while stale rows wait for their deletion vector, or a DELETE or
    overwrite is not one _follow_delta follows): the caller rebuilds instead.

    REPLACE: a compaction writes only live rows (it applies the deletion vectors), every live row of a file it
    rewrites goes to one of its new files, and a row keeps its offset: so a key whose index entry has the
    offset of a row in a new file moved there, at that row's position.
    APPEND (rows added, none deleted: the commit is later than every row the index knows): each key's latest
    row among the added ones (highest offset) becomes its row; its previous row, and the other added rows of
    the key, become stale. Read one added file at a time.
    DELETE / overwrite (merge-on-read DML, or our own pass): see _follow_delta.
    """
    table = iceberg_java.load_table(spark, table_name)
    since = iceberg_java.snapshots_since(table, known)
    if since is None or any(str(s.operation()) not in FOLLOWED for s in since):
        return False
    for snapshot in since:
        snapshot_id = int(snapshot.snapshotId())
        added = [str(f.location()) for f in iceberg_java.added_data_files(table, snapshot)]
        if str(snapshot.operation()) in ("delete", "overwrite"):
            if not _follow_delta(table, table_name, spec, index, snapshot, added):
                return False
            continue
        if str(snapshot.operation()) == "append":
            sequence = int(snapshot.sequenceNumber())
            marked = index.follow_append(snapshot_id, ((sequence, *_live_rows(location, None, spec))
                                                       for location in sorted(added)))
            log.info("%s: primary-key index follows APPEND snapshot %d (%d files, %d stale rows: keys the table "
                     "held already)", table_name, snapshot_id, len(added), marked)
            continue
        if index.stale():
            return False
        moved: dict[bytes, IndexEntry] = {}
        for location in added:
            moved.update(_live_rows(location, None, spec)[0].entries())
        current = index.lookup(moved)
        index.apply(snapshot_id, IndexRows.of(
            {k: e for k, e in moved.items() if k in current and current[k].offset == e.offset}), ())
        log.info("%s: primary-key index follows REPLACE snapshot %d (%d rows moved)", table_name, snapshot_id,
                 len(moved))
    return True


FOLLOWED = ("replace", "append", "delete", "overwrite")  # snapshot operations the index follows (else: rebuild)


def _follow_delta(table: iceberg_java.JavaTable, table_name: str, spec: TableSpec, index: PrimaryKeyIndex,
                  snapshot: iceberg_java.JavaSnapshot, added: list[str]) -> bool:
    """A DELETE or overwrite that only added rows and deletion vectors: an analyst's merge-on-read DELETE, UPDATE
    or MERGE, or a pass of ours whose index update a crash cut short. Its added files' live rows are taken as
    an APPEND's (less the rows their own DVs delete); the keys whose indexed row another file's new DV deletes
    leave the index. False (the caller rebuilds) when it removed data files (a copy-on-write rewrite moves
    rows) or added deletes that are not DVs (equality or v2 position deletes)."""
    if iceberg_java.removed_data_files(table, snapshot):
        return False
    dvs = iceberg_java.added_delete_files(table, snapshot)
    if any(dv.referencedDataFile() is None or dv.contentOffset() is None for dv in dvs):
        return False
    by_file = {str(dv.referencedDataFile()): dv for dv in dvs}
    sequence = int(snapshot.sequenceNumber())
    files = ((sequence, *_live_rows(location, by_file.get(location), spec)) for location in sorted(added))
    deleted = (_deleted_rows(location, dv, spec) for location, dv in by_file.items() if location not in added)
    marked, dropped = index.follow_delta(int(snapshot.snapshotId()), files, deleted)
    log.info("%s: primary-key index follows %s snapshot %d (%d files added, %d deletion vectors: %d keys deleted, "
             "%d stale rows)", table_name, str(snapshot.operation()).upper(), int(snapshot.snapshotId()),
             len(added), len(dvs), dropped, marked)
    return True


def write_data_files(spark: SparkSession, table: iceberg_java.JavaTable, rows: PassRows) -> list[WrittenFile]:
    """Decode and write the pass's rows as data files of the table (as loaded), in one Spark job; commit nothing."""
    return write_files(spark, iceberg_java.metadata_location(table), rows.tasks, rows.decode, rows.io_properties)


def _read_columns(location: str, spec: TableSpec) -> pa.Table:
    """A data file's k0.. (primary key), o (offset), b (bucket), t (tombstone) and has_key columns, in file order."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    paths = [*spec.primary_key, offset_column(spec), partition_column(spec)]
    values = [VALUE_BYTES, VALUE_PREFIX, VALUE_ERR] if spec.layout == LAYOUT_TABLE else ["value"]
    with open_file(location) as handle:
        parquet = pq.ParquetFile(handle)
        present = [v for v in values if v in parquet.schema_arrow.names]
        # No tombstone in the file when a value column is never null: then the value bytes are not read.
        tombstones = bool(present) and not any(_never_null(parquet.metadata, v) for v in present)
        tops = list(dict.fromkeys([*(p.split(".")[0] for p in paths), *(present if tombstones else [])]))
        data = parquet.read(columns=tops)

    def column(p: str) -> ArrowArray:
        parts = p.split(".")
        array = data.column(parts[0]).combine_chunks()
        for part in parts[1:]:
            array = struct_array(array).field(part)
        return array

    *keys, offsets, buckets = [column(p) for p in paths]
    has_key = pa.array([True] * data.num_rows, pa.bool_())
    for key in keys:
        has_key = pc.and_(has_key, pc.is_valid(key))
    tombstone = pa.array([tombstones] * data.num_rows, pa.bool_())
    for value in present if tombstones else []:
        tombstone = pc.and_(tombstone, pc.is_null(column(value)))
    names = [f"k{i}" for i in range(len(keys))] + ["o", "b", "t", "has_key"]
    return pa.table([*keys, offsets, buckets, tombstone, has_key], names=names)


def _ints(column: ArrowArray | ArrowChunkedArray) -> list[int]:
    """A column of integers (file numbers, row positions, offsets) as the ints it holds (pyarrow-stubs type
    `to_pylist` as `list[Any | None]`)."""
    return cast("list[int]", column.to_pylist())


def _never_null(metadata: pq.FileMetaData, column: str) -> bool:
    """Whether a Parquet file's statistics show a leaf of `column` (outside any list or map) with no null in any
    row group: a null `column` would be a null there, so `column` is never null in the file."""
    for leaf in range(metadata.num_columns):
        described = metadata.schema.column(leaf)
        if described.max_repetition_level or not (described.path == column or
                                                  described.path.startswith(column + ".")):
            continue
        stats = [metadata.row_group(group).column(leaf).statistics for group in range(metadata.num_row_groups)]
        if all(s is not None and s.null_count == 0 for s in stats):  # (null_count: None when the file does not say)
            return True
    return False


def _dv_positions(location: str, dv: iceberg_java.JavaDeleteFile) -> ArrowArray:
    """The positions a deletion vector deletes in the data file at `location`."""
    import pyarrow as pa

    return _puffin_vectors(str(dv.location()))[location].combine_chunks().cast(pa.int64())


@functools.lru_cache(maxsize=4)
def _puffin_vectors(puffin: str) -> dict[str, ArrowChunkedArray]:
    """Every deletion vector of a Puffin file, by data file (pyiceberg reads the whole file). A pass writes the DVs
    of all the files it touches into one Puffin file, so a rebuild or a followed snapshot meets it once per data
    file; Iceberg never changes a file in place, so a file's vectors are read once."""
    from pyiceberg.table.puffin import PuffinFile

    with open_file(puffin) as handle:
        vectors: dict[str, ArrowChunkedArray] = PuffinFile(handle.read()).to_vector()
        return vectors


def _deleted_rows(
    location: str, dv: iceberg_java.JavaDeleteFile, spec: TableSpec
) -> tuple[str, list[bytes], list[int]]:
    """The keys and positions of the rows (with a key) of a data file that its deletion vector deletes."""
    import pyarrow.compute as pc

    data = _numbered(_read_columns(location, spec), 0)
    rows = data.filter(pc.and_(data.column("has_key").combine_chunks(),
                               pc.is_in(data.column("pos"), value_set=_dv_positions(location, dv))))
    return location, _keys(rows, len(spec.primary_key)), _ints(rows.column("pos"))


def _live_rows(location: str, dv: iceberg_java.JavaDeleteFile | None, spec: TableSpec) -> tuple[IndexRows, list[int]]:
    """The latest row per key among the rows of a data file its deletion vector does not delete (pyarrow reads the
    key and offset columns, pyiceberg the DV's Puffin file); and the positions of the file's other live rows of
    those keys (none in a file of ours: a pass masks its superseded rows)."""
    import pyarrow.compute as pc

    width = len(spec.primary_key)
    data = _numbered(_read_columns(location, spec), 0)
    keep = data.column("has_key").combine_chunks()
    if dv is not None:
        keep = pc.and_(keep, pc.invert(pc.is_in(data.column("pos"), value_set=_dv_positions(location, dv))))
    rows, first = _sorted_first(data.filter(keep), width, [("o", "descending"), ("pos", "descending")])
    kept = rows.filter(first)
    stale = _ints(rows.filter(pc.invert(first)).column("pos"))
    offsets = _ints(pc.fill_null(kept.column("o"), -1))
    return IndexRows(_keys(kept, width), [location], [0] * kept.num_rows, _ints(kept.column("pos")), offsets), stale


def _read_blob(dv: iceberg_java.JavaDeleteFile) -> bytes:
    """The bytes of a deletion vector's blob in its Puffin file."""
    offset, size = dv.contentOffset(), dv.contentSizeInBytes()
    if offset is None or size is None:
        raise TableMismatchError(f"delete file {dv.location()} is not a deletion vector (upsert tables hold only DVs)")
    with open_file(str(dv.location())) as handle:
        handle.seek(int(offset))
        return bytes(handle.read(int(size)))
