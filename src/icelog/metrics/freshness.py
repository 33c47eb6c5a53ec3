"""Produce → visible in Iceberg: observed by the broker when it sees a partition's archived offset move.

The archiver records each commit in the metadata store (archived offset, commit time); the broker reads those
states every second anyway (back-pressure). When a partition's archived offset has moved, each intake chunk
that became wholly archived is observed once: the commit time less the chunk's ingest time (when its group
commit was durable, `IntakeChunk.ingest_timestamp`). A chunk is one group commit's records of one partition,
so the histogram counts chunks, not records. Nothing crosses processes but the store's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram

from icelog.meta.store import ArchiveState, IntakeIndex, TopicCatalog

FRESHNESS_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
MAX_CHUNKS = 1000  # per partition and refresh: a backlog archived at once is sampled, not walked whole


class FreshnessWatch:
    """Observes `icelog_archive_freshness_seconds{topic}` from successive archive states (a worker thread)."""

    def __init__(self, registry: CollectorRegistry, store: IntakeIndex) -> None:
        self.store = store
        self.histogram = Histogram(
            "icelog_archive_freshness_seconds", "From an intake chunk's records made durable (acknowledged) to their "
            "Iceberg commit; one observation per chunk (a group commit's records of one partition).", ["topic"],
            buckets=FRESHNESS_BUCKETS, registry=registry,
        )
        self._seen: dict[tuple[uuid.UUID, int], int] | None = None  # archived offsets at the last look

    def observe(self, states: Iterable[ArchiveState], topics: TopicCatalog) -> None:
        """Compare with the last states seen; the first call (broker start-up) only takes them as the baseline."""
        current = {(s.topic_id, s.partition): s for s in states}
        seen, self._seen = self._seen, {key: s.archived_offset for key, s in current.items()}
        if seen is None:
            return
        moved = [(key, s) for key, s in current.items() if s.archived_offset > seen.get(key, 0)]
        if not moved:
            return
        names = {t.topic_id: t.name for t in topics.list_topics()}
        for (topic_id, partition), state in moved:
            name = names.get(topic_id)
            if name is None or state.last_commit_ms < 0:
                continue
            before = seen.get((topic_id, partition), 0)
            child = self.histogram.labels(name)
            for chunk in self.store.intake_chunks_after(topic_id, partition, before, MAX_CHUNKS):
                if chunk.end_offset > state.archived_offset:
                    break
                # Wholly archived by this commit (a chunk ending at or before `before` was counted already).
                if chunk.end_offset > before and chunk.ingest_timestamp >= 0:
                    child.observe(max(state.last_commit_ms - chunk.ingest_timestamp, 0) / 1000)
