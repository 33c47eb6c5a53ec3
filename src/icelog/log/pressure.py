"""Back-pressure on produce (Nobu's circuit breaker): slow, then refuse, producers the lake cannot keep up with.

Intake of an archived topic may be dropped only once archived, so a lake that is down or slow makes
the intake grow. Two bounds keep it from filling the disk:
  - per archived topic, `icelog.archive.max.lag.bytes` of unarchived intake: past THROTTLE_FROM of it,
    Produce responses carry `throttle_time_ms` (clients wait before their next request); at the bound,
    batches are refused with NOT_ENOUGH_REPLICAS, which librdkafka, kafka-python and the Java client
    retry by themselves (with idempotence, in order and without duplicates);
  - for every topic, `intake.min_free_bytes` of free space in the data directory, checked against each
    append's own size (LogManager.free_estimate: the last reading less the intake bytes queued since).
The check on the produce path is O(1): it reads counters that a background task refreshes from the
metadata store's archive states (written by the archiver process) every REFRESH_INTERVAL_S, and that
each accepted append raises in between. Nothing accepted is ever dropped: a refused batch stores nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from icelog.config import Settings
from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.partition import PartitionLog
from icelog.log.storage import IntakeStorage
from icelog.log.topic_logs import LogStore, TopicLogs, TopicState
from icelog.meta.store import ArchiveState

log = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 1.0
THROTTLE_FROM = 0.8  # fraction of the lag bound from which producers are slowed
THROTTLE_MAX_MS = 1000  # throttle just below the bound; grows linearly from THROTTLE_FROM


def space_reason(free_bytes: int, pending: int, min_free_bytes: int) -> str:
    """Why produce is refused for disk space (the Produce error message, the log line, `icelog status`)."""
    append = f" less this append's {pending} bytes" if pending else ""
    return (
        f"the data directory has {free_bytes} bytes free{append}, below intake.min_free_bytes={min_free_bytes}; "
        "produce resumes once space is freed (retention, or a larger disk)"
    )


def admission(
    topic: str, unarchived: int, max_lag_bytes: int | None, free_bytes: int | None, min_free_bytes: int
) -> int:
    """Throttle (ms) for a produce to `topic`; raise a retriable NOT_ENOUGH_REPLICAS past a bound."""
    if free_bytes is not None and free_bytes < min_free_bytes:
        raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS, space_reason(free_bytes, 0, min_free_bytes))
    if max_lag_bytes is None:
        return 0
    if unarchived >= max_lag_bytes:
        raise KafkaApiError(
            ErrorCode.NOT_ENOUGH_REPLICAS,
            f"{topic}: {unarchived} intake bytes are not archived yet, the bound is "
            f"icelog.archive.max.lag.bytes={max_lag_bytes}; produce resumes when the archiver catches up "
            "(see `icelog status`)",
        )
    start = THROTTLE_FROM * max_lag_bytes
    if unarchived < start:
        return 0
    return 1 + int(THROTTLE_MAX_MS * (unarchived - start) / (max_lag_bytes - start))


class Pressure:
    """The broker's back-pressure state: free space of the intake's storage (the last reading less what was queued
    since) and each archived topic's unarchived bytes; the O(1) admission check of every produce reads it."""

    def __init__(self, settings: Settings, store: LogStore, storage: IntakeStorage, topics: TopicLogs) -> None:
        self.settings = settings
        self.store = store
        self.storage = storage
        self.topics = topics
        # Free space of the intake's storage as last read (apply_pressure; None: nothing to watch), and the intake
        # bytes written by then: each append is checked against the reading less everything queued since.
        self.free_bytes: int | None = None
        self._free_mark = 0
        self.space_refusal: str | None = None  # why produce is refused for space (logged once), or None
        self._disk_full = False  # an intake write found the disk full, none went through since

    def admission(self, topic: TopicState) -> int:
        """Throttle (ms) for a produce to `topic`, or a retriable refusal past a bound; O(1) (log/pressure.py)."""
        try:
            return admission(
                topic.name, topic.unarchived_bytes, topic.max_lag_bytes, self.free_estimate(),
                self.settings.intake.min_free_bytes,
            )
        except KafkaApiError as exc:
            if "min_free_bytes" in exc.message:
                self.refuse_for_space(exc.message)
            raise

    def free_estimate(self, pending: int = 0) -> int | None:
        """Free bytes of the data directory once what is queued, and `pending` more, is written.

        The last reading less every intake byte submitted since the writes it could have seen: O(1), and
        never above the truth by more than what other processes wrote since the reading.
        """
        if self.free_bytes is None:
            return None
        return self.free_bytes - (self.storage.stats.bytes_submitted - self._free_mark) - pending

    def refuse_for_space(self, reason: str) -> None:
        if self.space_refusal is None:
            log.warning("refusing produce: %s", reason)  # once per episode, not per request
        self.space_refusal = reason

    def check_space(self, pending: int) -> None:
        """Refuse (retriable NOT_ENOUGH_REPLICAS) an append that would take free space below the floor."""
        floor = self.settings.intake.min_free_bytes
        free = self.free_estimate(pending)
        if free is not None and free < floor:
            reason = space_reason(free + pending, pending, floor)
            self.refuse_for_space(reason)
            raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS, reason)
        if self.space_refusal is not None and free is not None and not self._disk_full:
            log.warning("produce resumes: the data directory has %d bytes free after this append "
                        "(intake.min_free_bytes=%d)", free, floor)
            self.space_refusal = None

    def count_unarchived(self, archived: Iterable[ArchiveState]) -> dict[uuid.UUID, int]:
        """Unarchived intake bytes per archived topic, from the archiver's recorded offsets.

        Runs on a worker thread. Per partition one aggregate query over the shorter side of the archived
        offset (the unarchived chunks, or the archived ones still in the intake, subtracted from the
        partition's total), so neither a lake far behind nor a long intake retention makes it walk the
        whole index. A count that races an append or a trim is off by that chunk until the next refresh.
        """
        offsets = {(s.topic_id, s.partition): s.archived_offset for s in archived}
        return {
            state.record.topic_id: sum(
                self._unarchived_bytes(part, offsets.get((part.topic_id, part.partition), 0))
                for part in list(state.partitions)
            )
            for state in list(self.topics.topics.values())
            if state.max_lag_bytes is not None
        }

    def _unarchived_bytes(self, part: PartitionLog, archived_offset: int) -> int:
        archived_offset = max(archived_offset, part.log_start_offset)
        if part.high_watermark - archived_offset <= archived_offset - part.log_start_offset:
            return self.store.intake_range_summary(part.topic_id, part.partition, archived_offset).bytes
        below = self.store.intake_bytes_below(part.topic_id, part.partition, archived_offset)
        return max(part.intake_bytes - below, 0)

    def apply(
        self, unarchived: dict[uuid.UUID, int], free_bytes: int | None, written_before: int | None = None
    ) -> None:
        """Install counts from count_unarchived and the intake storage's free space (None: unbounded), on the event
        loop.

        `written_before`: the storage's bytes_written when the free space was read (default: now).
        """
        self.free_bytes = free_bytes
        self._free_mark = self.storage.stats.bytes_written if written_before is None else written_before
        for topic_id, size in unarchived.items():
            state = self.topics.topic_by_id(topic_id)
            if state is not None and state.max_lag_bytes is not None:
                state.unarchived_bytes = size

    def disk_full(self, refused: int) -> None:
        """An intake write found the disk full and refused `refused` appends: produce is refused until one goes
        through (the estimate is 0 until the next reading)."""
        self.free_bytes, self._free_mark = 0, self.storage.stats.bytes_written
        self._disk_full = True
        self.refuse_for_space(f"an intake write found the data directory full; {refused} appends failed "
                              "retriably (KAFKA_STORAGE_ERROR), produce resumes once space is freed")

    def written(self) -> None:
        """A group commit went through: a full disk found earlier has room again."""
        if self._disk_full:
            self._disk_full = False
            self.space_refusal = None
            log.warning("produce resumes: intake writes go through again")
