"""Archive progress per partition for `icelog status`: archived through, lag, last commit, last error."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from icelog.config import Settings
from icelog.meta.store import ArchiveLedger, IntakeIndex, TopicCatalog
from icelog.table.config import archive_config


class ProgressStore(TopicCatalog, IntakeIndex, ArchiveLedger, Protocol):
    """What progress is read from: partitions' offsets, the unarchived chunks' totals, archive states."""


@dataclass(frozen=True)
class ArchiveProgress:
    """How far behind the intake one partition's Iceberg table is."""

    enabled: bool
    archived_offset: int  # offsets below this are in the table
    lag_records: int
    lag_bytes: int
    lag_seconds: float  # age of the oldest record not yet archived
    last_commit_ms: int
    last_error: str
    dead_letters: int = 0  # batches in the dead-letter table (`<table>__dlq`)


def archive_progress(
    settings: Settings, store: ProgressStore, now_ms: int | None = None
) -> dict[tuple[uuid.UUID, int], ArchiveProgress]:
    """Progress of every partition of every topic (disabled topics included, with enabled=False)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    states = {(s.topic_id, s.partition): s for s in store.archive_states()}
    out: dict[tuple[uuid.UUID, int], ArchiveProgress] = {}
    for topic in store.list_topics():
        config = archive_config(topic.name, topic.configs, settings.topic_defaults, settings.archive)
        for part in store.partitions(topic.topic_id):
            key = (topic.topic_id, part.partition)
            state = states.get(key)
            archived = max(state.archived_offset if state else 0, 0)
            # Aggregated in the store over the unarchived chunks only (no chunk rows are loaded).
            pending = store.intake_range_summary(topic.topic_id, part.partition, archived) if config.enabled else None
            oldest = pending.oldest_ingest_ms if pending is not None else -1
            out[key] = ArchiveProgress(
                config.enabled,
                archived,
                max(part.high_watermark - max(archived, part.log_start_offset), 0),
                pending.bytes if pending is not None else 0,
                max(now_ms - oldest, 0) / 1000 if oldest >= 0 else 0.0,
                state.last_commit_ms if state else -1,
                state.last_error if state else "",
                state.dead_letters if state else 0,
            )
    return out
