"""`icelog status`: where every partition stands, read from the metadata store (broker up or down)."""

from __future__ import annotations

import argparse
import shutil
import sys
import uuid
from datetime import UTC, datetime

from icelog.archive.progress import ArchiveProgress, archive_progress
from icelog.cli.archive import require_metadata
from icelog.config import Settings, load_settings
from icelog.log.backends import clustered
from icelog.log.pressure import space_reason
from icelog.meta.backends import open_store
from icelog.meta.store import BrokerRecord, Leadership, TopicCatalog

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


def _table_ranges(settings: Settings, store: TopicCatalog) -> dict[str, dict[int, tuple[int, int, int]]]:
    """Per archived topic (whose table the broker can read back): each partition's table offsets and bytes.

    One scan plan per table (manifests only, no data file is opened); a table that cannot be read shows
    as not read back ('-') with a note on stderr.
    """
    from icelog.readback.lake import LakeTables, catalog_opener
    from icelog.readback.plan import partition_ranges
    from icelog.table.config import archive_config

    opener = catalog_opener(settings)
    if opener is None:
        return {}
    tables = LakeTables(opener)
    out: dict[str, dict[int, tuple[int, int, int]]] = {}
    for topic in store.list_topics():
        archive = archive_config(topic.name, topic.configs, settings.topic_defaults, settings.archive)
        if not archive.enabled:
            continue
        try:
            table = tables.table(archive.identifier)
            ranges = {} if table is None else partition_ranges(table, str(topic.topic_id))
            if ranges is None:  # a deleted topic's table (same name), or another live topic's
                print(f"icelog status: table {'.'.join(archive.identifier)} holds the archive of another topic, "
                      f"not {topic.name}'s: not read back to it", file=sys.stderr)
                continue
            out[topic.name] = ranges
        except Exception as exc:
            print(f"icelog status: cannot read table {'.'.join(archive.identifier)}: {exc}", file=sys.stderr)
    return out


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="table and intake ranges and sizes of every partition")
    status.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    status.add_argument(
        "--tables", action="store_true",
        help="per archive table: data files, average file size, delete files, snapshots, last maintenance",
    )
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, data_dir=args.data_dir)
    # Opening the default SQLite store would create it: a mistyped --data-dir must not look like an empty broker.
    require_metadata(settings)
    if args.tables:
        from icelog.cli.status_tables import print_tables

        return print_tables(settings)
    store = open_store(settings.metadata_url)
    try:
        progress = archive_progress(settings, store)
        tables = _table_ranges(settings, store)
        cluster = clustered(settings)
        brokers = store.brokers(settings.broker_session_timeout_ms) if cluster else []
        leaders = store.leaderships() if cluster else {}
        rows: list[tuple[str, ...]] = [
            ("TOPIC", "PARTITION", *(("LEADER",) if cluster else ()), "LOG-START", "HIGH-WATERMARK", "RECORDS",
             "TABLE-OFFSETS", "TABLE-BYTES", "INTAKE-START", "INTAKE-CHUNKS", "INTAKE-BYTES", *ARCHIVE_COLUMNS)
        ]
        for topic in store.list_topics():
            ranges = tables.get(topic.name)
            for part in store.partitions(topic.topic_id):
                # Per-partition totals the store keeps as chunks are indexed and trimmed: no chunk row is read.
                table_cells = ("-", "-")
                start = part.log_start_offset  # the consumer-visible start: the table's when it is read back
                if ranges is not None:
                    first, end, table_bytes = ranges.get(part.partition, (0, 0, 0))
                    table_cells = (f"{first}-{end - 1}" if end > first else "(empty)", str(table_bytes))
                    if end > first and first < start:  # as PartitionLog.visible_start_offset
                        start = min(start, part.retention_start_offset)
                leader = (_leader_cell(leaders.get((topic.topic_id, part.partition)), brokers),) if cluster else ()
                rows.append((
                    topic.name, str(part.partition), *leader, str(start), str(part.high_watermark),
                    str(part.high_watermark - start), *table_cells, str(part.log_start_offset),
                    str(part.intake_chunks), str(part.intake_bytes),
                    *_archive_cells(progress.get((topic.topic_id, part.partition))),
                ))
    finally:
        store.close()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no topics)")
    if cluster:
        print()
        _print_brokers(brokers, leaders, settings.broker_session_timeout_ms)
    if settings.sinks:
        print()
        _print_sinks(settings)
    print(f"icelog status: {_space_line(settings)}", file=sys.stderr)  # stdout stays one row per partition
    return 0


