"""`icelog sql "SELECT ..."`: run Spark SQL against the Iceberg catalog (archive tables: icelog.<topic>).

With `--live` every archive table the query names reads as its current snapshot plus the committed records after it
(icelog/live/): each is planned first (snapshot pinned, then the tail up to the last stable offsets), then the query
runs over temporary views of those cuts.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from icelog.config import Settings, load_settings
from icelog.errors import IcelogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sql = sub.add_parser("sql", help="run Spark SQL against the Iceberg catalog")
    sql.add_argument("query", help='e.g. "SELECT kafka.partition, count(*) FROM icelog.orders GROUP BY 1"')
    sql.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    sql.add_argument("--limit", type=int, default=1000, help="rows to print at most")
    sql.add_argument("--format", choices=["table", "json"], default="table")
    sql.add_argument("--live", action="store_true",
                     help="read each topic's table plus the committed records not archived yet (its tail)")
    sql.set_defaults(func=cmd_sql)


def cmd_sql(args: argparse.Namespace) -> int:
    from pyspark.errors import PySparkException

    from icelog.cli.archive import require_metadata
    from icelog.lake.spark import create_session

    logging.basicConfig(level=logging.WARNING)
    settings = load_settings(args.config, data_dir=args.data_dir)
    if settings.archive.catalog_uri is None:  # the embedded catalog: under the data directory
        # Spark would create an empty catalog in a mistyped --data-dir and find no table there.
        require_metadata(settings)
    spark = create_session(settings, "icelog-sql")
    try:
        try:
            query = live_query(spark, settings, args.query) if args.live else args.query
            frame = spark.sql(query)
        except PySparkException as exc:
            raise IcelogError(f"query failed: {str(exc).strip().splitlines()[0]}") from None
        if not frame.columns:  # DDL and DML answer no rows (show() would draw an empty table)
            print("ok")
        elif args.format == "json":
            for line in frame.limit(args.limit).toJSON().collect():
                print(line)
        else:
            frame.show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def live_query(spark: SparkSession, settings: Settings, query: str) -> str:
    """The query with each archive table it names replaced by a temporary view of the table's live cut."""
    from icelog.live.cut import plan_cut
    from icelog.live.frames import cut_dataframe
    from icelog.live.query import replace_tables
    from icelog.live.tail import open_tail
    from icelog.table.config import archive_config

    source = open_tail(settings)
    try:
        tables: dict[tuple[str, str], str] = {}
        for view in source.topic_names():
            config = archive_config(view.name, view.configs, settings.topic_defaults, settings.archive)
            if config.enabled:
                tables.setdefault(config.identifier, view.name)
    finally:
        source.close()
    views: dict[str, str] = {}
    rewritten, named = replace_tables(query, tables, settings.archive.catalog_name,
                                      lambda topic: views.setdefault(topic, f"`__icelog_live_{len(views)}`"))
    for topic in named:  # planned one after another, each pinned to its table's snapshot when planned
        cut_dataframe(spark, settings, plan_cut(settings, topic)).createOrReplaceTempView(views[topic].strip("`"))
    return rewritten
