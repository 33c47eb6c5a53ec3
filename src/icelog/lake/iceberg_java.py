"""A typed facade over the Iceberg Java API that Spark jobs reach through py4j.

Every Spark job goes through these functions instead of calling `spark._jvm...` itself, so the Java
objects used are declared once (the Protocols below: only the methods icelog calls) and later work
(row-delta commits with deletion vectors via `Table.newRowDelta()`, maintenance actions) extends this
module rather than scattering untyped calls. Tables are loaded fresh through Spark's own catalog
(`Spark3Util.loadIcebergTable`), so a commit made here is what the session reads next. What the loads, commits
and actions raise is converted to icelog's errors (`@jvm_errors()`, lake/jvm_errors.py: a commit that lost a
race raises CommitConflictError).
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, overload

from icelog.lake.data_files import WrittenFile
from icelog.lake.jvm_errors import from_jvm, jvm_errors

if TYPE_CHECKING:
    from py4j.java_gateway import JVMView
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T", covariant=True)
K = TypeVar("K", covariant=True)
V = TypeVar("V", covariant=True)


class JavaIterator(Protocol[T]):
    """java.util.Iterator."""

    def hasNext(self) -> bool: ...
    def next(self) -> T: ...


class JavaIterable(Protocol[T]):
    """java.lang.Iterable: walk it with `each`, not a Python `for` (see there)."""

    def iterator(self) -> JavaIterator[T]: ...


class JavaMapEntry(Protocol[K, V]):
    """java.util.Map.Entry."""

    def getKey(self) -> K: ...
    def getValue(self) -> V: ...


class JavaMap(Protocol[K, V]):
    """java.util.Map: look keys up with `get`; turn it into a dict with `as_dict`, not a Python `for`."""

    def get(self, key: object) -> V | None: ...  # Map.get(Object)
    def entrySet(self) -> JavaIterable[JavaMapEntry[K, V]]: ...


def each(items: JavaIterable[T]) -> list[T]:
    """The elements of a Java collection, walked by iterator().hasNext()/next().

    py4j's own Python iteration (`for x in java_list`, `dict(java_map.items())`) ends when Java throws
    NoSuchElementException, and in a pyspark session every Java exception goes through pyspark's converter
    (a dozen py4j isinstance round trips): 25-40 ms per loop, ~0.25 s of every upsert pass before this.
    """
    iterator = items.iterator()
    out: list[T] = []
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def as_dict(mapping: JavaMap[object, object]) -> dict[str, str]:
    """A Java Map<String, String> (properties, a snapshot summary) as a dict, walked as `each` does."""
    return {str(entry.getKey()): str(entry.getValue()) for entry in each(mapping.entrySet())}


class JavaSchema(Protocol):
    """org.apache.iceberg.Schema (opaque here: converted to and from JSON with SchemaParser)."""

    def schemaId(self) -> int: ...


class JavaFileIO(Protocol):
    """org.apache.iceberg.io.FileIO (its files are handed back to the Java API)."""

    def newInputFile(self, path: str) -> JavaInputFile: ...


class JavaInputFile(Protocol):
    """org.apache.iceberg.io.InputFile (handed back to the Java API)."""


class JavaManifestFile(Protocol):
    """org.apache.iceberg.ManifestFile (counted here)."""


class JavaList(JavaIterable[T], Protocol):
    """java.util.List."""

    def size(self) -> int: ...


class JavaSortOrder(Protocol):
    """org.apache.iceberg.SortOrder."""

    def isSorted(self) -> bool: ...


class JavaStructLike(Protocol):
    """org.apache.iceberg.StructLike: a data file's partition tuple (opaque here)."""


class JavaPartitionSpec(Protocol):
    """org.apache.iceberg.PartitionSpec (opaque here)."""

    def specId(self) -> int: ...


