"""Data files written by workers (lake/data_files.py) and committed by the driver describe themselves exactly as
Spark's Iceberg writer describes the same rows: partition values of every transform and type an upsert table can
have, record counts and column bounds; and every engine reads the rows back."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest

from icelog.archive.upsert import PassRows, write_data_files
from icelog.config import Settings
from icelog.lake import iceberg_java
from icelog.lake.data_files import file_writer
from icelog.table.layout import ARCHIVE_TABLE_PROPERTIES

COLUMNS = ("id bigint, small bigint, region string, day date, at timestamp, blob binary, price decimal(10, 2), "
           "flag boolean, n int")
PARTITIONS = "small, region, day, at, blob, price, flag, bucket(4, n)"


def rows() -> list[tuple[Any, ...]]:
    start = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.UTC)
    return [
        (i, i % 2, ["eu/west", "us east", None][i % 3], dt.date(2026, 1, 1 + i % 2),
         start + dt.timedelta(microseconds=i % 2), [b"\x00\xff", b"a=b/c"][i % 2],
         Decimal("12.50") if i % 2 else Decimal("-3.00"), bool(i % 2), i)
        for i in range(12)
    ]


@pytest.mark.slow
def test_worker_written_files_are_described_as_sparks_writer_describes_them(
    lake_spark: Any, lake_settings: Settings
) -> None:
    catalog = lake_settings.archive.catalog_name
    names = {kind: f"{catalog}.data_files.{kind}_{uuid.uuid4().hex[:8]}" for kind in ("ours", "spark")}
    lake_spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.data_files")
    for name in names.values():
        lake_spark.sql(f"CREATE TABLE {name} ({COLUMNS}) USING iceberg PARTITIONED BY ({PARTITIONS}) "
                       "TBLPROPERTIES ('format-version'='3')")
    lake_spark.createDataFrame(rows(), COLUMNS).writeTo(names["spark"]).append()

    produced = rows()

    def decode(tasks: Any) -> Any:
        """Stands in for the archive's decoders (a closure: workers cannot import tests); task t: rows i % 2 == t."""
        import pyarrow as pa

        schema = pa.schema([("id", pa.int64()), ("small", pa.int64()), ("region", pa.string()),
                            ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")), ("blob", pa.binary()),
                            ("price", pa.decimal128(10, 2)), ("flag", pa.bool_()), ("n", pa.int32())])
        for task in tasks:
            mine = [r for r in produced if r[0] % 2 == task]
            yield pa.RecordBatch.from_pylist([dict(zip(schema.names, r, strict=True)) for r in mine], schema=schema)

    table = iceberg_java.load_table(lake_spark, names["ours"])
    files = iceberg_java.parquet_data_files(lake_spark, table, write_data_files(lake_spark, table,
                                                                              PassRows(2, decode, {})))
    iceberg_java.commit_row_delta(table, None, files, iceberg_java.WrittenDVs([], []), [], {})

    def described(name: str) -> list[tuple[Any, ...]]:
        """Each file's partition, row count and per-column counts and bounds (not its byte sizes: the Parquet
        writers differ)."""
        found = []
        for partition, count, metrics in lake_spark.sql(
                f"SELECT to_json(partition), record_count, to_json(readable_metrics) FROM {name}.files").collect():
            columns = {c: {k: v for k, v in m.items() if k != "column_size"} for c, m in json.loads(metrics).items()}
            found.append((partition, count, json.dumps(columns, sort_keys=True)))
        return sorted(found)

    assert described(names["ours"]) == described(names["spark"])
    assert len(described(names["ours"])) >= 6  # rows spread over many partitions (some share one)
    read = {kind: sorted(map(tuple, lake_spark.sql(f"SELECT * FROM {name} ORDER BY id").collect()))
            for kind, name in names.items()}
    assert read["ours"] == read["spark"] and [r[0] for r in read["ours"]] == list(range(12))


def test_worker_written_files_have_the_tables_row_groups_and_no_writer_warning(tmp_path: Any) -> None:
    """pyiceberg sizes row groups in rows and warns that it ignores write.parquet.row-group-size-bytes: an upsert
    table's worker-written files held one row group of up to 1 M rows, where a read-back seek wants 2 MiB ones."""
    import os
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("__key", pa.binary()), pa.field("__value", pa.binary()),
                        pa.field("__offset", pa.int64(), nullable=False)])
    # The archive's table properties (pyiceberg cannot create the v3 table an upsert topic gets; the worker's
    # write is the same for both).
    table = catalog.create_table("db.t", schema, properties=dict(ARCHIVE_TABLE_PROPERTIES))  # pyiceberg pops from it
    limit = int(ARCHIVE_TABLE_PROPERTIES["write.parquet.row-group-size-bytes"])
    produced = pa.table({"__key": [os.urandom(16) for _ in range(40_000)],
                         "__value": [os.urandom(120) for _ in range(40_000)],
                         "__offset": pa.array(range(40_000), pa.int64())}, schema=schema)

    def decode(tasks: Any) -> Any:
        for _task in tasks:
            yield from produced.to_batches(max_chunksize=10_000)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pyiceberg's "Parquet writer option(s) [...] not implemented"
        written = list(file_writer(table.metadata_location, decode, {})([0]))
    assert len(written) == 1 and written[0][2] == produced.num_rows
    parquet = pq.ParquetFile(written[0][0].removeprefix("file://"))
    groups = [parquet.metadata.row_group(i) for i in range(parquet.metadata.num_row_groups)]
    assert len(groups) >= produced.nbytes // limit >= 2
    assert all(group.total_byte_size <= 1.25 * limit for group in groups)
    assert parquet.read().equals(produced.cast(parquet.schema_arrow))


