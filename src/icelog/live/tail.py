"""Where a live read finds a topic and its tail: next to the broker's data, or over the Kafka protocol.

Either way the tail is planned as archives (archive/plan.py's `PlannedArchive`) and decoded by the archiver's own
decoders from a ChunkSource (archive/intake_source.py), so a tail row has the columns and values a pass would
write; which source, `archive.read_via` says, as for the archiver:
  - `IntakeTail` (files): the metadata store names the topic, its partitions and intake chunks; the tail is
    planned exactly as the archiver plans a forced pass (`plan_partition`), up to the last stable offset of the
    transaction index rebuilt from those chunks (`TransactionTracker`), aborted transactions' ranges attached;
  - `KafkaTail` (kafka): only the broker's bootstrap address and client settings (TLS, SASL) are needed. Metadata,
    DescribeConfigs and ListOffsets (read_committed) name the topic and its last stable offsets; the tail is read
    with read_committed Fetches (`KafkaFetch`, which drops aborted transactions and markers). Nothing over the
    protocol says when the broker ingested a batch, so the tail's `ingest_timestamp` is the read's planning time
    (a sink stamps a source's records with when it first saw them, the same way).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from icelog.archive.intake_source import ChunkSource, KafkaFetch, StoredChunks
from icelog.archive.plan import ChunkRef, PlannedArchive, plan_partition
from icelog.archive.transactions import TransactionTracker
from icelog.client.cluster import SourceCluster
from icelog.client.properties import parse
from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.log.backends import open_reader
from icelog.meta.backends import open_store
from icelog.meta.store import IntakeChunk, MetadataStore, PartitionRecord, TopicRecord
from icelog.table.config import ArchiveTopicConfig

PAGE_CHUNKS = 10_000  # intake chunks asked of the store at a time while the tail is planned
# Offsets per planned run of a tail read over Kafka: a run's batches are held in memory while it is decoded.
KAFKA_RUN_OFFSETS = 65_536
NO_FILE = -1  # the file id of a run read over Kafka (no intake file)
WHOLE_RUN = 1 << 40  # its planned bytes: Fetch asks for up to FETCH_MAX_BYTES at a time until the run's end


class UnknownTopicError(IcelogError):
    """The topic a live read names does not exist."""


@dataclass(frozen=True)
class TopicView:
    """A topic as a live read knows it: its name, id, partition count and configs."""

    name: str
    topic_id: uuid.UUID | None
    partitions: int
    configs: Mapping[str, str]


class TailSource(Protocol):
    """A topic's description and its tail: planned up to the last stable offsets, and the bytes of the plan."""

    def topic(self, name: str) -> TopicView: ...

    def plan_tail(
        self, topic: TopicView, table_offsets: Mapping[int, int], config: ArchiveTopicConfig, now_ms: int
    ) -> tuple[dict[int, int], list[PlannedArchive]]: ...

    def chunk_source(self, topic: TopicView) -> ChunkSource: ...

    def topic_names(self) -> list[TopicView]: ...

    def close(self) -> None: ...


def open_tail(settings: Settings) -> TailSource:
    """The tail source `archive.read_via` names: the broker's intake and store, or its Kafka listener."""
    if settings.archive_reads_via_kafka:
        return KafkaTail(settings)
    return IntakeTail(settings)


