"""The archive table layouts as pure data: `record` (Bufstream's, the default) and `table` (Fluss's).

Columns: key struct<__raw__ binary>, value struct<__raw__ binary>, headers list<struct<key string,
value binary>>, kafka struct<partition int, offset long, event_timestamp timestamptz,
ingest_timestamp timestamptz, batch_start long>.

Partition spec: identity(kafka.partition), day(kafka.ingest_timestamp). Sort order: kafka.offset ASC.
A reader of one Kafka partition and offset range prunes to that partition's files by the identity
partition, then to a few files by the per-file min/max statistics of kafka.offset (each data file is one
archive: a contiguous offset range of one partition, written in offset order). The day transform keeps
a partition's files in day-sized groups so time-bounded queries prune too, and ingest time is made
monotonic per partition so a day never goes back.

The `table` layout (icelog.archive.layout=table; columns in table/iceberg_types.py) follows the Fluss
FIP: partition spec identity(__bucket), or identity(<partition.by columns>…) then identity(__bucket), or with a
bucket key bucket(<col>, <Kafka partitions>) (the broker keeps each record in the partition equal to its bucket);
sort order __offset ASC. A TableSpec carries what a layout decides about a table besides its columns, including
the primary key of an upsert table (either layout; archive/upsert.py): such a table is Iceberg format v3,
merge-on-read, with write-audit-publish enabled (its data files are staged, then committed with their deletion
vectors), and records its key in the table property `icelog.primary-key`. The layout is recorded in the table property
`icelog.layout`, and a table keeps the layout it was created with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icelog.table.config import BUCKET, LAYOUT_RECORD, LAYOUT_TABLE, OFFSET, TableTopicConfig

if TYPE_CHECKING:
    import pyarrow as pa

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
    # Row groups of 2 MiB (Iceberg's default is 128 MiB): a consumer seeking into the table (read-back)
    # decodes one row group, not a whole archive (8 MiB ones took ~70 ms of a seek to decode on 2 loaded
    # cores, 2 MiB ones ~27 ms; BENCHMARKS.md). Analysts' scans still read whole column chunks of 2 MiB.
    "write.parquet.row-group-size-bytes": str(2 * 1024 * 1024),
    "icelog.layout": "archive-v1",
}
LAYOUT_PROPERTY = "icelog.layout"
PRIMARY_KEY_PROPERTY = "icelog.primary-key"
# Snapshot summary: the id of the topic an archive commit came from (a topic deleted and re-created under the same
# name is another topic; its table must not be taken for the old one's: archive/reconcile.py, readback/source.py).
TOPIC_ID_PROPERTY = "icelog.archive.topic-id"
# Snapshot summary: the next offset per Kafka partition the table covers, as JSON {"partition": offset, …}.
OFFSETS_PROPERTY = "icelog.archive.offsets"
# An upsert table: deletion vectors need format v3; merge-on-read so that no engine rewrites data files to delete.
UPSERT_TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "3",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
LAYOUT_PROPERTY_VALUES = {LAYOUT_RECORD: "archive-v1", LAYOUT_TABLE: "table-v1"}

SPARK_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in ARCHIVE_COLUMNS)


@dataclass(frozen=True)
class PartitionField:
    """One field of a partition spec: `identity`, `day` or `bucket` (with `buckets`) of a column path."""

    transform: str
    column: str
    buckets: int = 0

    def spark_sql(self) -> str:
        column = quote_path(self.column)
        if self.transform == "identity":
            return column
        if self.transform == "bucket":
            return f"bucket({self.buckets}, {column})"
        return f"{self.transform}s({column})"


@dataclass(frozen=True)
class TableSpec:
    """What a layout decides about an archive table besides its columns."""

    layout: str
    partition_fields: tuple[PartitionField, ...]
    sort_order: tuple[str, ...]
    properties: Mapping[str, str] = field(default_factory=dict)
    bucket_key: str | None = None  # the column whose Iceberg bucket is the Kafka partition
    primary_key: tuple[str, ...] = ()  # upsert tables: the column paths that identify a row (() appends)


RECORD_SPEC = TableSpec(
    LAYOUT_RECORD,
    tuple(PartitionField(transform, column) for transform, column, _name in ARCHIVE_PARTITION_FIELDS),
    ARCHIVE_SORT_ORDER,
    ARCHIVE_TABLE_PROPERTIES,
)


def upsert_properties(primary_key: tuple[str, ...]) -> dict[str, str]:
    """The properties an upsert table is created with (none for an append table)."""
    if not primary_key:
        return {}
    return {**UPSERT_TABLE_PROPERTIES, PRIMARY_KEY_PROPERTY: ",".join(primary_key)}


def table_spec(config: TableTopicConfig, partitions: int) -> TableSpec:
    """The spec of a topic's table: RECORD_SPEC, or Fluss's rules for the table layout (either with a primary key)."""
    if not config.is_table:
        if not config.primary_key:
            return RECORD_SPEC
        return TableSpec(LAYOUT_RECORD, RECORD_SPEC.partition_fields, RECORD_SPEC.sort_order,
                         {**ARCHIVE_TABLE_PROPERTIES, **upsert_properties(config.primary_key)},
                         primary_key=config.primary_key)
    fields = [PartitionField("identity", column) for column in config.partition_by]
    if config.bucket_key is not None:
        fields.append(PartitionField("bucket", config.bucket_key, partitions))
    else:
        fields.append(PartitionField("identity", BUCKET))
    properties = {**ARCHIVE_TABLE_PROPERTIES, LAYOUT_PROPERTY: LAYOUT_PROPERTY_VALUES[LAYOUT_TABLE],
                  **upsert_properties(config.primary_key)}
    return TableSpec(LAYOUT_TABLE, tuple(fields), (OFFSET,), properties, bucket_key=config.bucket_key,
                     primary_key=config.primary_key)


def layout_of_properties(properties: Mapping[str, str]) -> str | None:
    """The layout an existing table was created with (None: not an icelog table)."""
    for layout, value in LAYOUT_PROPERTY_VALUES.items():
        if properties.get(LAYOUT_PROPERTY) == value:
            return layout
    return None


@dataclass(frozen=True)
class TableDDL:
    """The statements that create an archive table (run in order, each idempotent)."""

    statements: tuple[str, ...]


def quote_identifier(*parts: str) -> str:
    """A Spark SQL multi-part identifier, back-quoted (topic names may hold '.' and '-')."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in parts)


