"""A sink's source cluster seen as the archiver's store (archive/archiver.ArchiverStore).

The archiver plans from topics, partitions and where their records lie, and records its progress. For a sink:
- **Topics** are the source's topics the sink names (a list or a pattern), with configs from `topic_configs` and
  the source's `cleanup.policy` (a compacted source topic becomes a primary-key table). Their ids are fixed by
  the sink's and the topic's names, so a table is always the same sink's.
- **Where records lie**: no intake index, so each partition's offsets are cut into runs as the sink first sees
  them (each ListOffsets that finds the high watermark moved adds a run stamped with that moment). The planner's
  delays (`complete.delay`, `idle`) then count from when the sink saw the records, and the tasks fetch each run
  from the source's leader (read_committed: only committed records, archive/intake_source.KafkaFetch).
- **Progress** lives in the table (offsets in each snapshot's summary, as for built-in topics); this view keeps a
  copy in memory for the planner. `record_archive` is called right after each Iceberg commit (and after a
  restart read the table's offsets): only then are the offsets committed to the source group, so the source's
  lag tools show the sink's progress and a crash in between loses nothing (the table says where to resume).
- **Gaps**: offsets the source's retention deleted before the sink read them are reported (log and status),
  never skipped silently.
The table columns (field ids), maintenance records and locks are the local metadata store's.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from icelog.client.cluster import PartitionOffsets
from icelog.client.connection import BrokerRequestError
from icelog.config import SinkSettings
from icelog.errors import ErrorCode
from icelog.meta.store import (
    ArchiveLedger,
    ArchiveState,
    HeldLock,
    IntakeChunk,
    MaintenanceRecord,
    PartitionRecord,
    ProcessLocks,
    StoreConnection,
    TopicRecord,
)
from icelog.table.field_ids import TableColumn

log = logging.getLogger(__name__)

SINK_TOPIC_IDS = uuid.UUID("3f7c1d52-8a0e-4f0b-9a57-1c5e2b7d9e41")  # uuid5 namespace of sink topics' ids
TOPICS_REFRESH_S = 10.0  # how often the source's topic list (and configs) is read again
RUN_RECORDS = 50_000  # a run of offsets is cut at this many records, so archives cut at max.bytes
RECORD_BYTES_GUESS = 1024  # bytes a record is assumed to take until fetched (plans and Fetch sizes only)
SOURCE_CONFIGS = ("cleanup.policy",)  # source topic configs a sink topic takes


class SourceClient(Protocol):
    """What the view asks the source cluster (client/cluster.SourceCluster)."""

    def topics(self) -> dict[str, int]: ...

    def offsets(self, topic: str, partitions: Sequence[int]) -> Mapping[int, PartitionOffsets]: ...

    def topic_configs(self, topics: Sequence[str]) -> Mapping[str, Mapping[str, str]]: ...

    def commit_offsets(self, group_id: str, topic: str, offsets: Mapping[int, int]) -> None: ...

    def close(self) -> None: ...


class LocalStore(ArchiveLedger, ProcessLocks, StoreConnection, Protocol):
    """The local metadata store: table columns, maintenance records, locks."""


def sink_topic_id(sink: str, topic: str) -> uuid.UUID:
    return uuid.uuid5(SINK_TOPIC_IDS, f"{sink}/{topic}")


@dataclass(frozen=True)
class Gap:
    """Offsets [start, end) of a source partition its retention deleted before the sink read them."""

    topic: str
    partition: int
    start: int
    end: int
    seen_ms: int


@dataclass
class _Partition:
    runs: list[IntakeChunk] = field(default_factory=list)  # unarchived offsets, in runs as first seen
    offsets: PartitionOffsets | None = None
    archived: int | None = None  # the table's next offset, once known (record_archive)
    error: str = ""
    error_ms: int = -1
    commit_ms: int = -1
    dead_letters: int = 0


class SourceView:
    """The archiver's store for one sink (see the module docstring)."""

    def __init__(
        self, name: str, sink: SinkSettings, group_id: str, client: SourceClient, local: LocalStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.sink = sink
        self.group_id = group_id
        self.client = client
        self.local = local
        self.clock = clock
        self.gaps: list[Gap] = []
        self._pattern = re.compile(sink.topic_pattern) if sink.topic_pattern else None
        self._lock = threading.Lock()  # topics run on the archiver's worker threads
        self._topics: dict[str, TopicRecord] = {}
        self._by_id: dict[uuid.UUID, TopicRecord] = {}
        self._topics_read = -TOPICS_REFRESH_S
        self._configs_refused = False
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watch_client: SourceClient | None = None
        self._parts: dict[tuple[uuid.UUID, int], _Partition] = {}

    # -- topics ------------------------------------------------------------------------------------------------
    def _wanted(self, topic: str) -> bool:
        if self._pattern is not None:
            return self._pattern.search(topic) is not None
        return topic in self.sink.topics

    def _refresh_topics(self) -> None:
        now = time.monotonic()
        if now - self._topics_read < TOPICS_REFRESH_S:
            return
        found = {t: n for t, n in self.client.topics().items() if self._wanted(t)}
        missing = [t for t in self.sink.topics if t not in found]
        if missing:
            log.warning("sink %s: the source has no topic %s (yet)", self.name, ", ".join(missing))
        source_configs = self._source_configs(sorted(found))
        topics: dict[str, TopicRecord] = {}
        for topic, count in sorted(found.items()):
            configs = {k: v for k, v in source_configs.get(topic, {}).items() if k in SOURCE_CONFIGS}
            configs.update(self.sink.topic_configs.get(topic, {}))
            topics[topic] = TopicRecord(topic, sink_topic_id(self.name, topic), count, configs)
        with self._lock:
            self._topics = topics
            self._by_id = {t.topic_id: t for t in topics.values()}
            self._topics_read = now

    def _source_configs(self, topics: Sequence[str]) -> Mapping[str, Mapping[str, str]]:
        """The source topics' configs; {} when the sink's principal may not describe them (it then takes
        cleanup.policy from `topic_configs` only, and says so once)."""
        if not topics:
            return {}
        try:
            return self.client.topic_configs(topics)
        except BrokerRequestError as exc:
            if exc.code != ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                raise
            if not self._configs_refused:
                log.warning("sink %s: the source refuses DescribeConfigs (%s): a compacted topic is a primary-key "
                            "table only if topic_configs says cleanup.policy: compact", self.name, exc)
                self._configs_refused = True
            return {}

    def list_topics(self) -> list[TopicRecord]:
        self._refresh_topics()
        return list(self._topics.values())

    def list_topics_cached(self) -> list[TopicRecord]:
        """The topics as last read from the source (no request)."""
        return list(self._topics.values())

    def get_topic(self, name: str) -> TopicRecord | None:
        self._refresh_topics()
        return self._topics.get(name)

    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        """Where the source's partitions stand now (one ListOffsets round); new offsets become a run."""
        topic = self._by_id.get(topic_id)
        if topic is None:
            return []
        offsets = self.client.offsets(topic.name, range(topic.partitions))
        self._observe(topic, offsets)
        return [PartitionRecord(topic_id, p, seen.log_start, seen.high_watermark)
                for p, seen in sorted(offsets.items())]

    def _observe(self, topic: TopicRecord, offsets: Mapping[int, PartitionOffsets]) -> None:
        """The partitions' offsets as just seen: what is new since the last look becomes a run stamped now."""
        now_ms = int(self.clock() * 1000)
        with self._lock:
            for p, seen in offsets.items():
                part = self._parts.setdefault((topic.topic_id, p), _Partition())
                part.offsets = seen
                self._extend(topic.topic_id, p, part, seen, now_ms)

    def watch(self, client: SourceClient, every_s: float) -> None:
        """Look at the source's offsets every `every_s` on a thread of its own (with a client of its own), so runs
        are stamped within a poll of their records' arrival, not only between passes: a pass that writes for W
        seconds would otherwise start the archive delays of what arrived meanwhile W seconds late."""
        self._watch_client = client
        self._watcher = threading.Thread(target=self._watch, args=(client, every_s), name=f"sink-{self.name}-watch",
                                         daemon=True)
        self._watcher.start()

    def _watch(self, client: SourceClient, every_s: float) -> None:
        while not self._stopping.wait(every_s):
            try:
                for topic in list(self._topics.values()):
                    self._observe(topic, client.offsets(topic.name, range(topic.partitions)))
            except Exception as exc:  # noqa: BLE001 - the passes report the source's failures; this only stamps
                log.debug("sink %s: looking at the source's offsets failed: %s", self.name, exc)

    def _extend(self, topic_id: uuid.UUID, partition: int, part: _Partition, seen: PartitionOffsets,
                now_ms: int) -> None:
        start = part.runs[-1].end_offset if part.runs else max(seen.log_start, part.archived or 0)
        start = max(start, seen.log_start)
        if part.runs and part.runs[0].base_offset < seen.log_start:  # retention took unarchived records
            part.runs = [r for r in part.runs if r.end_offset > seen.log_start]
        while start < seen.high_watermark:
            end = min(seen.high_watermark, start + RUN_RECORDS)
            part.runs.append(IntakeChunk(topic_id, partition, start, end, -1, 0, (end - start) * RECORD_BYTES_GUESS,
                                         -1, now_ms))
            start = end

    def intake_chunks_after(self, topic_id: uuid.UUID, partition: int, offset: int, limit: int) -> list[IntakeChunk]:
        with self._lock:
            part = self._parts.get((topic_id, partition))
            if part is None:
                return []
            if part.runs and part.runs[0].base_offset > offset and (part.offsets is None
                                                                     or offset >= part.offsets.log_start):
                # Offsets the runs no longer hold but the source still does (a table behind the view, e.g.
                # rolled back): one run from there, seen now.
                now_ms = int(self.clock() * 1000)
                part.runs.insert(0, IntakeChunk(topic_id, partition, offset, part.runs[0].base_offset, -1, 0,
                                                (part.runs[0].base_offset - offset) * RECORD_BYTES_GUESS, -1, now_ms))
            return [r for r in part.runs if r.end_offset > offset][:limit]

    # -- progress ----------------------------------------------------------------------------------------------
    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        with self._lock:
            return [
                ArchiveState(tid, p, part.archived or 0, part.commit_ms, part.error, part.error_ms, part.dead_letters)
                for (tid, p), part in sorted(self._parts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
                if (topic_id is None or tid == topic_id) and part.archived is not None
            ]

    def record_archive(self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int) -> None:
        """The table holds these offsets (just committed, or read from the table): tell the source's group."""
        topic = self._by_id.get(topic_id)
        if topic is None:
            return
        with self._lock:
            for p, offset in archived_offsets.items():
                part = self._parts.setdefault((topic_id, p), _Partition())
                if part.archived is None or offset > part.archived:
                    part.archived = offset
                part.commit_ms = max(part.commit_ms, commit_ms)
                part.error, part.error_ms = "", -1
                part.runs = [r for r in part.runs if r.end_offset > part.archived]
        if archived_offsets:
            self.client.commit_offsets(self.group_id, topic.name, dict(archived_offsets))

    def report_gap(self, topic: TopicRecord, partition: int, start: int, end: int) -> None:
        """The table holds offsets below `start`, the source only from `end` (the archiver's on_gap): once each."""
        with self._lock:
            if any(g.topic == topic.name and g.partition == partition and g.start == start for g in self.gaps):
                return
            gap = Gap(topic.name, partition, start, end, int(self.clock() * 1000))
            self.gaps.append(gap)
        log.warning("sink %s: %s-%d: offsets %d..%d were deleted by the source's retention before the sink read "
                    "them (%d records the table will not have)", self.name, topic.name, partition, start, end - 1,
                    end - start)

    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        with self._lock:
            for p, n in counts.items():
                self._parts.setdefault((topic_id, p), _Partition()).dead_letters = n

    def record_archive_error(self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int) -> None:
        with self._lock:
            for p in partitions:
                part = self._parts.setdefault((topic_id, p), _Partition())
                part.error, part.error_ms = error, at_ms

    def partition_view(self, topic_id: uuid.UUID, partition: int) -> tuple[PartitionOffsets | None, int | None, int]:
        """(source offsets, table offset, ingest ms of the oldest unarchived run or -1) for `icelog status`."""
        with self._lock:
            part = self._parts.get((topic_id, partition))
            if part is None:
                return None, None, -1
            return part.offsets, part.archived, part.runs[0].ingest_timestamp if part.runs else -1

    def errors(self, topic_id: uuid.UUID, partition: int) -> str:
        with self._lock:
            part = self._parts.get((topic_id, partition))
            return part.error if part is not None else ""

    # -- the local store's ------------------------------------------------------------------------------------
    def table_columns(self, table: str) -> list[TableColumn]:
        return self.local.table_columns(table)

    def save_table_columns(self, table: str, columns: Iterable[TableColumn]) -> None:
        self.local.save_table_columns(table, columns)

    def record_maintenance(self, record: MaintenanceRecord) -> None:
        self.local.record_maintenance(record)

    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        return self.local.maintenance_records()

    def try_lock(self, name: str, shared: bool = False) -> HeldLock | None:
        return self.local.try_lock(name, shared)

    def close(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=30)
        if self._watch_client is not None:
            self._watch_client.close()
        self.client.close()
        self.local.close()