class JavaDataFile(Protocol):
    """org.apache.iceberg.DataFile."""

    def location(self) -> str: ...
    def specId(self) -> int: ...
    def partition(self) -> JavaStructLike: ...
    def recordCount(self) -> int: ...
    def dataSequenceNumber(self) -> int | None: ...  # the commit order of its rows (None until committed)


class JavaDeleteFile(Protocol):
    """org.apache.iceberg.DeleteFile: here always a deletion vector (a blob of a Puffin file)."""

    def location(self) -> str: ...
    def referencedDataFile(self) -> str | None: ...
    def contentOffset(self) -> int | None: ...
    def contentSizeInBytes(self) -> int | None: ...
    def recordCount(self) -> int: ...


class JavaSnapshot(Protocol):
    """org.apache.iceberg.Snapshot."""

    def snapshotId(self) -> int: ...
    def parentId(self) -> int | None: ...
    def sequenceNumber(self) -> int: ...
    def timestampMillis(self) -> int: ...
    def summary(self) -> JavaMap[str, str]: ...
    def operation(self) -> str | None: ...
    def allManifests(self, io: JavaFileIO) -> JavaList[JavaManifestFile]: ...
    def addedDataFiles(self, io: JavaFileIO) -> JavaIterable[JavaDataFile]: ...
    def removedDataFiles(self, io: JavaFileIO) -> JavaIterable[JavaDataFile]: ...
    def addedDeleteFiles(self, io: JavaFileIO) -> JavaIterable[JavaDeleteFile]: ...


class JavaRowDelta(Protocol):
    """org.apache.iceberg.RowDelta: data files and delete files added (and DVs replaced) in one snapshot."""

    def addRows(self, data_file: JavaDataFile) -> JavaRowDelta: ...
    def addDeletes(self, delete_file: JavaDeleteFile) -> JavaRowDelta: ...
    def removeDeletes(self, delete_file: JavaDeleteFile) -> JavaRowDelta: ...
    def validateFromSnapshot(self, snapshot_id: int) -> JavaRowDelta: ...
    def validateDataFilesExist(self, paths: Iterable[str]) -> JavaRowDelta: ...
    def validateDeletedFiles(self) -> JavaRowDelta: ...
    def validateNoConflictingDeleteFiles(self) -> JavaRowDelta: ...
    def set(self, key: str, value: str) -> JavaRowDelta: ...
    def commit(self) -> None: ...


class JavaFileScanTask(Protocol):
    """org.apache.iceberg.FileScanTask: a data file and the delete files that apply to it."""

    def file(self) -> JavaDataFile: ...
    def deletes(self) -> JavaIterable[JavaDeleteFile]: ...


class JavaScanTasks(JavaIterable[JavaFileScanTask], Protocol):
    """org.apache.iceberg.io.CloseableIterable<FileScanTask>."""

    def close(self) -> None: ...


class JavaTableScan(Protocol):
    """org.apache.iceberg.TableScan."""

    def useSnapshot(self, snapshot_id: int) -> JavaTableScan: ...
    def planFiles(self) -> JavaScanTasks: ...


class JavaPositionDeleteIndex(Protocol):
    """org.apache.iceberg.deletes.PositionDeleteIndex: a deletion vector's positions."""

    def cardinality(self) -> int: ...
    def isDeleted(self, pos: int) -> bool: ...


class JavaDeleteWriteResult(Protocol):
    """org.apache.iceberg.io.DeleteWriteResult."""

    def deleteFiles(self) -> JavaIterable[JavaDeleteFile]: ...
    def rewrittenDeleteFiles(self) -> JavaIterable[JavaDeleteFile]: ...


class JavaDVFileWriter(Protocol):
    """org.apache.iceberg.deletes.BaseDVFileWriter: one Puffin file, one deletion vector per data file."""

    @overload
    def delete(self, path: str, pos: int, spec: JavaPartitionSpec, partition: JavaStructLike) -> None: ...
    @overload
    def delete(
        self, path: str, pos: JavaPositionDeleteIndex, spec: JavaPartitionSpec, partition: JavaStructLike
    ) -> None: ...
    def close(self) -> None: ...
    def result(self) -> JavaDeleteWriteResult: ...


