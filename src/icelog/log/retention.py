"""Retention of the intake: Kafka's retention.ms / retention.bytes and icelog.intake.retention.ms drop whole chunks from
the front of each partition (an archived topic's only once the table holds them); Kafka retention of a partition read
back from its table moves the log start consumers see."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path

from icelog.config import Settings
from icelog.faults import fault_point, hold_point
from icelog.log.partition import PartitionLog
from icelog.log.storage import IntakeStorage
from icelog.log.topic_logs import LogStore, TopicLogs
from icelog.table.config import archive_config

log = logging.getLogger(__name__)

OnLoop = Callable[[Callable[[], None]], None]  # runs a change to in-memory partition state on the event loop


def run_inline(change: Callable[[], None]) -> None:
    change()


class Retention:
    """One retention pass over every partition (the broker runs it on a worker thread every
    retention_check_interval_ms)."""

    def __init__(self, settings: Settings, store: LogStore, storage: IntakeStorage, topics: TopicLogs) -> None:
        self.settings = settings
        self.store = store
        self.storage = storage
        self.topics = topics

    def enforce(self, now_ms: int | None = None, on_loop: OnLoop = run_inline) -> int:
        """Apply retention.ms / retention.bytes to every partition; return how many chunks were dropped.

        The broker runs this on a worker thread (its store reads, durable trims and file deletions would
        stall every connection on the event loop), with `on_loop` running the in-memory changes (the
        partition's chunk list and log starts, which the loop appends to) on the event loop.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        dropped = 0
        for state in list(self.topics.topics.values()):
            retention_ms, retention_bytes = state.config.retention_ms, state.config.retention_bytes
            if not state.config.deletes:  # cleanup.policy=compact alone: Kafka keeps every key whatever their age
                retention_ms = retention_bytes = -1
            # Archived topics: intake is dropped only once archived (the archiver records how far in
            # the store), then by Kafka retention or icelog.intake.retention.ms, whichever comes first.
            archive = archive_config(state.name, state.record.configs, self.settings.topic_defaults,
                                     self.settings.archive)
            # How long archived intake stays once the table holds it. A compacted topic's table holds no tombstones:
            # its intake serves them for delete.retention.ms, as long as Kafka keeps a tombstone after compaction.
            kept_ms = archive.intake_retention_ms
            if state.config.compacted and kept_ms >= 0:
                kept_ms = max(kept_ms, state.config.delete_retention_ms)
            archived: dict[int, int] | None = None
            if archive.enabled:
                states = self.store.archive_states(state.record.topic_id)
                archived = {a.partition: a.archived_offset for a in states}
            for part in state.partitions:
                if not part.led:  # another broker of the cluster leads it, and trims it
                    continue
                if archived is not None:
                    self._move_retention_start(state.name, part, retention_ms, retention_bytes, now_ms, on_loop)
                if retention_ms < 0 and retention_bytes < 0 and (archived is None or kept_ms < 0):
                    continue  # nothing can expire: no walk at all
                new_start = part.log_start_offset
                remaining = part.intake_bytes
                trimmed = 0
                readable_end = max((s.end_offset() or 0 for s in part.older_sources), default=0)
                # Oldest first, page by page from the store's index; stops at the first chunk kept.
                for chunk in part.chunks_from(part.log_start_offset):
                    too_old = retention_ms >= 0 and chunk.max_timestamp < now_ms - retention_ms
                    too_big = retention_bytes >= 0 and remaining - chunk.length >= retention_bytes
                    if archived is not None:
                        if chunk.end_offset > archived.get(part.partition, 0):
                            break
                        # Only what consumers can read from the table instead (read-back on, and the
                        # broker's plan of the table already holds it): else keep it.
                        intake_ms = kept_ms if chunk.end_offset <= readable_end else -1
                        too_old = too_old or (intake_ms >= 0 and chunk.max_timestamp < now_ms - intake_ms)
                    if not (too_old or too_big) or chunk.base_offset >= part.high_watermark:
                        break
                    new_start = chunk.end_offset
                    remaining -= chunk.length
                    trimmed += chunk.length
                    dropped += 1
                if new_start > part.log_start_offset:
                    self.store.trim_intake(part.topic_id, part.partition, new_start)  # durable on return
                    fault_point("trim-committed")
                    hold_point("trim-held", Path(self.settings.data_dir) / "trim-held.release")
                    on_loop(functools.partial(part.drop_chunks_before, new_start, trimmed))
                    # The intake's start; the log start consumers see can be older (read-back from the table).
                    log.info("retention: %s-%d intake starts at offset %d now", state.name, part.partition, new_start)
        if dropped or self.topics.release_due:
            self.topics.release_due = False
            self.storage.release()
        return dropped

    def _move_retention_start(
        self, topic: str, part: PartitionLog, retention_ms: int, retention_bytes: int, now_ms: int, on_loop: OnLoop
    ) -> None:
        """Kafka retention of an archived partition read back from its table: move the visible log start.

        Table rows are never deleted here; only the offsets consumers may read move (durably, forward).
        """
        for source in part.older_sources:
            kept = source.retention_start(retention_ms, retention_bytes, now_ms)
            if kept is not None and kept > part.retention_start_offset:
                self.store.move_retention_start(part.topic_id, part.partition, kept)
                on_loop(functools.partial(setattr, part, "retention_start_offset", kept))
                log.info("retention: %s-%d log start consumers see is now %d (table rows are kept)",
                         topic, part.partition, kept)
