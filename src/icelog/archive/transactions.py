"""Which offsets the archiver may write: the last stable offset and aborted ranges of each partition.

Only committed records are archived (Bufstream: "each archive file will contain committed messages").
Records at or past the last stable offset wait; records of aborted transactions are dropped (their offsets
still count as archived). Two ways to know, one per `archive.read_via`:
- `TransactionTracker` (files): the archiver shares the broker's disk, so it rebuilds the broker's
  per-partition transaction index (log/transactions.TxnIndex) from the intake itself, incrementally: batch
  headers and the markers of control batches, in offset order. Archives carry their aborted ranges.
- `BrokerTransactions` (kafka): the archiver may run on another machine. It asks the broker for each
  partition's last stable offset (ListOffsets, read_committed); the tasks' read_committed Fetches name the
  aborted transactions and drop their batches (archive/intake_source.KafkaFetch), as a Kafka consumer does.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from icelog.client.cluster import SourceCluster
from icelog.client.properties import ClientProperties
from icelog.log.producers import iter_stored_headers
from icelog.log.storage import ChunkReader
from icelog.log.transactions import MARKER_COMMIT, AbortedRange, TxnIndex, marker_type
from icelog.meta.store import IntakeChunk, PartitionRecord, TopicRecord


@dataclass
class _PartitionTxns:
    index: TxnIndex = field(default_factory=TxnIndex)
    scanned_through: int = -1  # the offset after the last batch replayed into the index


class TransactionView(Protocol):
    """The archiver's view of a topic's transactions, refreshed once per pass before planning."""

    def refresh(self, topic: TopicRecord, chunks_by_partition: Mapping[int, Sequence[IntakeChunk]]) -> None: ...

    def stable_offset(self, topic: TopicRecord, partition: PartitionRecord) -> int: ...

    def aborted(self, topic_id: uuid.UUID, partition: int, start: int, end: int) -> list[AbortedRange]: ...

    def close(self) -> None: ...


class BrokerTransactions:
    """Last stable offsets from the broker (ListOffsets, read_committed) through one client the topics' threads
    share; aborted ranges are the tasks' business (their Fetches are read_committed), so none are planned."""

    def __init__(self, bootstrap: Sequence[str], properties: ClientProperties) -> None:
        self._cluster = SourceCluster(bootstrap, properties)
        self._lock = threading.Lock()
        self._stable: dict[uuid.UUID, dict[int, int]] = {}

    def refresh(self, topic: TopicRecord, chunks_by_partition: Mapping[int, Sequence[IntakeChunk]]) -> None:
        with self._lock:
            self._stable[topic.topic_id] = self._cluster.stable_offsets(topic.name, sorted(chunks_by_partition))

    def stable_offset(self, topic: TopicRecord, partition: PartitionRecord) -> int:
        """The broker's answer at the last refresh (nothing of a partition it was not asked about)."""
        return self._stable.get(topic.topic_id, {}).get(partition.partition, partition.log_start_offset)

    def aborted(self, topic_id: uuid.UUID, partition: int, start: int, end: int) -> list[AbortedRange]:
        return []

    def close(self) -> None:
        with self._lock:
            self._cluster.close()


class TransactionTracker:
    """Per-partition TxnIndex kept up to date from intake chunks (the archiver's stable-offset hook)."""

    def __init__(self, reader: ChunkReader) -> None:
        self.reader = reader  # the intake's own reader (log/backends.open_reader)
        self._partitions: dict[tuple[uuid.UUID, int], _PartitionTxns] = {}

    def refresh(self, topic: TopicRecord, chunks_by_partition: Mapping[int, Sequence[IntakeChunk]]) -> None:
        for partition, chunks in chunks_by_partition.items():
            self.update(topic.topic_id, partition, chunks)

    def close(self) -> None:
        pass

    def update(self, topic_id: uuid.UUID, partition: int, chunks: Sequence[IntakeChunk]) -> None:
        """Replay the batches of `chunks` (offset order) that the index has not seen yet."""
        state = self._partitions.setdefault((topic_id, partition), _PartitionTxns())
        if chunks and state.scanned_through < chunks[0].base_offset:
            # First look, or intake before what we saw is gone: start over from what is kept.
            state.index = TxnIndex()
            state.scanned_through = chunks[0].base_offset
        for chunk in chunks:
            if chunk.end_offset <= state.scanned_through:
                continue
            data = self.reader.read(chunk)
            for batch in iter_stored_headers(data):
                if batch.base_offset < state.scanned_through:
                    continue
                marker = marker_type(data, batch.position) if batch.is_control else None
                if batch.is_control:
                    if marker is not None:
                        state.index.on_marker(batch.producer_id, batch.base_offset, marker == MARKER_COMMIT)
                else:
                    state.index.on_data(batch.producer_id, batch.base_offset, batch.is_transactional)
                state.scanned_through = batch.last_offset + 1
        if chunks:
            state.index.drop_before(chunks[0].base_offset)  # aborted ranges the intake no longer holds

    def stable_offset(self, topic: TopicRecord, partition: PartitionRecord) -> int:
        """The last stable offset (the high watermark when no transaction is open)."""
        state = self._partitions.get((topic.topic_id, partition.partition))
        if state is None:
            return partition.high_watermark
        return state.index.last_stable_offset(min(partition.high_watermark, max(state.scanned_through, 0)))

    def aborted(self, topic_id: uuid.UUID, partition: int, start: int, end: int) -> list[AbortedRange]:
        state = self._partitions.get((topic_id, partition))
        return [] if state is None else state.index.aborted_between(start, end)

