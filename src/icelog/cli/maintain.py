"""`icelog maintain [--topic T] [--dry-run]`: one maintenance round of archive tables now (a Spark job).

`icelog maintain --due` is how the archiver runs its automatic rounds (archive/maintenance_schedule.py):
only the due tables, recorded as the schedule needs, at once skipped if another round holds the lock.
Either way the process (and its Spark) runs at CPU niceness `archive.maintenance_nice`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from icelog.config import Settings
from icelog.errors import first_line


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maintain = sub.add_parser(
        "maintain", help="compact, expire snapshots, remove orphan files of archive tables now (a Spark job)"
    )
    maintain.add_argument("--topic", action="append", dest="topics", metavar="NAME",
                          help="only this topic's table (repeatable; default: every archived topic)")
    maintain.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    maintain.add_argument("--due", action="store_true",
                          help="only the tables due for automatic maintenance (what the archiver runs)")
    maintain.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    maintain.add_argument("--sink", help=argparse.SUPPRESS)  # with --due: a sink's tables (its archiver's rounds)
    maintain.add_argument("--spark-master", help="spark.master (default from config: local[N], half the cores)")
    maintain.set_defaults(func=cmd_maintain)


def cmd_maintain(args: argparse.Namespace) -> int:
    from icelog.archive.dead_letter import DLQ_SUFFIX
    from icelog.archive.locks import ArchiverLock, WriterTurns
    from icelog.archive.maintenance import DLQ_SORT_COLUMN, SORT_COLUMN, MaintenancePolicy, maintain_table
    from icelog.archive.maintenance_schedule import MAINTENANCE_LOCK, failure_record, record_of
    from icelog.archive.service import lower_priority
    from icelog.cli.archive import archiver_settings, refuse_unknown_topics, require_metadata
    from icelog.errors import IcelogError
    from icelog.meta.backends import open_store
    from icelog.table.config import archive_config, table_key
    from icelog.table.layout import quote_identifier

    level = logging.INFO if args.due else logging.WARNING  # --due: the archiver's log says what a round did
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = archiver_settings(args)  # the archiver's own settings when it started this round
    require_metadata(settings)
    lower_priority(settings.archive.maintenance_nice, "archive.maintenance_nice")  # before Spark: its JVM inherits it
    if args.due:
        return run_due(settings, args.sink)
    store = open_store(settings.metadata_url)
    lock = ArchiverLock(store, MAINTENANCE_LOCK)
    try:
        topics = {t.name: t for t in store.list_topics()}
        refuse_unknown_topics(args.topics or (), topics)
        named = {
            name: archive_config(t.name, t.configs, settings.topic_defaults, settings.archive)
            for name, t in sorted(topics.items())
            if args.topics is None or name in args.topics
        }
        unarchived = [name for name, c in named.items() if not c.enabled] if args.topics is not None else []
        if unarchived:  # named by --topic: say so rather than "(no archived topics)"
            raise IcelogError(f"topic {', '.join(unarchived)} is not archived (icelog.archive.kind=none, or the "
                              "archive's default kind), so it has no table to maintain")
        configs = [c for c in named.values() if c.enabled]
        if not configs:
            print("(no archived topics)")
            return 0
        try:
            lock.acquire(wait_s=0)
        except IcelogError:  # held: an automatic round of the archiver is running
            progress("waiting for the maintenance lock (an automatic round of the archiver is running)")
            lock.acquire(wait_s=600)
        from icelog.lake.spark import create_session

        progress("starting Spark")
        spark = create_session(settings, "icelog-maintain")
        policy = MaintenancePolicy.from_settings(settings.archive)
        failed = 0
        try:
            # Each archive table, then its dead-letter table where there is one (sorted by base offset).
            tables = [(c, table, sort) for c in configs
                      for table, sort in ((c.table, SORT_COLUMN), (c.table + DLQ_SUFFIX, DLQ_SORT_COLUMN))]
            for config, table, sort_column in tables:
                name = quote_identifier(settings.archive.catalog_name, config.namespace, table)
                key = table_key(config.namespace, table)
                if not spark.catalog.tableExists(name):
                    if table == config.table:
                        print(f"{key}: no table yet (nothing archived)")
                    continue
                try:
                    result = maintain_table(
                        spark, name, policy, dry_run=args.dry_run, progress=Steps(key), sort_column=sort_column,
                        turns=WriterTurns(store, key),
                    )
                except Exception as exc:
                    failed += 1
                    message = f"{type(exc).__name__}: {first_line(exc)}"
                    print(f"{key}: failed: {message}")
                    if not args.dry_run:  # `icelog status --tables` shows it, as for an automatic round
                        last = store.maintenance_records().get(key)
                        store.record_maintenance(failure_record(key, message, last, int(time.time() * 1000)))
                    continue
                if not args.dry_run:
                    store.record_maintenance(record_of(key, result, int(time.time() * 1000)))
                print(f"{key}: {'dry run: ' if args.dry_run else ''}{result.summary()}")
        finally:
            spark.stop()
        return 1 if failed else 0
    finally:
        lock.release()
        store.close()


def run_due(settings: Settings, sink: str | None = None) -> int:
    """The automatic round: every due table (of the broker's topics, or of a sink's), in a Spark session of this
    process (skipped if locked)."""
    from icelog.archive.maintenance_schedule import MaintenanceScheduler
    from icelog.archive.service import ArchiveServiceStore
    from icelog.lake.spark import create_session
    from icelog.meta.backends import open_store
    from icelog.sink.service import open_view

    store: ArchiveServiceStore = open_store(settings.metadata_url) if sink is None else open_view(settings, sink)
    spark = create_session(settings, "icelog-maintenance")
    scheduler = MaintenanceScheduler(settings, spark, store)
    try:
        scheduler.run_due()
    finally:
        scheduler.close()
        spark.stop()
        store.close()
    return 0


class Steps:
    """The progress line of one table's round: its step and the time since the round started."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.started = time.monotonic()

    def __call__(self, step: str) -> None:
        progress(f"{self.key}: {step} ({time.monotonic() - self.started:.0f} s)")


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