def quote_path(path: str) -> str:
    """A column path (`kafka.offset`, `order_id`) back-quoted part by part."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in path.split("."))


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def archive_table_ddl(
    catalog: str,
    namespace: str,
    table: str,
    columns_ddl: str = SPARK_SCHEMA_DDL,
    spec: TableSpec = RECORD_SPEC,
    properties: Mapping[str, str] | None = None,
) -> TableDDL:
    """CREATE NAMESPACE / CREATE TABLE / partition fields / sort order for an archive table.

    `columns_ddl`: the layout's columns (archive/table_schema.py for topics with a Protobuf schema);
    `properties`: the topic's forwarded properties, over the layout's own.
    """
    ident = quote_identifier(catalog, namespace, table)
    merged = {**spec.properties, **(properties or {}), LAYOUT_PROPERTY: LAYOUT_PROPERTY_VALUES[spec.layout]}
    props = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in merged.items())
    partition_by = ", ".join(f.spark_sql() for f in spec.partition_fields)
    return TableDDL(
        (
            f"CREATE NAMESPACE IF NOT EXISTS {quote_identifier(catalog, namespace)}",
            f"CREATE TABLE IF NOT EXISTS {ident} ({columns_ddl}) USING iceberg "
            f"PARTITIONED BY ({partition_by}) TBLPROPERTIES ({props})",
            f"ALTER TABLE {ident} WRITE ORDERED BY {', '.join(quote_path(c) for c in spec.sort_order)}",
        )
    )


def arrow_schema() -> pa.Schema:
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
