"""Data files written by pyiceberg in Spark's Python workers, for the driver to commit (every archive pass).

An append pass commits its data files in one AppendFiles (archive/archiver.py), an upsert pass its data files and
its deletion vectors in one RowDelta (archive/upsert.py), so data files are written without a commit. The worker
that decoded a task's rows writes them itself, with pyiceberg's
Parquet writer and the table's metadata (its schema's field ids, partition spec, location provider and
`write.parquet.*` properties): no Arrow → JVM row → Parquet conversion, no staged snapshot. The task yields one row
per file (a WrittenFile) with its metrics, as pyiceberg's writer computed them from the footer it had in hand, in
the JSON of Iceberg's ContentFileParser; the driver parses that into the DataFile (lake/iceberg_java.parquet_data_files)
instead of opening every file again to read its footer (ParquetUtil.fileMetrics: ~30-80 ms a file, most of a pass's
"describe"). The metrics are the ones Iceberg's Java writers record: counts and bounds of fields outside lists and
maps, only column sizes of those inside (tests/lake/test_data_files.py compares them with Spark's writer's). A table
too wide for that (more than Java's 100 columns with default metrics) leaves them to the driver's footer read.
The job is an RDD job over the task numbers (write_data_files): the rows never enter the JVM, so a DataFrame's
planning, code generation and Arrow conversions would be pure overhead (~0.08 s of every pass).
A task that fails leaves files no snapshot references (orphans, which maintenance removes), as a Spark write does.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icelog.table.arrow import null_array

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.types import IcebergType
    from pyspark.sql import SparkSession

    from icelog.table.arrow import ArrowArray

    TaskDecoder = Callable[[Iterable[int]], Iterator[pa.RecordBatch]]  # task numbers → their rows as Arrow batches

from icelog.lake.jvm_errors import in_worker, jvm_errors

BUFFERED_BYTES = 256 << 20  # a task's decoded rows held before they are written out (Arrow bytes)
ROW_GROUP_BYTES = "write.parquet.row-group-size-bytes"  # Iceberg's (Java writers') row-group size
ROW_GROUP_ROWS = "write.parquet.row-group-limit"  # pyiceberg's: it sizes row groups in rows only
METRICS_DEFAULT = "write.metadata.metrics.default"
# Iceberg's MetricsConfig: past this many columns, a table that sets no default mode records no metrics for the rest
# (MetricsConfig.forTable; pyiceberg has no such rule, so such a table's files are described from their footers)
MAX_INFERRED_COLUMNS = 100


@dataclass(frozen=True)
class WrittenFile:
    """A data file a worker wrote: where it is, its size and row count, and its partition as Iceberg's JSON of a
    content file has it ({"<partition field id>": value}, values as SingleValueParser writes them), for
    ContentFileParser."""

    path: str
    size: int
    records: int
    partition: str  # JSON
    # The file's metrics as ContentFileParser's JSON has them ({"column-sizes": {"keys": [...], "values": [...]},
    # ..., "lower-bounds": ..., bounds as hex}); "": none, the driver reads them from the footer
    metrics: str = ""
    # The seconds the task that wrote the file spent decoding and writing since its previous file (a pass's
    # timings: archive/archiver.PassTimings), and the task's number (its first)
    decode_s: float = 0.0
    write_s: float = 0.0
    task: int = -1


def write_data_files(
    spark: SparkSession, metadata_location: str, tasks: int, decode: TaskDecoder, io_properties: Mapping[str, str]
) -> list[WrittenFile]:
    """Decode and write the rows of tasks 0..tasks-1 (`decode` yields a task's rows as Arrow batches) as data files
    of the table whose metadata file is `metadata_location`, in one Spark job of `tasks` tasks; commit nothing.

    Workers reach the warehouse through pyiceberg's FileIO for its scheme, given the catalog's properties
    (archive.catalog_properties). Rows keep their decoded order within a file (each file holds one partition's
    rows, in offset order).
    A task that fails raises WorkerError (lake/jvm_errors.py).
    """
    writer = in_worker(file_writer(metadata_location, decode, io_properties))
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    with jvm_errors():
        return [WrittenFile(*row) for row in rdd.mapPartitions(writer).collect()]


def file_writer(
    metadata_location: str, decode: TaskDecoder, io_properties: Mapping[str, str]
) -> Callable[[Iterable[int]], Iterator[tuple[str, int, int, str, str, float, float, int]]]:
    """The function a task of write_data_files runs over its task numbers: yields a WrittenFile's fields per file.

    The task's time goes to decode_s (decoding its rows) and write_s (reading the table's metadata, writing
    Parquet), the first file of each write carrying what was spent since the one before it."""

    def write(tasks: Iterable[int]) -> Iterator[tuple[str, int, int, str, str, float, float, int]]:
        import pyarrow as pa
        from pyiceberg.io import load_file_io
        from pyiceberg.serializers import FromInputFile

        numbers = list(tasks)
        task = numbers[0] if numbers else -1
        started = [time.perf_counter()]

        def written(rows: pa.Table) -> Iterator[tuple[str, int, int, str, str, float, float, int]]:
            decoded = time.perf_counter()
            files = list(_written(metadata, io, rows, write_uuid, counter))
            times = [decoded - started[0], time.perf_counter() - decoded + setup[0]]  # the first file carries them
            for fields in files:
                yield (*fields, times[0], times[1], task)
                times = [0.0, 0.0]
            started[0] = time.perf_counter()  # (not counting the time Spark takes to send the rows)
            setup[0] = 0.0

        io = load_file_io(dict(io_properties), metadata_location)
        metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
        setup = [time.perf_counter() - started[0]]  # the table's metadata read: counted as writing
        started[0] = time.perf_counter()
        write_uuid, counter = uuid.uuid4(), itertools.count(0)
        held: list[pa.RecordBatch] = []
        size = 0
        for batch in decode(numbers):
            if batch.num_rows:
                held.append(batch)
                size += batch.nbytes
            if size >= BUFFERED_BYTES:
                yield from written(pa.Table.from_batches(held))
                held, size = [], 0
        if held:
            yield from written(pa.Table.from_batches(held))

    return write


def _written(
    metadata: TableMetadata, io: FileIO, rows: pa.Table, write_uuid: uuid.UUID, counter: itertools.count[int]
) -> Iterator[tuple[str, int, int, str, str]]:
    """Write `rows` as the table's data files (split by partition, then by target size); a WrittenFile's fields
    per file."""
    # pyiceberg's own table-write path (Table.append uses it), here without the commit: partitions the rows by
    # the spec's transforms, bin-packs to write.target-file-size-bytes, writes Parquet with the schema's field ids.
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    _keep_null_lists_and_maps()
    _bound_struct_fields()

    spec, schema = metadata.spec(), metadata.schema()
    in_collections, leaves = collection_fields(schema)
    described = leaves <= MAX_INFERRED_COLUMNS or METRICS_DEFAULT in metadata.properties
    metadata = metadata.model_copy(update={"properties": writer_properties(metadata.properties, rows)})
    for data_file in _dataframe_to_data_files(metadata, rows, io, write_uuid, counter):
        values = {}
        for position, field in enumerate(spec.fields):
            result_type = field.transform.result_type(schema.find_field(field.source_id).field_type)
            values[str(field.field_id)] = partition_json_value(result_type, data_file.partition[position])
        metrics = metrics_json(data_file, in_collections) if described else ""
        yield data_file.file_path, data_file.file_size_in_bytes, data_file.record_count, json.dumps(values), metrics


def collection_fields(schema: Schema) -> tuple[set[int], int]:
    """The ids of the fields inside a list or a map (at any depth), and how many primitive fields the schema has."""
    from pyiceberg.types import ListType, MapType, StructType

    inside: set[int] = set()
    leaves = 0

    def walk(kind: IcebergType, nested: bool) -> None:
        nonlocal leaves
        if isinstance(kind, StructType):
            for field in kind.fields:
                if nested:
                    inside.add(field.field_id)
                walk(field.field_type, nested)
        elif isinstance(kind, ListType):
            inside.add(kind.element_id)
            walk(kind.element_type, True)
        elif isinstance(kind, MapType):
            inside.update((kind.key_id, kind.value_id))
            walk(kind.key_type, True)
            walk(kind.value_type, True)
        else:
            leaves += 1

    walk(schema.as_struct(), False)
    return inside, leaves


def metrics_json(data_file: DataFile, in_collections: Collection[int]) -> str:
    """A pyiceberg DataFile's metrics in ContentFileParser's JSON, as Iceberg's Java ParquetUtil records them: column
    sizes of every column; value, null and NaN counts and bounds only of fields outside lists and maps."""

    def counts(found: Mapping[int, int] | None, every: bool = False) -> dict[str, list[int]]:
        kept = sorted((k, v) for k, v in (found or {}).items() if every or k not in in_collections)
        return {"keys": [k for k, _ in kept], "values": [v for _, v in kept]}

    def bounds(found: Mapping[int, bytes] | None) -> dict[str, list[Any]]:
        kept = sorted((k, v) for k, v in (found or {}).items() if k not in in_collections and v is not None)
        return {"keys": [k for k, _ in kept], "values": [bytes(v).hex().upper() for _, v in kept]}

    return json.dumps({
        "column-sizes": counts(data_file.column_sizes, every=True),
        "value-counts": counts(data_file.value_counts),
        "null-value-counts": counts(data_file.null_value_counts),
        "nan-value-counts": counts(data_file.nan_value_counts),
        "lower-bounds": bounds(data_file.lower_bounds),
        "upper-bounds": bounds(data_file.upper_bounds),
    }, separators=(",", ":"))


def _keep_null_lists_and_maps() -> None:
    """Make pyiceberg's writer keep null lists and maps null (once per worker process).

    Its projection onto the file schema (pyiceberg.io.pyarrow.ArrowProjectionVisitor, 0.12) rebuilds a list of
    structs and a map with struct values from their offsets alone, working around apache/arrow#38809, which
    drops their validity: a null list or map (a field of a payload that did not decode, an absent optional field)
    would be written as an empty one, and a row would not read back as it was decoded. The subclass puts the
    nulls back where the input had them; `_to_requested_schema` looks the visitor up by its module's name.
    """
    import pyarrow.compute as pc
    from pyiceberg.io import pyarrow as pyarrow_io

    base = pyarrow_io.ArrowProjectionVisitor
    if getattr(base, "keeps_nulls", False):
        return

    def nulls_back(projected: ArrowArray | None, original: ArrowArray | None) -> ArrowArray | None:
        if projected is None or original is None or original.null_count == projected.null_count:
            return projected
        kept: ArrowArray = pc.if_else(original.is_null(), null_array(len(projected), projected.type), projected)
        return kept

    class NullKeepingProjection(base):  # type: ignore[misc, valid-type]  # pyiceberg's class, chosen at run time
        keeps_nulls = True

        def list(self, list_type: pa.DataType, list_array: ArrowArray | None,
                 value_array: ArrowArray | None) -> ArrowArray | None:
            return nulls_back(super().list(list_type, list_array, value_array), list_array)

        def map(self, map_type: pa.DataType, map_array: ArrowArray | None, key_result: ArrowArray | None,
                value_result: ArrowArray | None) -> ArrowArray | None:
            return nulls_back(super().map(map_type, map_array, key_result, value_result), map_array)

    pyarrow_io.ArrowProjectionVisitor = NullKeepingProjection  # type: ignore[misc]


def _bound_struct_fields() -> None:
    """Make pyiceberg's writer record the bounds of fields nested in structs (once per worker process), as Iceberg's
    Java writers do.

    Its statistics plan (pyiceberg.io.pyarrow.PyArrowStatisticsCollector, 0.12) keeps only counts of every field
    whose name has a dot, so a file's `kafka.offset` or `kafka.partition` would have no bounds (what read-back and
    engines prune files by). The subclass keeps the mode the table's metrics config gives such a field unless it is
    inside a list or a map (no bounds there, as in Java: metrics_json drops their counts too);
    `compute_statistics_plan` looks the collector up by its module's name.
    """
    from pyiceberg.io import pyarrow as pyarrow_io
    from pyiceberg.table import TableProperties
    from pyiceberg.types import BinaryType, StringType

    base = pyarrow_io.PyArrowStatisticsCollector
    if getattr(base, "bounds_struct_fields", False):
        return

    class StructBoundsCollector(base):  # type: ignore[misc, valid-type]  # pyiceberg's class, chosen at run time
        bounds_struct_fields = True

        def primitive(self, primitive: Any) -> Any:
            collected = super().primitive(primitive)
            name = self._schema.find_column_name(self._field_id)
            if not collected or name is None or "." not in name or self._field_id in self._in_collections():
                return collected
            mode = pyarrow_io.match_metrics_mode(self._properties.get(
                f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.{name}", self._default_mode))
            if mode.type == pyarrow_io.MetricModeTypes.TRUNCATE and not isinstance(primitive, StringType | BinaryType):
                mode = pyarrow_io.MetricsMode(pyarrow_io.MetricModeTypes.FULL)
            return [pyarrow_io.StatisticsCollector(field_id=self._field_id, iceberg_type=primitive, mode=mode,
                                                   column_name=name)]

        def _in_collections(self) -> set[int]:
            if not hasattr(self, "_inside"):
                self._inside = collection_fields(self._schema)[0]
            return self._inside

    pyarrow_io.PyArrowStatisticsCollector = StructBoundsCollector  # type: ignore[misc]


def writer_properties(properties: Mapping[str, str], rows: pa.Table) -> dict[str, str]:
    """The table's properties as pyiceberg's writer must see them to size row groups as the table asks.

    pyiceberg ignores write.parquet.row-group-size-bytes (with a warning on every write) and cuts row groups at
    write.parquet.row-group-limit rows (default 1 M), so an upsert table's files would have one row group where
    Spark's writer makes many of 2 MiB (table/layout.py: a read-back seek decodes one row group). The byte size
    becomes a row limit from the rows' average Arrow (decoded) size, unless the table sets a row limit itself.
    """
    adjusted = dict(properties)
    size = adjusted.pop(ROW_GROUP_BYTES, None)
    if size is not None and ROW_GROUP_ROWS not in adjusted and rows.num_rows:
        adjusted[ROW_GROUP_ROWS] = str(max(1, int(size) * rows.num_rows // max(1, rows.nbytes)))
    return adjusted


def partition_json_value(result_type: IcebergType, value: Any) -> object:
    """A partition value (pyiceberg's internal form) as Iceberg's SingleValueParser writes it in JSON."""
    from pyiceberg import types as t
    from pyiceberg.utils import datetime as dt

    if value is None or isinstance(result_type, (t.BooleanType, t.IntegerType, t.LongType, t.FloatType,
                                                 t.DoubleType, t.StringType)):
        return value
    if isinstance(result_type, t.DateType):
        return dt.days_to_date(value).isoformat()
    if isinstance(result_type, t.TimeType):
        return dt.micros_to_time(value).isoformat()
    if isinstance(result_type, t.TimestamptzType):
        return dt.micros_to_timestamptz(value).isoformat()
    if isinstance(result_type, t.TimestampType):
        return dt.micros_to_timestamp(value).isoformat()
    if isinstance(result_type, (t.BinaryType, t.FixedType)):
        return bytes(value).hex().upper()
    if isinstance(result_type, (t.DecimalType, t.UUIDType)):
        return str(value)
    raise ValueError(f"no JSON form for a partition value of type {result_type}")
