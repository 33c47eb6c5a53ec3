"""`icelog sql "SELECT ..."`: run Spark SQL against the Iceberg catalog (archive tables: icelog.<topic>)."""

from __future__ import annotations

import argparse
import logging

from icelog.config import load_settings
from icelog.errors import IcelogError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sql = sub.add_parser("sql", help="run Spark SQL against the Iceberg catalog")
    sql.add_argument("query", help='e.g. "SELECT kafka.partition, count(*) FROM icelog.orders GROUP BY 1"')
    sql.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    sql.add_argument("--limit", type=int, default=1000, help="rows to print at most")
    sql.add_argument("--format", choices=["table", "json"], default="table")
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
            frame = spark.sql(args.query)
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