class JavaTableMetadata(Protocol):
    """org.apache.iceberg.TableMetadata (immutable: update* return a new one)."""

    def schema(self) -> JavaSchema: ...
    def lastColumnId(self) -> int: ...
    def updateSchema(self, schema: JavaSchema) -> JavaTableMetadata: ...
    def properties(self) -> JavaMap[str, str]: ...
    def uuid(self) -> str: ...
    def metadataFileLocation(self) -> str | None: ...


class JavaTableOperations(Protocol):
    """org.apache.iceberg.TableOperations: compare-and-swap commits of table metadata."""

    def current(self) -> JavaTableMetadata: ...
    def refresh(self) -> JavaTableMetadata: ...
    def commit(self, base: JavaTableMetadata, metadata: JavaTableMetadata) -> None: ...


class JavaUpdateProperties(Protocol):
    """org.apache.iceberg.UpdateProperties (a pending change; `commit` applies it)."""

    def set(self, key: str, value: str) -> JavaUpdateProperties: ...
    def remove(self, key: str) -> JavaUpdateProperties: ...
    def commit(self) -> None: ...


class JavaExpireSnapshots(Protocol):
    """org.apache.iceberg.ExpireSnapshots (the table API, not the Spark action)."""

    def expireSnapshotId(self, snapshot_id: int) -> JavaExpireSnapshots: ...
    def cleanExpiredFiles(self, clean: bool) -> JavaExpireSnapshots: ...
    def commit(self) -> None: ...


class JavaAppendFiles(Protocol):
    """org.apache.iceberg.AppendFiles."""

    def appendFile(self, data_file: JavaDataFile) -> JavaAppendFiles: ...
    def set(self, key: str, value: str) -> JavaAppendFiles: ...
    def stageOnly(self) -> JavaAppendFiles: ...
    def commit(self) -> None: ...


class JavaTable(Protocol):
    """org.apache.iceberg.Table."""

    def name(self) -> str: ...
    def currentSnapshot(self) -> JavaSnapshot | None: ...
    def snapshot(self, snapshot_id: int) -> JavaSnapshot | None: ...
    def snapshots(self) -> JavaIterable[JavaSnapshot]: ...
    def properties(self) -> JavaMap[str, str]: ...
    def updateProperties(self) -> JavaUpdateProperties: ...
    def operations(self) -> JavaTableOperations: ...
    def refresh(self) -> None: ...
    def location(self) -> str: ...
    def schema(self) -> JavaSchema: ...
    def sortOrder(self) -> JavaSortOrder: ...
    def newRowDelta(self) -> JavaRowDelta: ...
    def newAppend(self) -> JavaAppendFiles: ...
    def newScan(self) -> JavaTableScan: ...
    def expireSnapshots(self) -> JavaExpireSnapshots: ...
    def io(self) -> JavaFileIO: ...
    def specs(self) -> JavaMap[int, JavaPartitionSpec]: ...
    def spec(self) -> JavaPartitionSpec: ...


def _jvm(spark: SparkSession) -> JVMView:
    return spark.sparkContext._jvm


@jvm_errors()
def load_table(spark: SparkSession, name: str) -> JavaTable:
    """The Iceberg table behind a Spark table name (`catalog.ns.table`), loaded fresh from the catalog."""
    table = _jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
    return cast(JavaTable, table)


def refreshed(spark: SparkSession, name: str, table: JavaTable | None) -> JavaTable:
    """`table` refreshed from the catalog (one query; its metadata file read again only if the table changed), or
    the table `name` loaded afresh when there is none or it cannot be refreshed (dropped meanwhile, say)."""
    if table is not None:
        try:
            table.operations().refresh()
            return table
        except Exception as exc:  # noqa: BLE001 - py4j's error for any Java one: the load says what is wrong, if any
            # One line (a catalog that is down fails here every pass: no Java trace in the log).
            log.info("%s: refreshing the table failed (%s); loading it from the catalog", name, from_jvm(exc))
    return load_table(spark, name)


