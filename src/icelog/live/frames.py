"""A live read as a Spark DataFrame: the pinned snapshot (time travel by snapshot id) and the tail, decoded in
Spark's Python workers by the archiver's decoders (one task per partition's tail, as a pass's tasks decode).

For a primary-key topic the tail's latest row per key (highest offset, then highest partition) replaces the
table's row of that key and a tombstone deletes it, as in reader.py: a window over the tail, an anti-join of the
snapshot on the keys the tail writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from icelog.config import Settings
from icelog.live.cut import LiveCut, iter_tail, plan_cut
from icelog.live.reader import DEFAULT_DATA_DIR, live_settings, table_schema
from icelog.table.config import BUCKET, LAYOUT_TABLE, OFFSET, VALUE_BYTES, VALUE_ERR, VALUE_PREFIX
from icelog.table.layout import quote_identifier, quote_path

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def dataframe(
    spark: SparkSession, topic: str, *, data_dir: str = DEFAULT_DATA_DIR, config: str | None = None
) -> DataFrame:
    """The topic's table at its current snapshot plus every committed record after it, as a Spark DataFrame.

    `spark` must have the archive catalog configured (lake/spark.create_session does)."""
    settings = live_settings(data_dir, config)
    return cut_dataframe(spark, settings, plan_cut(settings, topic))


def cut_dataframe(spark: SparkSession, settings: Settings, cut: LiveCut) -> DataFrame:
    """A Spark DataFrame of a planned cut."""
    from pyspark.sql.pandas.types import to_arrow_schema

    name = quote_identifier(settings.archive.catalog_name, cut.namespace, cut.table)
    if cut.snapshot_id is not None:
        snapshot = spark.sql(f"SELECT * FROM {name} VERSION AS OF {cut.snapshot_id}")
    elif spark.catalog.tableExists(name):
        snapshot = spark.table(name).limit(0)
    else:  # no table yet: every record is in the tail, in the layout's own columns
        from pyspark.sql.pandas.types import from_arrow_schema

        snapshot = spark.createDataFrame([], from_arrow_schema(table_schema(None, cut)))
    target = to_arrow_schema(snapshot.schema)
    archives = list(iter_tail(cut))
    source, sides = cut.chunks, cut.sides  # pickled into the tasks, as the archiver's chunk sources and decodings
    layout = cut.spec.layout

    def decode(ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from icelog.live.tail_rows import tail_rows

        for batch in ids:
            for number in batch.column(0).to_numpy():
                yield from tail_rows(source, archives[int(number)], layout, target, sides)

    tail = spark.range(len(archives), numPartitions=max(1, len(archives))).mapInArrow(decode, snapshot.schema)
    if not cut.spec.primary_key:
        return snapshot.unionByName(tail)
    return _upserted(snapshot, tail, cut)


def _upserted(snapshot: DataFrame, tail: DataFrame, cut: LiveCut) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    keys = [F.col(quote_path(path)) for path in cut.spec.primary_key]
    names = [f"__live_k{i}" for i in range(len(keys))]
    table_layout = cut.spec.layout == LAYOUT_TABLE
    offset = F.col(quote_path(OFFSET if table_layout else "kafka.offset"))
    bucket = F.col(quote_path(BUCKET if table_layout else "kafka.partition"))
    values = [VALUE_BYTES, VALUE_PREFIX, VALUE_ERR] if table_layout else ["value"]
    present = [v for v in values if v in snapshot.columns]
    tombstone = F.lit(bool(present))
    for value in present:
        tombstone = tombstone & F.col(quote_path(value)).isNull()
    keyed = tail.select("*", *[k.alias(n) for k, n in zip(keys, names, strict=True)])
    for name in names:
        keyed = keyed.filter(F.col(name).isNotNull())
    order = Window.partitionBy(*names).orderBy(offset.desc(), bucket.desc())
    latest = keyed.withColumn("__live_n", F.row_number().over(order)).filter(F.col("__live_n") == 1)
    written = latest.select(*names)
    kept = snapshot.select("*", *[k.alias(n) for k, n in zip(keys, names, strict=True)]).join(
        written, on=names, how="left_anti").drop(*names)
    return kept.unionByName(latest.filter(~tombstone).drop("__live_n", *names))
