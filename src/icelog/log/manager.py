"""The log manager: topics and their partition logs in memory, kept in step with the metadata store."""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from icelog.config import Settings
from icelog.errors import ErrorCode, KafkaApiError, StoreError, TopicExistsError, UnknownTopicError, log_retry
from icelog.faults import fault_point, hold_point
from icelog.log import intake_file, pressure
from icelog.log.backends import open_storage
from icelog.log.partition import OffsetRangeSource, PartitionLog
from icelog.log.producers import iter_stored_headers
from icelog.log.snapshots import decode_state, encode_state
from icelog.log.storage import Append, IntakeStorage
from icelog.log.transactions import encode_marker_batch, marker_type
from icelog.meta.store import (
    ArchiveLedger,
    ArchiveState,
    IntakeChunk,
    IntakeIndex,
    ProducerSnapshot,
    ProducerSnapshots,
    StoreConnection,
    TopicCatalog,
    TopicRecord,
)
from icelog.records.batch import (
    BatchHeader,
    assign_offsets,
    parse_produced_batches,
    repair_headers,
    set_log_append_time,
)
from icelog.records.walk import MAX_UNCOMPRESSED_BYTES
from icelog.table.config import BUCKET_KEY, archive_config, table_config
from icelog.topics import (
    MAX_PARTITIONS_PER_TOPIC,
    EffectiveConfig,
    validate_config_change,
    validate_table_configs,
    validate_together,
    validate_topic_configs,
    validate_topic_name,
)

log = logging.getLogger(__name__)

OnLoop = Callable[[Callable[[], None]], None]  # runs a change to in-memory partition state on the event loop


def _inline(change: Callable[[], None]) -> None:
    change()


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


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime


class LogManager:
    """Owns the intake storage and every partition log; all mutations go through here."""

    def __init__(self, settings: Settings, store: LogStore, storage: IntakeStorage | None = None) -> None:
        self.settings = settings
        self.store = store
        # The intake's backend (log/storage.py), from intake.url unless handed one.
        self.storage = open_storage(settings, store) if storage is None else storage
        self.topics: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, TopicState] = {}
        self._snapshot_offsets: dict[tuple[uuid.UUID, int], int] = {}  # last snapshot saved per partition
        self._snapshot_task: asyncio.Task[None] | None = None
        # Set by the transaction coordinator: raises KafkaApiError unless (topic, partition, producer id,
        # epoch) is in an Ongoing transaction it opened (None: no verification, e.g. tools and tests).
        self.txn_verifier: Callable[[str, int, int, int], None] | None = None
        # Free space of the data directory as last read (apply_pressure), and the intake bytes written by
        # then: each append is checked against the reading less everything queued since (free_estimate).
        self.free_bytes: int | None = None
        self._free_mark = 0
        self.space_refusal: str | None = None  # why produce is refused for space (logged once), or None
        self._disk_full = False  # an intake write found the disk full, none went through since
        # Set by the broker: the older offset range sources (the Iceberg table, readback/) of a partition
        # of a topic, plugged into each PartitionLog; None or [] means the intake is the whole log.
        self.older_sources: Callable[[TopicRecord, EffectiveConfig, int], list[OffsetRangeSource]] | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Recover the intake and load every topic; call before serving."""
        self.storage.recover()
        for record in self.store.list_topics():
            self._install(record)
        # Only the hot tail of each partition's chunk index is loaded: start-up cost does not grow with
        # the intake (older chunks are looked up in the store on demand).
        for state in self.topics.values():
            for part in state.partitions:
                part.load_tail(self.store.intake_last_chunks(part.topic_id, part.partition,
                                                             self.settings.intake.index_cache_chunks))
        self.storage.release()
        self._rebuild_producer_state()
        # Back-pressure counts from the first request on (then refreshed in the background by the broker).
        self.apply_pressure(self.count_unarchived(self.store.archive_states()), self.storage.capacity().free_bytes)

    def _rebuild_producer_state(self) -> None:
        """Load each partition's producer-state snapshot, then replay only the batches stored after it."""
        snapshots = {(s.topic_id, s.partition): s for s in self.store.producer_snapshots()}
        replayed = 0
        for state in self.topics.values():
            for part in state.partitions:
                since = 0
                snapshot = snapshots.get((part.topic_id, part.partition))
                # A snapshot past the high watermark cannot be (the index is re-derived from fsync'd
                # frames); should it happen, the intake is the truth: replay all of it.
                if snapshot is not None and snapshot.offset <= part.high_watermark:
                    loaded = decode_state(snapshot.state)
                    if loaded is not None:
                        part.producers, part.txn_index = loaded
                        part.txn_index.drop_before(part.log_start_offset)
                        since = snapshot.offset
                        self._snapshot_offsets[(part.topic_id, part.partition)] = since
                for chunk in part.chunks_from(since):
                    if chunk.end_offset <= since:
                        continue
                    data = self.storage.read(chunk)
                    headers = [h for h in iter_stored_headers(data) if h.base_offset >= since]
                    part.producers.replay(headers)
                    part.txn_index.replay(
                        (h, marker_type(data, h.position) if h.is_control else None) for h in headers
                    )
                    replayed += 1
        log.info("producer state: %d snapshot(s) loaded, %d intake chunk(s) replayed", len(snapshots), replayed)

    def snapshot_producer_state(self) -> list[ProducerSnapshot]:
        """Snapshots of partitions that moved since their last one and have nothing in flight (event loop)."""
        out = []
        for state in self.topics.values():
            for part in state.partitions:
                key = (part.topic_id, part.partition)
                if part.next_offset != part.high_watermark or self._snapshot_offsets.get(key) == part.high_watermark:
                    continue  # appends in flight could still be lost; or nothing new since the last one
                out.append(ProducerSnapshot(part.topic_id, part.partition, part.high_watermark,
                                            encode_state(part.producers, part.txn_index)))
        return out

    def _saved_snapshots(self, snapshots: list[ProducerSnapshot]) -> None:
        for snapshot in snapshots:
            self._snapshot_offsets[(snapshot.topic_id, snapshot.partition)] = snapshot.offset

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.intake.producer_snapshot_interval_ms / 1000)
            try:
                snapshots = self.snapshot_producer_state()
                if snapshots:
                    await asyncio.to_thread(self.store.save_producer_snapshots, snapshots)
                    self._saved_snapshots(snapshots)
            except Exception as exc:
                log_retry(log, "saving producer-state snapshots", exc)

    def start(self) -> None:
        self.storage.start(self._on_durable, self._on_not_written)
        self._snapshot_task = asyncio.get_running_loop().create_task(self._snapshot_loop(), name="producer-snapshots")

    async def close(self) -> None:
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        await self.storage.close()
        if self.storage.failed is None:
            # Everything queued is durable now: the next start-up replays nothing.
            try:
                snapshots = self.snapshot_producer_state()
                self.store.save_producer_snapshots(snapshots)
                self._saved_snapshots(snapshots)
            except Exception:
                log.exception("saving producer-state snapshots at shutdown failed (start-up will replay)")
        self.store.close()

    def _install(self, record: TopicRecord) -> TopicState:
        config = EffectiveConfig.of(record.configs, self.settings.topic_defaults)
        old = self.topics.get(record.name)
        logs = list(old.partitions) if old and old.record.topic_id == record.topic_id else []
        for part in self.store.partitions(record.topic_id)[len(logs) :]:
            logs.append(PartitionLog(
                record.topic_id, part.partition, part.log_start_offset, part.high_watermark, self.storage, self.store,
                part.intake_bytes, self.settings.intake.index_cache_chunks,
                self.settings.intake.batch_positions_cache_chunks,
            ))
            logs[-1].retention_start_offset = part.retention_start_offset
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

    def _on_durable(self, chunks: list[IntakeChunk]) -> None:
        if self._disk_full:
            self._disk_full = False
            self.space_refusal = None
            log.warning("produce resumes: intake writes go through again")
        for chunk in chunks:
            state = self._by_id.get(chunk.topic_id)
            if state is not None and chunk.partition < len(state.partitions):
                state.partitions[chunk.partition].add_durable_chunk(chunk)

    def _on_not_written(self, refused: list[tuple[uuid.UUID, int, int]]) -> None:
        """A full disk refused these appends (and nothing after them was written): hand their offsets out again."""
        # Until a write goes through, the disk counts as full (the estimate is 0 until the next reading).
        self.free_bytes, self._free_mark = 0, self.storage.stats.bytes_written
        self._disk_full = True
        self._refuse_for_space(f"an intake write found the data directory full; {len(refused)} appends failed "
                               "retriably (KAFKA_STORAGE_ERROR), produce resumes once space is freed")
        first: dict[tuple[uuid.UUID, int], int] = {}
        for topic_id, partition, base in refused:
            key = (topic_id, partition)
            first[key] = min(first.get(key, base), base)
        for (topic_id, partition), base in first.items():
            state = self._by_id.get(topic_id)
            if state is not None and partition < len(state.partitions):
                part = state.partitions[partition]
                part.next_offset = max(base, part.high_watermark)
                part.producers.forget_from(part.next_offset)
                part.txn_index.forget_from(part.next_offset)

    # -- topics --------------------------------------------------------------------------------
    def get(self, name: str) -> TopicState | None:
        return self.topics.get(name)

    def partition(self, topic: str, partition: int) -> tuple[TopicState, PartitionLog]:
        state = self.topics.get(topic)
        if state is None or not 0 <= partition < len(state.partitions):
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist")
        return state, state.partitions[partition]

    def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str | None], validate_only: bool = False
    ) -> TopicState | None:
        """Create a topic (Kafka's rules); raise KafkaApiError with the code a client expects."""
        validate_topic_name(name)
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
        return self._install(record)

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
        self.storage.release()
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
            self._install(self.store.add_partitions(name, total))
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
            self._install(self.store.alter_topic_configs(name, set_configs, list(delete_keys)))

    # -- back-pressure -------------------------------------------------------------------------
    def admission(self, topic: TopicState) -> int:
        """Throttle (ms) for a produce to `topic`, or a retriable refusal past a bound; O(1) (log/pressure.py)."""
        try:
            return pressure.admission(
                topic.name, topic.unarchived_bytes, topic.max_lag_bytes, self.free_estimate(),
                self.settings.intake.min_free_bytes,
            )
        except KafkaApiError as exc:
            if "min_free_bytes" in exc.message:
                self._refuse_for_space(exc.message)
            raise

    def free_estimate(self, pending: int = 0) -> int | None:
        """Free bytes of the data directory once what is queued, and `pending` more, is written.

        The last reading less every intake byte submitted since the writes it could have seen: O(1), and
        never above the truth by more than what other processes wrote since the reading.
        """
        if self.free_bytes is None:
            return None
        return self.free_bytes - (self.storage.stats.bytes_submitted - self._free_mark) - pending

    def _refuse_for_space(self, reason: str) -> None:
        if self.space_refusal is None:
            log.warning("refusing produce: %s", reason)  # once per episode, not per request
        self.space_refusal = reason

    def _check_space(self, pending: int) -> None:
        """Refuse (retriable NOT_ENOUGH_REPLICAS) an append that would take free space below the floor."""
        floor = self.settings.intake.min_free_bytes
        free = self.free_estimate(pending)
        if free is not None and free < floor:
            reason = pressure.space_reason(free + pending, pending, floor)
            self._refuse_for_space(reason)
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
            for state in list(self.topics.values())
            if state.max_lag_bytes is not None
        }

    def _unarchived_bytes(self, part: PartitionLog, archived_offset: int) -> int:
        archived_offset = max(archived_offset, part.log_start_offset)
        if part.high_watermark - archived_offset <= archived_offset - part.log_start_offset:
            return self.store.intake_range_summary(part.topic_id, part.partition, archived_offset).bytes
        below = self.store.intake_bytes_below(part.topic_id, part.partition, archived_offset)
        return max(part.intake_bytes - below, 0)

    def apply_pressure(
        self, unarchived: dict[uuid.UUID, int], free_bytes: int | None, written_before: int | None = None
    ) -> None:
        """Install counts from count_unarchived and the intake storage's free space (None: unbounded), on the event
        loop.

        `written_before`: the storage's bytes_written when the free space was read (default: now).
        """
        self.free_bytes = free_bytes
        self._free_mark = self.storage.stats.bytes_written if written_before is None else written_before
        for topic_id, size in unarchived.items():
            state = self._by_id.get(topic_id)
            if state is not None and state.max_lag_bytes is not None:
                state.unarchived_bytes = size

    # -- appends -------------------------------------------------------------------------------
    @staticmethod
    def validate(topic: TopicState, records: bytes, inflation_limit: int = MAX_UNCOMPRESSED_BYTES) -> list[BatchHeader]:
        """The produced batches of `records` for `topic`, checked as Kafka checks them before an append
        (`parse_produced_batches`). Touches no state: safe on any thread."""
        config = topic.config
        return parse_produced_batches(
            records, config.max_message_bytes, config.compacted, config.log_append_time, inflation_limit,
            config.timestamp_window(int(time.time() * 1000)),
        )

    def append(
        self, topic: TopicState, partition: PartitionLog, records: bytes, batches: list[BatchHeader] | None = None
    ) -> tuple[AppendResult, asyncio.Future[None]]:
        """Validate (unless `batches` are those `validate` gave for `records`), assign offsets and queue
        batches; the future resolves when they are durable."""
        if batches is None:
            batches = self.validate(topic, records)
        retry = partition.producers.check(batches)
        if retry is not None:  # an idempotent producer resent a batch we have: answer with its offsets
            return AppendResult(retry.base_offset, -1), _when_durable(retry.done)
        if self.txn_verifier is not None:
            # A transactional batch outside a transaction the coordinator opened would pin the LSO.
            for batch in batches:
                if batch.is_transactional:
                    self.txn_verifier(topic.name, partition.partition, batch.producer_id, batch.producer_epoch)
        buffer = bytearray(records)
        append_time = -1
        if topic.config.log_append_time:
            append_time = int(time.time() * 1000)
            set_log_append_time(buffer, batches, append_time)
        else:
            repair_headers(buffer, batches)  # the records' max timestamp, whatever the producer's header said
        self._check_space(len(buffer) + intake_file.FRAME_HEADER_SIZE)  # before any state changes
        if self.storage.unavailable is not None:  # (also before any state changes)
            # The group being committed waits for the store; what follows would only queue behind it. Refused as
            # the free-space floor refuses, nothing written: NOT_ENOUGH_REPLICAS is retriable without a metadata
            # refresh (librdkafka: Retry, MsgNotPersisted), where KAFKA_STORAGE_ERROR makes clients refresh first.
            raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                f"{self.storage.unavailable}; retry later")
        record_count = sum(b.last_offset_delta + 1 for b in batches)
        base = partition.reserve(record_count)
        assign_offsets(buffer, batches, base)
        max_ts = append_time if append_time >= 0 else max(b.max_timestamp for b in batches)
        # The bytearray goes to the storage as is: nothing touches it after offsets are assigned.
        done = self.storage.submit(
            Append(partition.topic_id, partition.partition, buffer, base, base + record_count, max_ts)
        )
        if topic.max_lag_bytes is not None:
            topic.unarchived_bytes += len(buffer)  # until the next refresh recounts from durable chunks
        partition.producers.record(batches, base, done)
        offset = base
        for batch in batches:
            partition.txn_index.on_data(batch.producer_id, offset, batch.is_transactional)
            offset += batch.last_offset_delta + 1
        return AppendResult(base, append_time), done

    def append_marker(
        self, partition: PartitionLog, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """Write a transaction commit/abort marker (a control batch) through the intake."""
        now = int(time.time() * 1000)
        buffer = bytearray(encode_marker_batch(producer_id, producer_epoch, commit, coordinator_epoch, now))
        base = partition.reserve(1)
        struct.pack_into(">q", buffer, 0, base)
        done = self.storage.submit(Append(partition.topic_id, partition.partition, buffer, base, base + 1, now, True))
        partition.producers.observe_epoch(producer_id, producer_epoch)
        partition.txn_index.on_marker(producer_id, base, commit)
        return done

    # -- retention -----------------------------------------------------------------------------
    def enforce_retention(self, now_ms: int | None = None, on_loop: OnLoop = _inline) -> int:
        """Apply retention.ms / retention.bytes to every partition; return how many chunks were dropped.

        The broker runs this on a worker thread (its store reads, durable trims and file deletions would
        stall every connection on the event loop), with `on_loop` running the in-memory changes (the
        partition's chunk list and log starts, which the loop appends to) on the event loop.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        dropped = 0
        for state in list(self.topics.values()):
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
        if dropped:
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


def _bucket_key(configs: Mapping[str, str], defaults: Mapping[str, str]) -> str | None:
    """A topic's icelog.table.bucket.key (None also when its table configs do not fit: refused at creation)."""
    try:
        return table_config(configs, defaults).bucket_key
    except ValueError:
        return None


def _when_durable(original: asyncio.Future[None] | None) -> asyncio.Future[None]:
    """The durability future of a retried batch: the original append's, or done if it predates a restart."""
    if original is not None and not original.cancelled():
        return original
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done