def current_snapshot_summary(table: JavaTable) -> dict[str, str]:
    """The current snapshot's summary ({} for a table without snapshots)."""
    snapshot = table.currentSnapshot()
    return {} if snapshot is None else as_dict(snapshot.summary())


def ancestry(table: JavaTable, max_snapshots: int = 1000) -> Iterator[JavaSnapshot]:
    """The current snapshot, then its parents, newest first (at most `max_snapshots`; expired parents end it)."""
    snapshot = table.currentSnapshot()
    seen = 0
    while snapshot is not None and seen < max_snapshots:
        yield snapshot
        seen += 1
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None


@jvm_errors()
def schema_json(spark: SparkSession, table: JavaTable) -> tuple[str, int]:
    """The table's current schema as Iceberg JSON, and the table's last assigned column id."""
    base = table.operations().current()
    return str(_jvm(spark).org.apache.iceberg.SchemaParser.toJson(base.schema())), int(base.lastColumnId())


@jvm_errors()
def commit_schema(spark: SparkSession, table: JavaTable, schema_json_text: str) -> None:
    """Replace the table's schema by this Iceberg JSON schema, keeping its field ids exactly.

    A compare-and-swap against the metadata the table was loaded with: it fails if someone committed
    since (the caller's pass fails and the next one retries from fresh metadata).
    """
    operations = table.operations()
    base = operations.current()
    schema = _jvm(spark).org.apache.iceberg.SchemaParser.fromJson(schema_json_text)
    operations.commit(base, base.updateSchema(schema))


def table_properties(table: JavaTable) -> dict[str, str]:
    """The table's properties."""
    return as_dict(table.properties())


@jvm_errors()
def set_table_properties(table: JavaTable, properties: Mapping[str, str], remove: Iterable[str] = ()) -> None:
    """Set (and remove) table properties in one commit."""
    update = table.updateProperties()
    for key, value in properties.items():
        update = update.set(key, value)
    for key in remove:
        update = update.remove(key)
    update.commit()


# -- maintenance actions (Iceberg's Spark actions: org.apache.iceberg.spark.actions.SparkActions) -----------
class JavaRewriteDataFilesResult(Protocol):
    """org.apache.iceberg.actions.RewriteDataFiles.Result."""

    def rewrittenDataFilesCount(self) -> int: ...
    def addedDataFilesCount(self) -> int: ...
    def rewrittenBytesCount(self) -> int: ...
    def failedDataFilesCount(self) -> int: ...
    def removedDeleteFilesCount(self) -> int: ...


class JavaExpireSnapshotsResult(Protocol):
    """org.apache.iceberg.actions.ExpireSnapshots.Result."""

    def deletedDataFilesCount(self) -> int: ...
    def deletedManifestsCount(self) -> int: ...
    def deletedManifestListsCount(self) -> int: ...


class JavaRewriteManifestsResult(Protocol):
    """org.apache.iceberg.actions.RewriteManifests.Result."""

    def rewrittenManifests(self) -> JavaIterable[JavaManifestFile]: ...
    def addedManifests(self) -> JavaIterable[JavaManifestFile]: ...


def _actions(spark: SparkSession) -> Any:
    # The actions run Spark jobs from Iceberg's own thread pool, which inherits the calling thread's active
    # session; a Python thread other than the one that built the session has none (py4j gives it a fresh
    # JVM thread), and the rewrite's reads then miss the catalog Iceberg registers for them.
    _jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return _jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)


