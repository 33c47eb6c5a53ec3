"""Upsert tables: one pass of a primary-key topic becomes one Iceberg commit of data files plus deletion vectors.

A pass (the rows decoded by the archiver's Spark workers, as for an append table):
  1. the table's primary-key index (lake/pk_index.py) is brought to the table's current snapshot (the base),
     rebuilt from the table when it reflects another snapshot or none (reading only the key, `_file`, `_pos`
     and the offset of live rows; Spark honours the deletion vectors);
  2. within the pass only the latest row per key is kept (highest offset); a latest row that is a tombstone
     (null value) is not written but deletes the key's previous row;
  3. Spark writes the kept rows' data files as a staged snapshot (write-audit-publish: `spark.wap.id`), never
     published;
  4. the driver reads the key and offset columns of those files (position = row number), looks the keys up in
     the index, and writes one deletion vector per data file that holds a replaced row (BaseDVFileWriter, into
     one Puffin file; a file's existing DV is merged in and replaced, so a data file keeps one DV);
  5. one RowDelta commits the staged data files and the DVs, with the offsets map in the snapshot summary
     (exactly-once as for appends: reconcile.py), validated against every commit since the base (a
     concurrent compaction or DELETE of a referenced file fails it; the next pass starts over);
  6. the index takes the new rows and the new snapshot id in one transaction.
A crash before 5 leaves unreferenced files and a staged snapshot; after 5, an index behind the table, which 1
rebuilds. Never equality deletes, never a data file rewritten on the write path.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from icelog.errors import IcelogError
from icelog.lake import iceberg_java
from icelog.lake.layout import PRIMARY_KEY_PROPERTY, TableSpec, quote_path
from icelog.lake.pk_index import IndexEntry, PrimaryKeyIndex, encode_key
from icelog.topic_configs.table import (
    BUCKET,
    LAYOUT_TABLE,
    OFFSET,
    VALUE_BYTES,
    VALUE_ERR,
    VALUE_PREFIX,
)

log = logging.getLogger(__name__)

# spark.wap.id is a session conf: upsert writes of different topics (archiver threads) take turns staging.
_STAGE_LOCK = threading.Lock()
_RANK = "__icelog_rank"


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


def tombstone_condition(spec: TableSpec, columns: list[str]) -> str:
    """Spark SQL: the row's record had a null value."""
    if spec.layout != LAYOUT_TABLE:
        return "`value` IS NULL"
    present = [c for c in (VALUE_BYTES, VALUE_PREFIX, VALUE_ERR) if c in columns]
    return " AND ".join(f"{quote_path(c)} IS NULL" for c in present)


