"""`icelog status --tables`: per archive table, its files and snapshots (pyiceberg metadata) and last maintenance."""

from __future__ import annotations

from datetime import UTC, datetime

from icelog.archive.pk_index import describe_index
from icelog.config import Settings
from icelog.lake.table_stats import open_catalog, table_stats
from icelog.meta.backends import open_store
from icelog.table.config import archive_config, table_key

COLUMNS = (
    "TABLE", "AUTO-MAINTENANCE", "DATA-FILES", "AVG-FILE-BYTES", "DELETE-FILES", "SNAPSHOTS", "RECORDS",
    "PRIMARY-KEY", "PK-INDEX", "LAST-MAINTENANCE", "RESULT",
)


def print_tables(settings: Settings) -> int:
    store = open_store(settings.metadata_url)
    try:
        topics = store.list_topics()
        records = store.maintenance_records()
    finally:
        store.close()
    catalog = open_catalog(settings)
    rows: list[tuple[str, ...]] = [COLUMNS]
    for topic in topics:
        config = archive_config(topic.name, topic.configs, settings.topic_defaults, settings.archive)
        if not config.enabled:
            continue
        key = table_key(config.namespace, config.table)
        stats = table_stats(catalog, config.namespace, config.table)
        last = records.get(key)
        when = "-"
        if last is not None:
            when = datetime.fromtimestamp(last.finished_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        result = "-" if last is None else f"{last.outcome}: {last.summary}"
        numbers = (
            ("-",) * 5 if stats is None else (
                str(stats.data_files), str(stats.average_file_bytes), str(stats.delete_files), str(stats.snapshots),
                str(stats.records),
            )
        )
        primary_key, index = "-", "-"
        if stats is not None and stats.primary_key:  # an upsert table: its key and its primary-key index
            primary_key = stats.primary_key
            index = describe_index(settings.data_dir, stats.table_uuid, stats.snapshot_id)
        rows.append((key, "on" if config.auto_maintenance else "off", *numbers, primary_key, index, when, result))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no archived topics)")
    return 0
