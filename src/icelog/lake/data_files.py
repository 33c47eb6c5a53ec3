"""Data files written by pyiceberg in Spark's Python workers, for the driver to commit (upsert passes).

An upsert pass commits its data files and its deletion vectors in one RowDelta (pipeline/upsert.py), so its data
files must be written without a commit. The worker that decoded a task's rows writes them itself, with pyiceberg's
Parquet writer and the table's metadata (its schema's field ids, partition spec, location provider and
`write.parquet.*` properties): no Arrow → JVM row → Parquet conversion, no staged snapshot. The task yields one row
per file (WRITTEN_DDL); the driver reads each file's metrics from its footer with Iceberg's Java ParquetUtil and
builds the DataFile (lake/iceberg_java.parquet_data_files), exactly as Iceberg's own writers describe a file.
A task that fails leaves files no snapshot references (orphans, which maintenance removes), as a Spark write does.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# One row per written file: where it is, its size and row count, and its partition as Iceberg's JSON of a content
# file has it ({"<partition field id>": value}, values as SingleValueParser writes them), for ContentFileParser.
WRITTEN_DDL = "path string, size bigint, records bigint, partition string"
BUFFERED_BYTES = 256 << 20  # a task's decoded rows held before they are written out (Arrow bytes)


@dataclass(frozen=True)
class WrittenFile:
    """A data file a worker wrote (a row of WRITTEN_DDL)."""

    path: str
    size: int
    records: int
    partition: str  # JSON


def file_writer(
    metadata_location: str, decode: Callable[[Iterator[Any]], Iterator[Any]], io_properties: Mapping[str, str]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInArrow function: the task's rows as `decode` yields them, written to data files of the table whose
    metadata file is `metadata_location` (through pyiceberg's FileIO for its scheme, given the catalog's
    properties: archive.catalog_properties); yields a WRITTEN_DDL batch per group of files written.

    Rows keep their decoded order within a file (each file holds one partition's rows, in offset order).
    """

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyiceberg.io import load_file_io
        from pyiceberg.serializers import FromInputFile

        io = load_file_io(dict(io_properties), metadata_location)
        metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
        write_uuid, counter = uuid.uuid4(), itertools.count(0)
        held: list[Any] = []
        size = 0
        for batch in decode(batches):
            if batch.num_rows:
                held.append(batch)
                size += batch.nbytes
            if size >= BUFFERED_BYTES:
                yield _written(metadata, io, pa.Table.from_batches(held), write_uuid, counter)
                held, size = [], 0
        if held:
            yield _written(metadata, io, pa.Table.from_batches(held), write_uuid, counter)

    return write


def _written(metadata: Any, io: Any, rows: Any, write_uuid: uuid.UUID, counter: Any) -> Any:
    """Write `rows` as the table's data files (split by partition, then by target size): a WRITTEN_DDL batch."""
    import pyarrow as pa

    # pyiceberg's own table-write path (Table.append uses it), here without the commit: partitions the rows by
    # the spec's transforms, bin-packs to write.target-file-size-bytes, writes Parquet with the schema's field ids.
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    spec, schema = metadata.spec(), metadata.schema()
    files = list(_dataframe_to_data_files(metadata, rows, io, write_uuid, counter))
    partitions = []
    for data_file in files:
        values = {}
        for position, field in enumerate(spec.fields):
            result_type = field.transform.result_type(schema.find_field(field.source_id).field_type)
            values[str(field.field_id)] = partition_json_value(result_type, data_file.partition[position])
        partitions.append(json.dumps(values))
    return pa.RecordBatch.from_pydict(
        {
            "path": [f.file_path for f in files],
            "size": [f.file_size_in_bytes for f in files],
            "records": [f.record_count for f in files],
            "partition": partitions,
        },
        schema=pa.schema([("path", pa.string()), ("size", pa.int64()), ("records", pa.int64()),
                          ("partition", pa.string())]),
    )


def written_files(rows: list[Any]) -> list[WrittenFile]:
    """The collected rows of a file_writer job."""
    return [WrittenFile(str(r.path), int(r.size), int(r.records), str(r.partition)) for r in rows]


def partition_json_value(result_type: Any, value: Any) -> Any:
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