def write_upserts(
    spark: Any,
    table_name: str,
    frame: Any,
    spec: TableSpec,
    summary: Mapping[str, str],
    data_dir: str,
    fault: Callable[[str], None] = lambda _stage: None,
) -> UpsertResult:
    """Upsert the decoded rows of one pass into the table in one commit (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    table = iceberg_java.load_table(spark, table_name)
    key_property = ",".join(spec.primary_key)
    found_key = iceberg_java.table_properties(table).get(PRIMARY_KEY_PROPERTY)
    if found_key != key_property:
        raise IcelogError(
            f"table {table_name} is not an upsert table keyed by {key_property} (its {PRIMARY_KEY_PROPERTY} is "
            f"{found_key!r}); a primary key is fixed when a table is created: drop the table, or archive the topic "
            "into another with icelog.archive.iceberg.table"
        )
    if spec.layout != LAYOUT_TABLE and list(frame.schema["key"].dataType.fieldNames()) != ["__raw__"]:
        # The record layout keeps key.__raw__ only when the decoded fields cannot rebuild the key.
        raise IcelogError(
            f"{table_name}: a compacted topic whose key has a schema needs icelog.archive.layout=table (its __key "
            "keeps every key's bytes); recreate the topic with it, or set icelog.schema.key=none"
        )
    current = table.currentSnapshot()
    base = None if current is None else int(current.snapshotId())
    index = PrimaryKeyIndex.for_table(data_dir, iceberg_java.table_uuid(table))
    try:
        stages = _Stages()
        rebuilt = refresh_index(spark, table_name, spec, index, base)
        stages.done("index")

        keys = [F.col(quote_path(c)) for c in spec.primary_key]
        order = Window.partitionBy(*keys).orderBy(
            F.col(quote_path(offset_column(spec))).desc(), F.col(quote_path(partition_column(spec))).desc()
        )
        has_key = F.lit(True)
        for column in keys:
            has_key = has_key & column.isNotNull()
        latest = frame.where(has_key).withColumn(_RANK, F.row_number().over(order)).where(F.col(_RANK) == 1)
        latest = latest.drop(_RANK).persist()
        try:
            tombstone = F.expr(tombstone_condition(spec, latest.columns))
            tombstoned = [
                encode_key(tuple(row)) for row in latest.where(tombstone).select(*keys).toLocalIterator()
            ]
            stages.done("dedup")
            staged = _stage(spark, table_name, latest.where(~tombstone))
            stages.done("stage")
        finally:
            latest.unpersist()

        table = iceberg_java.load_table(spark, table_name)
        data_files = [] if staged is None else iceberg_java.added_data_files(table, staged)
        new_rows: dict[bytes, IndexEntry] = {}
        for data_file in data_files:
            location = str(data_file.location())
            for pos, (key, offset) in enumerate(_read_keys(location, spec)):
                new_rows[key] = IndexEntry(location, pos, offset)
        stages.done("read-keys")
        old = index.lookup([*new_rows, *tombstoned])
        stages.done("lookup")
        positions: dict[str, set[int]] = {}
        for entry in old.values():
            positions.setdefault(entry.file, set()).add(entry.pos)

        dvs = iceberg_java.WrittenDVs([], [])
        if positions:
            assert base is not None  # the index holds rows only of a table that has a snapshot
            files = iceberg_java.live_data_files(table, base, positions)
            missing = sorted(set(positions) - set(files))
            if missing:
                index.forget_snapshot()
                raise IcelogError(
                    f"{table_name}: the primary-key index names data files the table no longer has ({missing[0]}"
                    f"{' and more' if len(missing) > 1 else ''}); it is rebuilt on the next pass"
                )
            previous = {
                path: iceberg_java.read_deletion_vector(spark, live.dv, _read_blob(live.dv))
                for path, live in files.items()
                if live.dv is not None
            }
            stages.done("plan")
            dvs = iceberg_java.write_deletion_vectors(spark, table, positions, files, previous)
            stages.done("dvs")
        fault("after-write")
        snapshot_id = iceberg_java.commit_row_delta(table, base, data_files, dvs, positions, summary)
        stages.done("commit")
        fault("after-commit-before-index")
        index.apply(snapshot_id, new_rows, [k for k in tombstoned if k not in new_rows])
        replaced = sum(len(p) for p in positions.values())
        stages.done("index-update")
        log.info("upsert %s: %d rows written, %d tombstones, %d rows replaced (%d deletion vectors); %s",
                 table_name, len(new_rows), len(tombstoned), replaced, len(dvs.added), stages)
        return UpsertResult(snapshot_id, len(new_rows), len(tombstoned), replaced, rebuilt)
    finally:
        index.close()


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


def refresh_index(spark: Any, table_name: str, spec: TableSpec, index: PrimaryKeyIndex, base: int | None) -> bool:
    """Bring the index to the table's snapshot `base`; returns whether it had to be rebuilt.

    When every snapshot since the index's is a REPLACE (external compaction: `rewrite_data_files`, or a
    rewrite of delete files or manifests), the rows those snapshots moved are updated in place (Nobu's
    mailbox, applied before the batch). Otherwise (no index, a crash before the index update, a foreign
    append or DELETE) the index is rebuilt from the table, reading only the key, `_file`, `_pos` and offset
    columns of the live rows (deletion vectors honoured).
    """
    known = index.snapshot_id()
    if known == base:
        return False
    if known is not None and base is not None and apply_replaces(spark, table_name, spec, index, known):
        return False
    if base is None:
        index.rebuild(None, ())
        return True
    selected = ", ".join(f"{quote_path(c)} AS k{i}" for i, c in enumerate(spec.primary_key))
    query = (
        f"SELECT {selected}, _file, _pos, {quote_path(offset_column(spec))} AS o "
        f"FROM {table_name} VERSION AS OF {base}"
    )
    width = len(spec.primary_key)

    def rows() -> Iterator[tuple[bytes, IndexEntry]]:
        for row in spark.sql(query).toLocalIterator():
            yield encode_key(tuple(row[:width])), IndexEntry(str(row["_file"]), int(row["_pos"]), int(row["o"]))

    count = index.rebuild(base, rows())
    log.info("%s: primary-key index rebuilt from snapshot %d (%d keys)", table_name, base, count)
    return True


def apply_replaces(spark: Any, table_name: str, spec: TableSpec, index: PrimaryKeyIndex, known: int) -> bool:
    """Move the index's rows to where the REPLACE snapshots since `known` put them; False if some snapshot
    since is not a REPLACE (or `known` is not an ancestor): the caller rebuilds instead.

    A compaction writes only live rows (it applies the deletion vectors), every live row of a file it
    rewrites goes to one of its new files, and a row keeps its offset: so a key whose index entry has the
    offset of a row in a new file moved there, at that row's position.
    """
    table = iceberg_java.load_table(spark, table_name)
    since = iceberg_java.snapshots_since(table, known)
    if since is None or any(str(s.operation()) != "replace" for s in since):
        return False
    for snapshot in since:
        moved: dict[bytes, IndexEntry] = {}
        for data_file in iceberg_java.added_data_files(table, snapshot):
            location = str(data_file.location())
            for pos, (key, offset) in enumerate(_read_keys(location, spec)):
                moved[key] = IndexEntry(location, pos, offset)
        current = index.lookup(moved)
        index.apply(int(snapshot.snapshotId()),
                    {k: e for k, e in moved.items() if k in current and current[k].offset == e.offset}, ())
        log.info("%s: primary-key index follows REPLACE snapshot %d (%d rows moved)", table_name,
                 int(snapshot.snapshotId()), len(moved))
    return True


def _stage(spark: Any, table_name: str, rows: Any) -> iceberg_java.JavaSnapshot | None:
    """Write the rows' data files as a staged snapshot (not published); None if Spark staged none."""
    wap_id = uuid.uuid4().hex
    with _STAGE_LOCK:
        spark.conf.set("spark.wap.id", wap_id)
        try:
            rows.writeTo(table_name).append()
        finally:
            spark.conf.unset("spark.wap.id")
    return iceberg_java.staged_snapshot(iceberg_java.load_table(spark, table_name), wap_id)


