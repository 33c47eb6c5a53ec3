"""`icelog status`: where every partition stands, read from the metadata store (broker up or down)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from icelog.config import load_settings
from icelog.errors import IcelogError
from icelog.meta.store import open_store
from icelog.pipeline.progress import ArchiveProgress, archive_progress

ARCHIVE_COLUMNS = (
    "ARCHIVED-THROUGH", "LAG-RECORDS", "LAG-BYTES", "LAG-SECONDS", "LAST-COMMIT", "DEAD-LETTERS", "LAST-ERROR"
)


def _archive_cells(progress: ArchiveProgress | None) -> tuple[str, ...]:
    """The archive columns of one partition ('-' where the topic is not archived)."""
    if progress is None or not progress.enabled:
        return ("-",) * len(ARCHIVE_COLUMNS)
    last_commit = "-"
    if progress.last_commit_ms >= 0:
        when = datetime.fromtimestamp(progress.last_commit_ms / 1000, UTC)
        last_commit = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        str(progress.archived_offset - 1) if progress.archived_offset > 0 else "-",
        str(progress.lag_records), str(progress.lag_bytes), f"{progress.lag_seconds:.1f}", last_commit,
        str(progress.dead_letters), progress.last_error or "-",
    )


def add_parser(sub: Any) -> None:
    status = sub.add_parser("status", help="log start, high watermark and intake size of every partition")
    status.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    status.add_argument(
        "--tables", action="store_true",
        help="per archive table: data files, average file size, delete files, snapshots, last maintenance",
    )
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, data_dir=args.data_dir)
    if settings.meta_url is None and not (settings.data_dir / "meta.db").exists():
        # Opening the default SQLite store would create it: a mistyped --data-dir must not look like an
        # empty broker.
        raise IcelogError(f"no icelog data in {settings.data_dir} (no meta.db); pass the broker's --data-dir")
    if args.tables:
        from icelog.cli.status_tables import print_tables

        return print_tables(settings)
    store = open_store(settings.metadata_url)
    try:
        progress = archive_progress(settings, store)
        rows: list[tuple[str, ...]] = [
            ("TOPIC", "PARTITION", "LOG-START", "HIGH-WATERMARK", "RECORDS", "INTAKE-CHUNKS", "INTAKE-BYTES",
             *ARCHIVE_COLUMNS)
        ]
        for topic in store.list_topics():
            for part in store.partitions(topic.topic_id):
                # Per-partition totals the store keeps as chunks are indexed and trimmed: no chunk row is read.
                rows.append((
                    topic.name, str(part.partition), str(part.log_start_offset), str(part.high_watermark),
                    str(part.high_watermark - part.log_start_offset), str(part.intake_chunks), str(part.intake_bytes),
                    *_archive_cells(progress.get((topic.topic_id, part.partition))),
                ))
    finally:
        store.close()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no topics)")
    return 0