@jvm_errors()
def rewrite_data_files(
    spark: SparkSession, table: JavaTable, options: Mapping[str, str], sort_column: str, presorted: bool = False
) -> JavaRewriteDataFilesResult:
    """Compact data files, rows in the table's sort order, or `sort_column` ASC NULLS LAST if it has none.

    `presorted`: the caller knows each partition's files hold disjoint runs of the sort order, each file
    sorted (archive files: one contiguous offset range each). Then, if the table has a sort order, the
    bin-pack strategy is used: one read task per file group whose rows Iceberg's writer sorts locally by
    the table's sort order (distribution none): no sampling job and no range shuffle, so each row is read
    once and the rewrite's tasks are one per group. Otherwise the sort strategy (sample, range shuffle,
    sort, write).
    """
    jvm = _jvm(spark)
    action = _actions(spark).rewriteDataFiles(table)
    order = table.sortOrder()
    if order.isSorted() and presorted:
        action = action.binPack()
    elif order.isSorted():
        action = action.sort()
    else:
        builder = jvm.org.apache.iceberg.SortOrder.builderFor(table.schema())
        action = action.sort(builder.asc(sort_column, jvm.org.apache.iceberg.NullOrder.NULLS_LAST).build())
    for key, value in options.items():
        action = action.option(key, value)
    return cast(JavaRewriteDataFilesResult, action.execute())


@jvm_errors()
def expire_snapshots(
    spark: SparkSession, table: JavaTable, older_than_ms: int, retain_last: int
) -> JavaExpireSnapshotsResult:
    """Expire snapshots older than `older_than_ms`, keeping the `retain_last` newest ancestors of the current one."""
    action = _actions(spark).expireSnapshots(table).expireOlderThan(older_than_ms).retainLast(retain_last)
    return cast(JavaExpireSnapshotsResult, action.execute())


@jvm_errors()
def rewrite_manifests(spark: SparkSession, table: JavaTable) -> JavaRewriteManifestsResult:
    """Rewrite the current snapshot's manifests into few, partition-clustered ones."""
    return cast(JavaRewriteManifestsResult, _actions(spark).rewriteManifests(table).execute())


def manifest_count(table: JavaTable) -> int:
    """Manifests (data and delete) of the current snapshot (0 without one)."""
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return 0
    return int(snapshot.allManifests(table.io()).size())


def table_location(table: JavaTable) -> str:
    return str(table.location())


# -- upsert tables: data files written by workers, deletion vectors, row-delta commits -----------------------------
def table_uuid(table: JavaTable) -> str:
    """The table's UUID (a table dropped and made again under the same name has another)."""
    return str(table.operations().current().uuid())


def metadata_location(table: JavaTable) -> str:
    """The metadata file of the table as loaded (what a worker reads to write data files for it)."""
    return str(table.operations().current().metadataFileLocation())


@jvm_errors()
def parquet_data_files(spark: SparkSession, table: JavaTable, written: Iterable[WrittenFile]) -> list[JavaDataFile]:
    """DataFiles of Parquet files a worker wrote for the table (lake/data_files.py), described as Iceberg's own
    writers describe theirs: the partition and the metrics parsed from the file's JSON by ContentFileParser (typed
    by the spec; the metrics as the worker computed them from the footer it wrote, restricted as ParquetUtil
    restricts them: lake/data_files.metrics_json). A file whose worker gave no metrics has them read from its footer
    by ParquetUtil under the table's metrics config (write.metadata.metrics.*): a file opened and a round trip per
    step, ~30-80 ms a file here, against ~2 ms for the JSON.
    """
    jvm = _jvm(spark)
    iceberg = jvm.org.apache.iceberg
    # (Each attribute of a py4j JVM view is a round trip to the JVM: the classes are looked up once, not per file.)
    parser, mapper = iceberg.ContentFileParser, iceberg.util.JsonUtil.mapper()
    spec = table.spec()
    spec_id = spec.specId()
    files = []
    footers = None
    for file in written:
        metrics = json.loads(file.metrics) if file.metrics else {}
        described = parser.fromJson(mapper.readTree(json.dumps({
            "spec-id": spec_id, "content": "DATA", "file-path": file.path, "file-format": "PARQUET",
            "partition": json.loads(file.partition), "file-size-in-bytes": file.size, "record-count": file.records,
            **metrics,
        })), spec)
        if metrics:
            files.append(cast(JavaDataFile, described))
            continue
        if footers is None:
            footers = (iceberg.parquet.ParquetUtil, iceberg.DataFiles, iceberg.MetricsConfig.forTable(table),
                       table.io())
        parquet_util, data_files, metrics_config, io = footers
        read = parquet_util.fileMetrics(io.newInputFile(file.path), metrics_config)
        files.append(cast(JavaDataFile, data_files.builder(spec).copy(described).withMetrics(read).build()))
    return files