def _open(location: str) -> tuple[Any, str]:
    import pyarrow.fs

    if location.startswith("file:"):
        return pyarrow.fs.LocalFileSystem(), "/" + location.removeprefix("file:").lstrip("/")
    filesystem, path = pyarrow.fs.FileSystem.from_uri(location)
    return filesystem, path


def _read_keys(location: str, spec: TableSpec) -> Iterator[tuple[bytes, int]]:
    """(encoded key, offset) of each row of a data file, in file order (the row's position)."""
    import pyarrow.parquet as pq

    paths = [*spec.primary_key, offset_column(spec)]
    tops = list(dict.fromkeys(p.split(".")[0] for p in paths))
    filesystem, path = _open(location)
    with filesystem.open_input_file(path) as handle:
        data = pq.read_table(handle, columns=tops)
    columns = []
    for p in paths:
        parts = p.split(".")
        array = data.column(parts[0]).combine_chunks()
        for part in parts[1:]:
            array = array.field(part)
        columns.append(array.to_pylist())
    *keys, offsets = columns
    for i, offset in enumerate(offsets):
        yield encode_key(tuple(k[i] for k in keys)), int(offset)


def _read_blob(dv: iceberg_java.JavaDeleteFile) -> bytes:
    """The bytes of a deletion vector's blob in its Puffin file."""
    offset, size = dv.contentOffset(), dv.contentSizeInBytes()
    if offset is None or size is None:
        raise IcelogError(f"delete file {dv.location()} is not a deletion vector (upsert tables hold only DVs)")
    filesystem, path = _open(str(dv.location()))
    with filesystem.open_input_file(path) as handle:
        handle.seek(int(offset))
        return bytes(handle.read(int(size)))
