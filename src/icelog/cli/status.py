"""`icelog status`: where every partition stands, read from the metadata store (broker up or down)."""

from __future__ import annotations

import argparse
from typing import Any

from icelog.config import load_settings
from icelog.meta.store import open_store


def add_parser(sub: Any) -> None:
    status = sub.add_parser("status", help="log start, high watermark and intake size of every partition")
    status.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, data_dir=args.data_dir)
    store = open_store(settings.metadata_url)
    try:
        chunks = store.intake_chunks()
        intake: dict[tuple[Any, int], tuple[int, int]] = {}
        for chunk in chunks:
            count, size = intake.get((chunk.topic_id, chunk.partition), (0, 0))
            intake[(chunk.topic_id, chunk.partition)] = (count + 1, size + chunk.length)
        rows = [("TOPIC", "PARTITION", "LOG-START", "HIGH-WATERMARK", "RECORDS", "INTAKE-CHUNKS", "INTAKE-BYTES")]
        for topic in store.list_topics():
            for part in store.partitions(topic.topic_id):
                count, size = intake.get((topic.topic_id, part.partition), (0, 0))
                rows.append((
                    topic.name, str(part.partition), str(part.log_start_offset), str(part.high_watermark),
                    str(part.high_watermark - part.log_start_offset), str(count), str(size),
                ))
    finally:
        store.close()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no topics)")
    return 0