def snapshots_since(table: JavaTable, snapshot_id: int) -> list[JavaSnapshot] | None:
    """The current snapshot's ancestors committed after `snapshot_id`, oldest first (None: not an ancestor)."""
    newer: list[JavaSnapshot] = []
    for snapshot in ancestry(table):
        if int(snapshot.snapshotId()) == snapshot_id:
            return newer[::-1]
        newer.append(snapshot)
    return None


def added_data_files(table: JavaTable, snapshot: JavaSnapshot) -> list[JavaDataFile]:
    """The data files a snapshot added."""
    return each(snapshot.addedDataFiles(table.io()))


def removed_data_files(table: JavaTable, snapshot: JavaSnapshot) -> list[JavaDataFile]:
    """The data files a snapshot removed."""
    return each(snapshot.removedDataFiles(table.io()))


def added_delete_files(table: JavaTable, snapshot: JavaSnapshot) -> list[JavaDeleteFile]:
    """The delete files a snapshot added."""
    return each(snapshot.addedDeleteFiles(table.io()))


@dataclass(frozen=True)
class LiveDataFile:
    """A data file of a snapshot and its deletion vector there (None: no row of it deleted)."""

    file: JavaDataFile
    dv: JavaDeleteFile | None


@jvm_errors()
def live_data_files(
    table: JavaTable, snapshot_id: int, paths: Collection[str] | None = None
) -> dict[str, LiveDataFile]:
    """The data files named (None: all of them), as the snapshot has them, each with its deletion vector.

    Plans the snapshot's scan (manifests only, no data read); a path missing from the result is not live
    (compaction replaced it, or a DELETE removed it).
    """
    wanted = None if paths is None else set(paths)
    found: dict[str, LiveDataFile] = {}
    if wanted is not None and not wanted:
        return found
    tasks = table.newScan().useSnapshot(snapshot_id).planFiles()
    try:
        for task in each(tasks):
            data_file = task.file()
            location = str(data_file.location())
            if wanted is not None and location not in wanted:
                continue
            dvs = [d for d in each(task.deletes()) if d.referencedDataFile() is not None]
            found[location] = LiveDataFile(data_file, dvs[0] if dvs else None)
    finally:
        tasks.close()
    return found


class _PreviousDeletes:
    """java.util.function.Function<String, PositionDeleteIndex> implemented in Python (py4j callback):
    the positions a data file's current deletion vector already holds, which the DV writer merges."""

    def __init__(self, indexes: Mapping[str, JavaPositionDeleteIndex]) -> None:
        self.indexes = indexes

    def apply(self, path: object) -> JavaPositionDeleteIndex | None:  # a java.lang.String
        return self.indexes.get(str(path))

    class Java:
        implements = ["java.util.function.Function"]


_CALLBACK_LOCK = threading.Lock()


def _ensure_callback_server(spark: SparkSession) -> None:
    from pyspark.java_gateway import ensure_callback_server_started

    with _CALLBACK_LOCK:
        ensure_callback_server_started(spark.sparkContext._gateway)  # type: ignore[no-untyped-call]