@pytest.mark.slow
def test_null_lists_and_maps_of_structs_stay_null_and_empty_ones_stay_empty(
    lake_spark: Any, lake_settings: Settings
) -> None:
    """pyiceberg's projection rebuilds lists of structs and maps with struct values from their offsets and drops
    their nulls (lake/data_files._keep_null_lists_and_maps puts them back): a payload that did not decode has
    null fields, and an empty list is not one. Committed with the append passes' commit_append."""
    catalog = lake_settings.archive.catalog_name
    name = f"{catalog}.data_files.nulls_{uuid.uuid4().hex[:8]}"
    lake_spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.data_files")
    lake_spark.sql(f"CREATE TABLE {name} (id bigint, lines array<struct<a: int>>, "
                   "by_id map<string, struct<a: int>>, tags array<int>) USING iceberg")
    produced = [(0, None, None, None), (1, [], {}, []), (2, [{"a": 1}, None], {"k": {"a": 2}}, [3, None])]

    def decode(tasks: Any) -> Any:
        import pyarrow as pa

        inner = pa.struct([("a", pa.int32())])
        schema = pa.schema([("id", pa.int64()), ("lines", pa.list_(inner)),
                            ("by_id", pa.map_(pa.string(), inner)), ("tags", pa.list_(pa.int32()))])
        for _task in tasks:
            yield pa.RecordBatch.from_pylist(
                [{"id": i, "lines": lines, "by_id": None if by_id is None else list(by_id.items()), "tags": tags}
                 for i, lines, by_id, tags in produced], schema=schema)

    table = iceberg_java.load_table(lake_spark, name)
    files = iceberg_java.parquet_data_files(lake_spark, table, write_data_files(lake_spark, table,
                                                                              PassRows(1, decode, {})))
    iceberg_java.commit_append(table, files, {"note": "test"})
    got = [(r.id, None if r.lines is None else [None if x is None else x.asDict() for x in r.lines],
            None if r.by_id is None else {k: v.asDict() for k, v in r.by_id.items()}, r.tags)
           for r in lake_spark.sql(f"SELECT * FROM {name} ORDER BY id").collect()]
    assert got == produced
    summary = lake_spark.sql(f"SELECT summary FROM {name}.snapshots").collect()[0].summary
    assert summary["note"] == "test" and summary["added-records"] == "3"


@pytest.mark.slow
def test_the_workers_metrics_are_the_ones_iceberg_reads_from_the_footers(
    lake_spark: Any, lake_settings: Settings
) -> None:
    """The metrics a worker sends with its file (lake/data_files.metrics_json: no footer read in the driver) equal
    what Iceberg's Java ParquetUtil reads from the footer: bounds of fields nested in structs (kafka.offset), none
    and no counts for fields in a list (headers), nulls and all-null columns counted alike."""
    import dataclasses

    from icelog.table.layout import archive_table_ddl, arrow_schema

    catalog = lake_settings.archive.catalog_name
    table_name = f"metrics_{uuid.uuid4().hex[:8]}"
    for statement in archive_table_ddl(catalog, "data_files", table_name).statements:
        lake_spark.sql(statement)
    schema = arrow_schema()

    def decode(tasks: Any) -> Any:
        import datetime as dt

        import pyarrow as pa

        at = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.UTC)
        for task in tasks:
            for partition in (task, task + 2):
                yield pa.RecordBatch.from_pydict({
                    "key": [{"__raw__": None if i % 3 else bytes([i % 251]) * 20} for i in range(300)],
                    "value": [None if i % 7 == 0 else {"__raw__": bytes([255 - i % 256]) * 40} for i in range(300)],
                    "headers": [None if i % 5 == 0 else [] if i % 5 == 1 else [{"key": "h", "value": None}]
                                for i in range(300)],
                    "kafka": [{"partition": partition, "offset": 1000 + i, "event_timestamp": at,
                               "ingest_timestamp": None if i == 4 else at, "batch_start": 1000} for i in range(300)],
                }, schema=schema)

    table = iceberg_java.load_table(lake_spark, f"{catalog}.data_files.{table_name}")
    written = write_data_files(lake_spark, table, PassRows(2, decode, {}))
    assert all(file.metrics for file in written)
    spec = table.spec()
    parser = lake_spark.sparkContext._jvm.org.apache.iceberg.ContentFileParser

    def described(files: list[Any]) -> list[Any]:
        return [json.loads(parser.toJson(f, spec)) for f in iceberg_java.parquet_data_files(lake_spark, table, files)]

    ours, footers = described(written), described([dataclasses.replace(f, metrics="") for f in written])
    assert ours == footers
    assert all(11 in f["lower-bounds"]["keys"] for f in ours)  # kafka.offset (field 11), in a struct
