"""The archive table layout of topics without a schema (Bufstream's), as pure data.

Columns: key struct<__raw__ binary>, value struct<__raw__ binary>, headers list<struct<key string,
value binary>>, kafka struct<partition int, offset long, event_timestamp timestamptz,
ingest_timestamp timestamptz, batch_start long>.

Partition spec: identity(kafka.partition), day(kafka.ingest_timestamp). Sort order: kafka.offset ASC.
A reader of one Kafka partition and offset range prunes to that partition's files by the identity
partition, then to a few files by the per-file min/max statistics of kafka.offset (each data file is one
archive: a contiguous offset range of one partition, written in offset order). The day transform keeps
a partition's files in day-sized groups so time-bounded queries prune too, and ingest time is made
monotonic per partition so a day never goes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Spark SQL types of the columns, in table order.
ARCHIVE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("key", "STRUCT<__raw__: BINARY>"),
    ("value", "STRUCT<__raw__: BINARY>"),
    ("headers", "ARRAY<STRUCT<key: STRING, value: BINARY>>"),
    (
        "kafka",
        "STRUCT<partition: INT, offset: BIGINT, event_timestamp: TIMESTAMP, ingest_timestamp: TIMESTAMP, "
        "batch_start: BIGINT>",
    ),
)

# (transform, source column, partition field name)
ARCHIVE_PARTITION_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("identity", "kafka.partition", "kafka_partition"),
    ("day", "kafka.ingest_timestamp", "kafka_ingest_day"),
)
ARCHIVE_SORT_ORDER: tuple[str, ...] = ("kafka.offset",)

# Table properties: format v2 (readable by pyiceberg, DuckDB and Trino), zstd Parquet, and the
# metadata files kept bounded because every archive commit adds a snapshot.
ARCHIVE_TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    "write.target-file-size-bytes": str(1024 * 1024 * 1024),
    # Row groups of 8 MiB (Iceberg's default is 128 MiB): a consumer seeking into the table (read-back)
    # decodes one row group, not a whole archive.
    "write.parquet.row-group-size-bytes": str(8 * 1024 * 1024),
    "icelog.layout": "archive-v1",
}

SPARK_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in ARCHIVE_COLUMNS)


@dataclass(frozen=True)
class TableDDL:
    """The statements that create an archive table (run in order, each idempotent)."""

    statements: tuple[str, ...]


def quote_identifier(*parts: str) -> str:
    """A Spark SQL multi-part identifier, back-quoted (topic names may hold '.' and '-')."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in parts)


def archive_table_ddl(catalog: str, namespace: str, table: str, columns_ddl: str = SPARK_SCHEMA_DDL) -> TableDDL:
    """CREATE NAMESPACE / CREATE TABLE / partition fields / sort order for an archive table.

    `columns_ddl`: the raw layout's columns, or those of a topic with a Protobuf schema (pipeline/table_schema.py).
    """
    ident = quote_identifier(catalog, namespace, table)
    props = ", ".join(f"'{k}'='{v}'" for k, v in ARCHIVE_TABLE_PROPERTIES.items())
    partition_by = ", ".join(
        ("" if transform == "identity" else f"{transform}s(")
        + column
        + ("" if transform == "identity" else ")")
        for transform, column, _name in ARCHIVE_PARTITION_FIELDS
    )
    return TableDDL(
        (
            f"CREATE NAMESPACE IF NOT EXISTS {quote_identifier(catalog, namespace)}",
            f"CREATE TABLE IF NOT EXISTS {ident} ({columns_ddl}) USING iceberg "
            f"PARTITIONED BY ({partition_by}) TBLPROPERTIES ({props})",
            f"ALTER TABLE {ident} WRITE ORDERED BY {', '.join(ARCHIVE_SORT_ORDER)}",
        )
    )


def arrow_schema() -> Any:
    """The Arrow schema of decoded rows (what the Spark workers hand back)."""
    import pyarrow as pa

    tz = "UTC"
    return pa.schema(
        [
            pa.field("key", pa.struct([pa.field("__raw__", pa.binary())])),
            pa.field("value", pa.struct([pa.field("__raw__", pa.binary())])),
            pa.field(
                "headers",
                pa.list_(
                    pa.field(
                        "element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
                    )
                ),
            ),
            pa.field(
                "kafka",
                pa.struct(
                    [
                        pa.field("partition", pa.int32()),
                        pa.field("offset", pa.int64()),
                        pa.field("event_timestamp", pa.timestamp("us", tz=tz)),
                        pa.field("ingest_timestamp", pa.timestamp("us", tz=tz)),
                        pa.field("batch_start", pa.int64()),
                    ]
                ),
            ),
        ]
    )
