"""A typed facade over the Iceberg Java API that Spark jobs reach through py4j.

Every Spark job goes through these functions instead of calling `spark._jvm...` itself, so the Java
objects used are declared once (the Protocols below: only the methods icelog calls) and later work
(row-delta commits with deletion vectors via `Table.newRowDelta()`, maintenance actions) extends this
module rather than scattering untyped calls. Tables are loaded fresh through Spark's own catalog
(`Spark3Util.loadIcebergTable`), so a commit made here is what the session reads next.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, cast


class JavaSchema(Protocol):
    """org.apache.iceberg.Schema (opaque here: converted to and from JSON with SchemaParser)."""

    def schemaId(self) -> int: ...


class JavaSnapshot(Protocol):
    """org.apache.iceberg.Snapshot."""

    def snapshotId(self) -> int: ...
    def parentId(self) -> int | None: ...
    def timestampMillis(self) -> int: ...
    def summary(self) -> Mapping[str, str]: ...
    def operation(self) -> str | None: ...
    def allManifests(self, io: Any) -> Any: ...


class JavaTableMetadata(Protocol):
    """org.apache.iceberg.TableMetadata (immutable: update* return a new one)."""

    def schema(self) -> JavaSchema: ...
    def lastColumnId(self) -> int: ...
    def updateSchema(self, schema: JavaSchema) -> JavaTableMetadata: ...
    def properties(self) -> Mapping[str, str]: ...


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


class JavaTable(Protocol):
    """org.apache.iceberg.Table."""

    def name(self) -> str: ...
    def currentSnapshot(self) -> JavaSnapshot | None: ...
    def snapshot(self, snapshot_id: int) -> JavaSnapshot | None: ...
    def snapshots(self) -> Iterable[JavaSnapshot]: ...
    def properties(self) -> Mapping[str, str]: ...
    def updateProperties(self) -> JavaUpdateProperties: ...
    def operations(self) -> JavaTableOperations: ...
    def refresh(self) -> None: ...
    def location(self) -> str: ...
    def schema(self) -> JavaSchema: ...
    def sortOrder(self) -> Any: ...
    def io(self) -> Any: ...


def _jvm(spark: Any) -> Any:
    return spark.sparkContext._jvm


def load_table(spark: Any, name: str) -> JavaTable:
    """The Iceberg table behind a Spark table name (`catalog.ns.table`), loaded fresh from the catalog."""
    table = _jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
    return cast(JavaTable, table)


def current_snapshot_summary(table: JavaTable) -> dict[str, str]:
    """The current snapshot's summary ({} for a table without snapshots)."""
    snapshot = table.currentSnapshot()
    return {} if snapshot is None else {str(k): str(v) for k, v in snapshot.summary().items()}


def ancestry(table: JavaTable, max_snapshots: int = 1000) -> Iterator[JavaSnapshot]:
    """The current snapshot, then its parents, newest first (at most `max_snapshots`; expired parents end it)."""
    snapshot = table.currentSnapshot()
    seen = 0
    while snapshot is not None and seen < max_snapshots:
        yield snapshot
        seen += 1
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None


def schema_json(spark: Any, table: JavaTable) -> tuple[str, int]:
    """The table's current schema as Iceberg JSON, and the table's last assigned column id."""
    base = table.operations().current()
    return str(_jvm(spark).org.apache.iceberg.SchemaParser.toJson(base.schema())), int(base.lastColumnId())


def commit_schema(spark: Any, table: JavaTable, schema_json_text: str) -> None:
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
    return {str(k): str(v) for k, v in table.properties().items()}


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

    def rewrittenManifests(self) -> Iterable[Any]: ...
    def addedManifests(self) -> Iterable[Any]: ...


def _actions(spark: Any) -> Any:
    # The actions run Spark jobs from Iceberg's own thread pool, which inherits the calling thread's active
    # session; a Python thread other than the one that built the session has none (py4j gives it a fresh
    # JVM thread), and the rewrite's reads then miss the catalog Iceberg registers for them.
    _jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return _jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)


def rewrite_data_files(
    spark: Any, table: JavaTable, options: Mapping[str, str], sort_column: str
) -> JavaRewriteDataFilesResult:
    """Compact data files with the sort strategy: the table's sort order, or `sort_column` ASC NULLS LAST."""
    jvm = _jvm(spark)
    action = _actions(spark).rewriteDataFiles(table)
    order = table.sortOrder()
    if order.isSorted():
        action = action.sort()
    else:
        builder = jvm.org.apache.iceberg.SortOrder.builderFor(table.schema())
        action = action.sort(builder.asc(sort_column, jvm.org.apache.iceberg.NullOrder.NULLS_LAST).build())
    for key, value in options.items():
        action = action.option(key, value)
    return cast(JavaRewriteDataFilesResult, action.execute())


def expire_snapshots(spark: Any, table: JavaTable, older_than_ms: int, retain_last: int) -> JavaExpireSnapshotsResult:
    """Expire snapshots older than `older_than_ms`, keeping the `retain_last` newest ancestors of the current one."""
    action = _actions(spark).expireSnapshots(table).expireOlderThan(older_than_ms).retainLast(retain_last)
    return cast(JavaExpireSnapshotsResult, action.execute())


def rewrite_manifests(spark: Any, table: JavaTable) -> JavaRewriteManifestsResult:
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