@jvm_errors()
def read_deletion_vector(spark: SparkSession, dv: JavaDeleteFile, blob: bytes) -> JavaPositionDeleteIndex:
    """A deletion vector's positions from its blob's bytes (read by the caller from dv's Puffin file)."""
    index = _jvm(spark).org.apache.iceberg.deletes.PositionDeleteIndex.deserialize(blob, dv)
    return cast(JavaPositionDeleteIndex, index)


_DV_MAGIC = 1681511377  # Iceberg's deletion-vector-v1 blob magic (written little-endian)
_ROARING_NO_RUNS = 12346  # RoaringBitmap's portable format cookie without run containers


def dv_blob(positions: list[int]) -> bytes:
    """Sorted, distinct positions as a deletion-vector-v1 blob (Iceberg's Puffin spec).

    Big-endian length of magic + bitmap, the magic, the 64-bit Roaring bitmap in its portable form (count of
    32-bit bitmaps, then per high-32-bit key its key and a portable RoaringBitmap with array and bitmap
    containers), big-endian CRC-32 of magic + bitmap. PositionDeleteIndex.deserialize checks length and CRC.
    """
    highs: dict[int, list[int]] = {}
    for pos in positions:
        highs.setdefault(pos >> 32, []).append(pos & 0xFFFFFFFF)
    count = max(highs) + 1 if highs else 0
    body = [struct.pack("<q", count)]
    for key in range(count):  # Iceberg writes every key below the highest, empty bitmaps included
        body += [struct.pack("<I", key), _roaring32(highs.get(key, []))]
    data = struct.pack("<I", _DV_MAGIC) + b"".join(body)
    return struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))


def _roaring32(values: list[int]) -> bytes:
    containers: dict[int, list[int]] = {}
    for value in values:
        containers.setdefault(value >> 16, []).append(value & 0xFFFF)
    keys = sorted(containers)
    header = struct.pack("<II", _ROARING_NO_RUNS, len(keys))
    header += b"".join(struct.pack("<HH", k, len(containers[k]) - 1) for k in keys)
    payloads = []
    for k in keys:
        lows = containers[k]
        if len(lows) <= 4096:
            payloads.append(struct.pack(f"<{len(lows)}H", *lows))
        else:
            words = [0] * 1024
            for low in lows:
                words[low >> 6] |= 1 << (low & 63)
            payloads.append(struct.pack("<1024Q", *words))
    offset = len(header) + 4 * len(keys)
    offsets = []
    for payload in payloads:
        offsets.append(struct.pack("<I", offset))
        offset += len(payload)
    return header + b"".join(offsets) + b"".join(payloads)


def position_index(
    spark: SparkSession, path: str, positions: Iterable[int], spec: JavaPartitionSpec, partition: JavaStructLike | None
) -> JavaPositionDeleteIndex:
    """A data file's positions as a Java PositionDeleteIndex in a few py4j calls, whatever their number.

    The blob is built here (dv_blob) and deserialized by Iceberg, which checks its length and CRC; the
    DeleteFile it is read "from" only carries the blob's size (it is never written or committed).
    """
    jvm = _jvm(spark)
    ordered = sorted(set(positions))
    blob = dv_blob(ordered)
    carrier = (
        jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(spec).ofPositionDeletes()
        .withFormat(jvm.org.apache.iceberg.FileFormat.PUFFIN).withPath(f"{path}.pending-dv")
        .withPartition(partition).withFileSizeInBytes(len(blob)).withContentOffset(0)
        .withContentSizeInBytes(len(blob)).withReferencedDataFile(path).withRecordCount(len(ordered)).build()
    )
    return read_deletion_vector(spark, cast(JavaDeleteFile, carrier), blob)


@dataclass(frozen=True)
class WrittenDVs:
    """Deletion vectors written (one per data file, old positions included) and the ones they replace."""

    added: list[JavaDeleteFile]
    replaced: list[JavaDeleteFile]


