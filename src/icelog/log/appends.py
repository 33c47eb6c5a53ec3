"""Appends: produced batches validated as Kafka validates them, offsets assigned, queued for the storage's group
commit; transaction markers; what a commit (or a full disk) reports back."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log import intake_file
from icelog.log.partition import PartitionLog
from icelog.log.pressure import Pressure
from icelog.log.producers import SequencedBatch
from icelog.log.storage import Append, IntakeStorage
from icelog.log.topic_logs import TopicLogs, TopicState
from icelog.log.transactions import encode_marker_batch
from icelog.meta.store import IntakeChunk
from icelog.records.batch import (
    BatchHeader,
    assign_offsets,
    parse_produced_batches,
    repair_headers,
    set_log_append_time,
)
from icelog.records.walk import MAX_UNCOMPRESSED_BYTES


@dataclass
class AppendResult:
    # -1 until a sequencing store assigns it: set before the append's durability future resolves.
    base_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    retry_of: SequencedBatch | None = None  # an idempotent retry: answered with its original's offsets

    @property
    def acked_offset(self) -> int:
        """The base offset to answer with once the append is durable."""
        return self.retry_of.base_offset if self.retry_of is not None else self.base_offset


class Appender:
    """Turns produced batches and transaction markers into appends of the intake storage."""

    def __init__(self, topics: TopicLogs, storage: IntakeStorage, pressure: Pressure) -> None:
        self.topics = topics
        self.storage = storage
        self.pressure = pressure
        # Set by the transaction coordinator: raises KafkaApiError unless (topic, partition, producer id,
        # epoch) is in an Ongoing transaction it opened (None: no verification, e.g. tools and tests).
        self.txn_verifier: Callable[[str, int, int, int], None] | None = None

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
            return AppendResult(retry.base_offset, -1, retry), _when_durable(retry.done)
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
        self.pressure.check_space(len(buffer) + intake_file.FRAME_HEADER_SIZE)  # before any state changes
        if self.storage.unavailable is not None:  # (also before any state changes)
            # The group being committed waits for the store; what follows would only queue behind it. Refused as
            # the free-space floor refuses, nothing written: NOT_ENOUGH_REPLICAS is retriable without a metadata
            # refresh (librdkafka: Retry, MsgNotPersisted), where KAFKA_STORAGE_ERROR makes clients refresh first.
            raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                f"{self.storage.unavailable}; retry later")
        record_count = sum(b.last_offset_delta + 1 for b in batches)
        max_ts = append_time if append_time >= 0 else max(b.max_timestamp for b in batches)
        if topic.max_lag_bytes is not None:
            topic.unarchived_bytes += len(buffer)  # until the next refresh recounts from durable chunks
        if self.storage.assigns_offsets:
            return self._append_sequenced(partition, buffer, batches, record_count, max_ts, append_time)
        base = partition.reserve(record_count)
        assign_offsets(buffer, batches, base)
        # The bytearray goes to the storage as is: nothing touches it after offsets are assigned.
        done = self.storage.submit(
            Append(partition.topic_id, partition.partition, buffer, base, base + record_count, max_ts)
        )
        partition.producers.record(batches, base, done)
        offset = base
        for batch in batches:
            partition.txn_index.on_data(batch.producer_id, offset, batch.is_transactional)
            offset += batch.last_offset_delta + 1
        return AppendResult(base, append_time), done

    def _append_sequenced(
        self, partition: PartitionLog, buffer: bytearray, batches: list[BatchHeader], record_count: int,
        max_ts: int, append_time: int,
    ) -> tuple[AppendResult, asyncio.Future[None]]:
        """Queue batches for a store that assigns offsets at commit: they are numbered from 0; producer and
        transaction state learn their offsets when the store assigns them (on the event loop, in commit order,
        before the high watermark moves past them, so the LSO never lets an open transaction's records through).

        The sequence check stays in memory (`check`, on the event loop, before the submit): one broker writes a
        partition, its producer state covers every append submitted, and appends are committed in submit order.
        """
        assign_offsets(buffer, batches, 0)
        result = AppendResult(-1, append_time)
        sequenced: list[SequencedBatch] = []

        def assigned(base: int) -> None:
            result.base_offset = base
            for entry in sequenced:
                entry.base_offset += base
            offset = base
            for batch in batches:
                partition.txn_index.on_data(batch.producer_id, offset, batch.is_transactional)
                offset += batch.last_offset_delta + 1

        done = self.storage.submit(
            Append(partition.topic_id, partition.partition, buffer, -1, record_count, max_ts, on_assigned=assigned)
        )
        sequenced.extend(partition.producers.record(batches, 0, done))
        return result, done

    def append_marker(
        self, partition: PartitionLog, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """Write a transaction commit/abort marker (a control batch) through the intake."""
        now = int(time.time() * 1000)
        buffer = bytearray(encode_marker_batch(producer_id, producer_epoch, commit, coordinator_epoch, now))
        if self.storage.assigns_offsets:  # the marker's offset is known once the store assigns it
            def assigned(base: int) -> None:
                partition.txn_index.on_marker(producer_id, base, commit)

            marker = self.storage.submit(
                Append(partition.topic_id, partition.partition, buffer, -1, 1, now, True, on_assigned=assigned)
            )
            partition.producers.observe_epoch(producer_id, producer_epoch)
            return marker
        base = partition.reserve(1)
        struct.pack_into(">q", buffer, 0, base)
        done = self.storage.submit(Append(partition.topic_id, partition.partition, buffer, base, base + 1, now, True))
        partition.producers.observe_epoch(producer_id, producer_epoch)
        partition.txn_index.on_marker(producer_id, base, commit)
        return done

    def on_durable(self, chunks: list[IntakeChunk]) -> None:
        """On the event loop, in commit order: where a group commit's appends landed; high watermarks move."""
        self.pressure.written()
        for chunk in chunks:
            part = self.topics.partition_by_id(chunk.topic_id, chunk.partition)
            if part is not None:
                part.add_durable_chunk(chunk)

    def on_not_written(self, refused: list[tuple[uuid.UUID, int, int]]) -> None:
        """A full disk refused these appends (and nothing after them was written): hand their offsets out again."""
        self.pressure.disk_full(len(refused))
        first: dict[tuple[uuid.UUID, int], int] = {}
        for topic_id, partition, base in refused:
            key = (topic_id, partition)
            first[key] = min(first.get(key, base), base)
        for (topic_id, partition), base in first.items():
            part = self.topics.partition_by_id(topic_id, partition)
            if part is not None:
                part.next_offset = max(base, part.high_watermark)
                part.producers.forget_from(part.next_offset)
                part.txn_index.forget_from(part.next_offset)


def _when_durable(original: asyncio.Future[None] | None) -> asyncio.Future[None]:
    """The durability future of a retried batch: the original append's, or done if it predates a restart."""
    if original is not None and not original.cancelled():
        return original
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done