def _leader_cell(held: Leadership | None, brokers: list[BrokerRecord]) -> str:
    """A partition's leader as the store has it: its node, or "-" while none (a dead holder: "(node N, gone)")."""
    if held is None or held.holder is None:
        return "-"
    alive = any(b.node_id == held.holder.node_id and b.incarnation == held.holder.incarnation and b.alive
                for b in brokers)
    return str(held.holder.node_id) if alive else f"(node {held.holder.node_id}, gone)"


def _print_brokers(
    brokers: list[BrokerRecord], leaders: dict[tuple[uuid.UUID, int], Leadership], timeout_ms: int
) -> None:
    """The cluster's brokers as registered: alive (heartbeating within broker_session_timeout_ms) or silent, their
    listeners, and how many partitions and coordinator shards each leads."""
    from icelog.cluster.view import GROUP_SHARDS_ID, TXN_SHARDS_ID

    rows: list[tuple[str, ...]] = [("NODE", "STATE", "LAST-HEARTBEAT", "LISTENERS", "RACK", "PARTITIONS",
                                    "COORDINATOR-SHARDS")]
    for broker in brokers:
        held = [k for k, lead in leaders.items() if lead.holder is not None
                and lead.holder.node_id == broker.node_id and lead.holder.incarnation == broker.incarnation]
        shards = sum(1 for k in held if k[0] in (GROUP_SHARDS_ID, TXN_SHARDS_ID))
        rows.append((str(broker.node_id), "alive" if broker.alive else f"silent > {timeout_ms} ms",
                     f"{broker.heartbeat_age_ms} ms ago",
                     ",".join(f"{name}://{host}:{port}" for name, (host, port) in sorted(broker.endpoints.items())),
                     broker.rack or "-", str(len(held) - shards), str(shards)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no broker has registered)")


def _print_sinks(settings: Settings) -> None:
    """Each sink's topics as its process last wrote them (sink/service.py): source offsets, table, lag."""
    import time

    from icelog.sink.service import read_status

    rows: list[tuple[str, ...]] = [("SINK", "TOPIC", "PARTITION", "SOURCE-START", "SOURCE-END", "TABLE-OFFSET",
                                    "LAG-RECORDS", "LAG-SECONDS", "ERROR")]
    notes: list[str] = []
    for name in sorted(settings.sinks):
        status = read_status(settings, name)
        if status is None:
            notes.append(f"sink {name}: has not run yet (`icelog sink --name {name}`, or `icelog serve`)")
            continue
        age = time.time() - status["at_ms"] / 1000
        notes.append(f"sink {name}: source {status['bootstrap_servers']}, group {status['group_id']}; "
                     f"as of {age:.0f} s ago" + (f"; last pass failed: {status['error']}" if status["error"] else ""))
        for topic, data in sorted(status["topics"].items()):
            for part in data["partitions"]:
                rows.append((name, topic, str(part["partition"]), _cell(part["source_start"]),
                             _cell(part["source_end"]), _cell(part["table_offset"]), _cell(part["lag_records"]),
                             str(part["lag_seconds"]), part["error"] or "-"))
        for gap in status["gaps"]:
            notes.append(f"sink {name}: GAP {gap['topic']}-{gap['partition']} offsets {gap['start']}..{gap['end'] - 1} "
                         "were deleted by the source's retention before the sink read them")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for note in notes:
        print(note)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _space_line(settings: Settings) -> str:
    """Whether the data directory's free space lets produce in (log/pressure.py; the broker checks each append)."""
    if settings.intake.url is not None:
        return f"intake: objects in {settings.intake.url} (no local space bound)"
    free = shutil.disk_usage(settings.data_dir).free
    floor = settings.intake.min_free_bytes
    if free < floor:
        return f"produce refused: {space_reason(free, 0, floor)}"
    return (f"data directory: {free} bytes free, {free - floor} above intake.min_free_bytes={floor} "
            "(an append that does not fit above it is refused, retriably)")