@jvm_errors()
def write_deletion_vectors(
    spark: SparkSession,
    table: JavaTable,
    positions: Mapping[str, Iterable[int]],
    files: Mapping[str, LiveDataFile],
    previous: Mapping[str, JavaPositionDeleteIndex],
) -> WrittenDVs:
    """Write one Puffin file with a deletion vector per data file in `positions` (BaseDVFileWriter).

    `previous`: the positions of each file's current DV (read_deletion_vector); the writer merges them into
    the new DV and reports the old DV as replaced, so a data file keeps exactly one DV.
    """
    jvm = _jvm(spark)
    _ensure_callback_server(spark)
    factory = (
        jvm.org.apache.iceberg.io.OutputFileFactory.builderFor(table, 0, 0)
        .format(jvm.org.apache.iceberg.FileFormat.PUFFIN)
        .build()
    )
    writer = cast(
        JavaDVFileWriter, jvm.org.apache.iceberg.deletes.BaseDVFileWriter(factory, _PreviousDeletes(previous))
    )
    specs = table.specs()
    try:
        for path, poss in positions.items():
            data_file = files[path].file
            spec = specs.get(data_file.specId())
            assert spec is not None, f"{path}: no partition spec {data_file.specId()}"
            partition = data_file.partition()
            writer.delete(path, position_index(spark, path, poss, spec, partition), spec, partition)
    finally:
        writer.close()
    result = writer.result()
    return WrittenDVs(each(result.deleteFiles()), each(result.rewrittenDeleteFiles()))


@jvm_errors()
def commit_append(
    table: JavaTable, data_files: Iterable[JavaDataFile], summary: Mapping[str, str], stage_only: bool = False
) -> None:
    """Append data files in one snapshot whose summary carries `summary`. An append conflicts with nothing: on a
    concurrent commit Iceberg retries it on the new base (commit.retry.*). `stage_only` writes the snapshot
    without making it current (what a crash between the two looks like, for the fault tests)."""
    append = table.newAppend()
    for data_file in data_files:
        append = append.appendFile(data_file)
    for key, value in summary.items():
        append = append.set(key, value)
    if stage_only:
        append = append.stageOnly()
    append.commit()


@jvm_errors()
def commit_row_delta(
    table: JavaTable,
    base_snapshot_id: int | None,
    data_files: Iterable[JavaDataFile],
    dvs: WrittenDVs,
    referenced: Iterable[str],
    summary: Mapping[str, str],
) -> int:
    """Commit data files and deletion vectors in one snapshot, checked against everything since the base.

    Fails (and nothing is published) if since `base_snapshot_id` another commit removed a data file the DVs
    reference (compaction, a copy-on-write DELETE: validateDataFilesExist, validateDeletedFiles) or added a
    deletion vector to one of them (Iceberg's RowDelta always checks concurrently added DVs of the data files
    it adds DVs for); the caller's pass fails and the next one starts over from the table. Deletes another
    writer added to other data files do not conflict: an analyst's steady DELETEs elsewhere in the table must
    not stall archiving (a conflict filter of `true`, validateNoConflictingDeleteFiles, failed every pass while
    they ran, and its index of the new deletes refused two DVs of one file in successive snapshots).
    Returns the new snapshot's id.
    """
    delta = table.newRowDelta()
    for data_file in data_files:
        delta = delta.addRows(data_file)
    for dv in dvs.added:
        delta = delta.addDeletes(dv)
    for old in dvs.replaced:
        delta = delta.removeDeletes(old)
    paths = list(referenced)
    if base_snapshot_id is not None:
        delta = delta.validateFromSnapshot(base_snapshot_id)
    if paths:
        delta = delta.validateDataFilesExist(paths).validateDeletedFiles()
    for key, value in summary.items():
        delta = delta.set(key, value)
    delta.commit()
    table.refresh()
    current = table.currentSnapshot()
    assert current is not None
    return int(current.snapshotId())
