"""The topics a broker serves and their partition logs, kept in step with the metadata store: create, delete, grow,
reconfigure (Kafka's rules and the codes its clients expect)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from icelog.config import Settings
from icelog.errors import ErrorCode, KafkaApiError, StoreError, TopicExistsError, UnknownTopicError
from icelog.log.partition import OffsetRangeSource, PartitionLog
from icelog.log.storage import IntakeStorage
from icelog.meta.store import (
    ArchiveLedger,
    IntakeIndex,
    PartitionRecord,
    ProducerSnapshots,
    StoreConnection,
    TopicCatalog,
    TopicRecord,
)
from icelog.table.config import BUCKET_KEY, archive_config, table_config
from icelog.topics import (
    MAX_PARTITIONS_PER_TOPIC,
    EffectiveConfig,
    refuse_internal_topic_name,
    validate_config_change,
    validate_table_configs,
    validate_together,
    validate_topic_configs,
    validate_topic_name,
)

log = logging.getLogger(__name__)

# The older offset range sources (the Iceberg table, readback/) of a partition of a topic: set by the broker.
OlderSources = Callable[[TopicRecord, EffectiveConfig, int], list[OffsetRangeSource]]


class LogStore(TopicCatalog, IntakeIndex, ArchiveLedger, ProducerSnapshots, StoreConnection, Protocol):
    """The metadata the log keeps (topics, the intake index, producer snapshots) and reads (archive progress,
    so retention and back-pressure count only what the table holds); it closes the store it is handed."""


@dataclass
class TopicState:
    """A topic as the broker serves it."""

    record: TopicRecord
    config: EffectiveConfig
    partitions: list[PartitionLog]
    # Back-pressure (log/pressure.py): icelog.archive.max.lag.bytes of an archived topic (None: not
    # archived) and its unarchived intake bytes, refreshed in the background and raised by each append.
    max_lag_bytes: int | None = None
    unarchived_bytes: int = 0

    @property
    def name(self) -> str:
        return self.record.name


class TopicLogs:
    """Every topic the broker serves, by name and by id, with its partition logs (mutated on the event loop)."""

    def __init__(self, settings: Settings, store: LogStore, storage: IntakeStorage) -> None:
        self.settings = settings
        self.store = store
        self.storage = storage
        self.topics: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, TopicState] = {}
        # Plugged into each PartitionLog (None or []: the intake is the whole log).
        self.older_sources: OlderSources | None = None
        # A topic was deleted: the next retention pass releases what it held (off the event loop: the storage's
        # deletes are file unlinks or DELETE requests).
        self.release_due = False
        # A broker of a cluster serves a partition only while it leads it (PartitionLog.led, set by the cluster's
        # controller); alone, it leads every partition.
        self.clustered = False

    def load(self) -> None:
        """Install every stored topic with the hot tail of each partition's chunk index (start-up)."""
        for record in self.store.list_topics():
            self.install(record)
        # Only the hot tail of each partition's chunk index is loaded: start-up cost does not grow with
        # the intake (older chunks are looked up in the store on demand).
        for part in (p for p in self.partitions() if p.led):  # (a cluster's broker loads one when it leads it)
            part.load_tail(self.store.intake_last_chunks(part.topic_id, part.partition,
                                                         self.settings.intake.index_cache_chunks))

    def partitions(self) -> Iterator[PartitionLog]:
        """Every partition log of every topic (a snapshot of the topic list: safe while topics change)."""
        for state in list(self.topics.values()):
            yield from state.partitions

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        """A topic by its id (a deleted one: None)."""
        return self._by_id.get(topic_id)

    def partition_by_id(self, topic_id: uuid.UUID, partition: int) -> PartitionLog | None:
        """A partition log by topic id (a deleted topic's or a partition not installed: None)."""
        state = self._by_id.get(topic_id)
        return state.partitions[partition] if state is not None and partition < len(state.partitions) else None

    def install(self, record: TopicRecord) -> TopicState:
        """Serve a topic as stored (new, or grown or reconfigured: its partition logs are kept)."""
        config = EffectiveConfig.of(record.configs, self.settings.topic_defaults)
        old = self.topics.get(record.name)
        logs = list(old.partitions) if old and old.record.topic_id == record.topic_id else []
        for part in self.store.partitions(record.topic_id)[len(logs) :]:
            logs.append(self._partition_log(part))
        if self.older_sources is not None:
            for part_log in logs:
                part_log.older_sources = self.older_sources(record, config, part_log.partition)
        archive = archive_config(record.name, record.configs, self.settings.topic_defaults, self.settings.archive)
        state = TopicState(record, config, logs, archive.max_lag_bytes if archive.enabled else None)
        if old is not None and old.record.topic_id == record.topic_id:
            state.unarchived_bytes = old.unarchived_bytes
        self.topics[record.name] = state
        self._by_id[record.topic_id] = state
        return state

    def _partition_log(self, part: PartitionRecord) -> PartitionLog:
        log_ = PartitionLog(
            part.topic_id, part.partition, part.log_start_offset, part.high_watermark, self.storage, self.store,
            part.intake_bytes, self.settings.intake.index_cache_chunks,
            self.settings.intake.batch_positions_cache_chunks,
        )
        log_.retention_start_offset = part.retention_start_offset
        log_.led = not self.clustered
        return log_

    def fresh_partition(self, topic_id: uuid.UUID, partition: int) -> PartitionLog | None:
        """A partition's log as the store has it now, with the hot tail of its chunk index, not yet served: what a
        broker of a cluster takes over when it becomes the leader (any thread; `replace` it in on the event loop).
        None: the topic or partition is gone."""
        state = self._by_id.get(topic_id)
        found = [p for p in self.store.partitions(topic_id) if p.partition == partition]
        if state is None or not found:
            return None
        fresh = self._partition_log(found[0])
        fresh.load_tail(self.store.intake_last_chunks(topic_id, partition, self.settings.intake.index_cache_chunks))
        if self.older_sources is not None:
            fresh.older_sources = self.older_sources(state.record, state.config, partition)
        return fresh

    def replace(self, fresh: PartitionLog) -> bool:
        """Serve `fresh` in place of the partition's log (event loop); False if the topic went meanwhile."""
        state = self._by_id.get(fresh.topic_id)
        if state is None or fresh.partition >= len(state.partitions):
            return False
        old = state.partitions[fresh.partition]
        old.led = False
        old.wake_waiters()
        state.partitions[fresh.partition] = fresh
        fresh.led = True
        return True

    def sync(self, records: list[TopicRecord]) -> list[TopicState]:
        """Follow the store's topics (a cluster: other brokers create, grow, reconfigure and delete them): install
        what is new or changed, forget what is gone. The topics newly installed or grown."""
        changed = []
        stored = {r.name: r for r in records}
        for name in [n for n, state in self.topics.items()
                     if n not in stored or stored[n].topic_id != state.record.topic_id]:
            gone = self.topics.pop(name)
            self._by_id.pop(gone.record.topic_id, None)
            for part in gone.partitions:
                part.led = False
            log.info("topic %s was deleted on another broker", name)
        for record in records:
            state = self.topics.get(record.name)
            if state is None or state.record != record:
                grown = state is None or record.partitions != len(state.partitions)
                installed = self.install(record)
                if grown:
                    changed.append(installed)
        return changed

    def get(self, name: str) -> TopicState | None:
        return self.topics.get(name)

    def partition(self, topic: str, partition: int) -> tuple[TopicState, PartitionLog]:
        """A topic and one of its partitions, served here: UNKNOWN_TOPIC_OR_PARTITION if either does not exist,
        NOT_LEADER_OR_FOLLOWER (retriable: the client refreshes its metadata) if another broker leads it."""
        state = self.topics.get(topic)
        if state is None or not 0 <= partition < len(state.partitions):
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist")
        part = state.partitions[partition]
        if not part.led:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"this broker does not lead {topic}-{partition}; refresh the metadata")
        return state, part

    def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str | None], validate_only: bool = False
    ) -> TopicState | None:
        """Create a topic (Kafka's rules); raise KafkaApiError with the code a client expects."""
        validate_topic_name(name)
        refuse_internal_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise KafkaApiError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}, got {partitions}",
            )
        values = {k: v for k, v in validate_topic_configs(configs).items() if v is not None}
        validate_table_configs(values, self.settings.topic_defaults)
        validate_together(values, self.settings.topic_defaults)
        if name in self.topics:
            raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if validate_only:
            return None
        try:
            record = self.store.create_topic(name, partitions, values)
        except TopicExistsError as exc:
            raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS, str(exc)) from None
        log.info("created topic %s with %d partitions %s", name, partitions, values or "")
        return self.install(record)

    def delete_topic(self, name: str) -> None:
        state = self.topics.get(name)
        if state is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        try:
            self.store.delete_topic(name)
        except UnknownTopicError as exc:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(exc)) from None
        del self.topics[name]
        del self._by_id[state.record.topic_id]
        for part in state.partitions:
            part.drop_chunks_before(part.high_watermark + 1, part.intake_bytes)
        self.release_due = True
        log.info("deleted topic %s", name)

    def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        state = self.topics.get(name)
        if state is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        if total > MAX_PARTITIONS_PER_TOPIC:
            raise KafkaApiError(
                ErrorCode.INVALID_PARTITIONS, f"a topic can have at most {MAX_PARTITIONS_PER_TOPIC} partitions"
            )
        if _bucket_key(state.record.configs, self.settings.topic_defaults) is not None:
            raise KafkaApiError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {BUCKET_KEY}: its partitions are the Iceberg buckets of the table's spec "
                f"bucket(col, {len(state.partitions)}), and records already stored would sit in the wrong bucket; "
                "create a new topic with more partitions and copy the records",
            )
        if total <= len(state.partitions):
            raise KafkaApiError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {len(state.partitions)} partitions; the new count must be higher",
            )
        if validate_only:
            return
        try:
            self.install(self.store.add_partitions(name, total))
        except StoreError as exc:
            raise KafkaApiError(ErrorCode.INVALID_PARTITIONS, str(exc)) from None

    def alter_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str], validate_only: bool = False
    ) -> None:
        state = self.topics.get(name)
        if state is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        delete_keys = list(delete_keys)
        validate_config_change(state.record.configs, set_configs, delete_keys)  # first: its reason is the real one
        validate_topic_configs({**set_configs, **{k: None for k in delete_keys}})
        after = {k: v for k, v in {**state.record.configs, **set_configs}.items() if k not in delete_keys}
        validate_table_configs(after, self.settings.topic_defaults)
        validate_together(after, self.settings.topic_defaults)
        if not validate_only:
            self.install(self.store.alter_topic_configs(name, set_configs, list(delete_keys)))


def _bucket_key(configs: Mapping[str, str], defaults: Mapping[str, str]) -> str | None:
    """A topic's icelog.table.bucket.key (None also when its table configs do not fit: refused at creation)."""
    try:
        return table_config(configs, defaults).bucket_key
    except ValueError:
        return None