class IntakeTail:
    """The tail read where the broker keeps it: its metadata store and intake (a local directory or a bucket)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store: MetadataStore = open_store(settings.metadata_url)

    def topic(self, name: str) -> TopicView:
        record = self.store.get_topic(name)
        if record is None:
            raise UnknownTopicError(f"no topic {name!r} in {self.settings.metadata_url}")
        return _view(record)

    def topic_names(self) -> list[TopicView]:
        return [_view(record) for record in self.store.list_topics()]

    def plan_tail(
        self, topic: TopicView, table_offsets: Mapping[int, int], config: ArchiveTopicConfig, now_ms: int
    ) -> tuple[dict[int, int], list[PlannedArchive]]:
        assert topic.topic_id is not None  # the store's topics have ids
        record = TopicRecord(topic.name, topic.topic_id, topic.partitions, dict(topic.configs))
        tracker = TransactionTracker(open_reader(self.settings))
        stable: dict[int, int] = {}
        tail: list[PlannedArchive] = []
        forced = dataclasses.replace(config, max_bytes=1 << 62)  # one archive per partition: the whole tail
        for part in self.store.partitions(topic.topic_id):
            start = max(table_offsets.get(part.partition, 0), part.log_start_offset)
            chunks = self._chunks(topic.topic_id, part, start)
            tracker.update(topic.topic_id, part.partition, chunks)
            stable[part.partition] = lso = tracker.stable_offset(record, part)
            for archive in plan_partition(chunks, start, lso, forced, now_ms, force=True):
                aborted = tracker.aborted(topic.topic_id, part.partition, archive.start_offset, archive.end_offset)
                ranges = tuple((r.producer_id, r.first_offset, r.last_offset) for r in aborted)
                tail.append(dataclasses.replace(archive, aborted=ranges, reason="live"))
        return stable, tail

    def _chunks(self, topic_id: uuid.UUID, part: PartitionRecord, start: int) -> list[IntakeChunk]:
        """The partition's indexed chunks from the one holding `start` up to its high watermark (read before)."""
        chunks: list[IntakeChunk] = []
        offset = start
        while offset < part.high_watermark:
            page = self.store.intake_chunks_after(topic_id, part.partition, offset, PAGE_CHUNKS)
            page = [c for c in page if c.base_offset < part.high_watermark and c.end_offset > offset]
            if not page:
                break
            chunks += page
            offset = page[-1].end_offset
        return chunks

    def chunk_source(self, topic: TopicView) -> ChunkSource:
        # (StoredChunks closes its reader after each archive: one reader per archive read)
        return _ReaderPerArchive(self.settings)

    def close(self) -> None:
        self.store.close()


@dataclass(frozen=True)
class _ReaderPerArchive:
    """StoredChunks with a reader of its own per archive (StoredChunks closes the reader it is given)."""

    settings: Settings

    def chunks(self, archive: PlannedArchive) -> Iterator[tuple[ChunkRef, memoryview]]:
        return StoredChunks(open_reader(self.settings)).chunks(archive)


class KafkaTail:
    """The tail read over the Kafka protocol from the broker's listener, with the archive's client settings."""

    def __init__(self, settings: Settings) -> None:
        self.bootstrap = tuple(settings.archive_bootstrap)
        self.properties = parse(settings.archive.client_properties)
        self.cluster = SourceCluster(self.bootstrap, self.properties)

    def topic(self, name: str) -> TopicView:
        partitions = self.cluster.topics().get(name)
        if partitions is None:
            raise UnknownTopicError(f"no topic {name!r} on {','.join(self.bootstrap)}")
        configs = self.cluster.topic_configs([name])[name]
        return TopicView(name, self.cluster.topic_id(name), partitions, configs)

    def topic_names(self) -> list[TopicView]:
        counts = self.cluster.topics()
        configs = self.cluster.topic_configs(sorted(counts))
        return [TopicView(name, self.cluster.topic_id(name), n, configs[name]) for name, n in sorted(counts.items())]

    def plan_tail(
        self, topic: TopicView, table_offsets: Mapping[int, int], config: ArchiveTopicConfig, now_ms: int
    ) -> tuple[dict[int, int], list[PlannedArchive]]:
        offsets = self.cluster.offsets(topic.name, range(topic.partitions))
        topic_id = topic.topic_id or uuid.UUID(int=0)
        stable: dict[int, int] = {}
        tail: list[PlannedArchive] = []
        for partition, found in sorted(offsets.items()):
            stable[partition] = found.last_stable
            start = max(table_offsets.get(partition, 0), found.log_start)
            if start >= found.last_stable:
                continue
            # Runs of KAFKA_RUN_OFFSETS offsets: KafkaFetch hands each run's batches to the decoder as a chunk.
            refs = tuple(
                ChunkRef(NO_FILE, 0, WHOLE_RUN, base, min(base + KAFKA_RUN_OFFSETS, found.last_stable), now_ms)
                for base in range(start, found.last_stable, KAFKA_RUN_OFFSETS)
            )
            tail.append(PlannedArchive(topic_id, partition, start, found.last_stable, refs, "live"))
        return stable, tail

    def chunk_source(self, topic: TopicView) -> ChunkSource:
        return KafkaFetch(self.bootstrap, self.properties, topic.name)

    def close(self) -> None:
        self.cluster.close()


def _view(record: TopicRecord) -> TopicView:
    return TopicView(record.name, record.topic_id, record.partitions, record.configs)
