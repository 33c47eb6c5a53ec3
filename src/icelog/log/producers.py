"""Idempotent-producer state of one partition: per producer id, its epoch and last five batches' sequences.

A retried batch (same producer, epoch and sequence range as one of the last five) is answered with its
original offsets instead of being written again; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch
INVALID_PRODUCER_EPOCH. The state is not persisted: at start-up it is rebuilt by replaying the batch
headers of the partition's intake chunks (producer id, epoch and base sequence are stored in every batch).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.batch import BatchAttributes, BatchHeader
from icelog.records.record_format import HEADER, HEADER_SIZE, LOG_OVERHEAD

BATCHES_KEPT = 5  # Kafka's max.in.flight.requests.per.connection limit for idempotence
_SEQUENCE_MODULUS = 1 << 31


@dataclass(slots=True)
class SequencedBatch:
    """Where one idempotent batch landed, so a retry can be answered with the same offsets."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    done: asyncio.Future[None] | None = None  # resolves when the original append is durable


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[SequencedBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_seen: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class StoredBatch(BatchAttributes):
    """The header fields of a stored (offset-assigned) batch that producer state is rebuilt from."""

    base_offset: int
    last_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    position: int
    size: int


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (sequences wrap at 2^31)."""
    return (base_sequence + last_offset_delta) % _SEQUENCE_MODULUS


def iter_stored_headers(data: bytes | memoryview) -> Iterator[StoredBatch]:
    """The headers of each batch in stored bytes."""
    pos = 0
    total = len(data)
    while pos + HEADER_SIZE <= total:
        (base, length, _, _magic, _crc, attributes, last_delta, _bts, _mts, pid, epoch, base_seq, _count) = (
            HEADER.unpack_from(data, pos)
        )
        size = LOG_OVERHEAD + length
        yield StoredBatch(base, base + last_delta, attributes, pid, epoch, base_seq, pos, size)
        pos += size


class ProducerStateTable:
    """Sequence tracking for the idempotent producers writing to one partition (event loop thread only)."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, batches: list[BatchHeader]) -> SequencedBatch | None:
        """Validate the idempotent batches of one append; return the original if it is a retry.

        Raises INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER; nothing is changed either way.
        """
        expected: dict[int, tuple[int, int | None]] = {}  # pid -> (epoch, next sequence) within the request
        for index, batch in enumerate(batches):
            pid = batch.producer_id
            if pid < 0 or batch.is_control:
                continue
            last = last_sequence(batch.base_sequence, batch.last_offset_delta)
            if pid in expected:
                epoch, next_seq = expected[pid]
            else:
                entry = self.entries.get(pid)
                if entry is None:
                    epoch, next_seq = batch.producer_epoch, None
                else:
                    if batch.producer_epoch == entry.epoch:
                        for seen in entry.batches:
                            if seen.first_sequence == batch.base_sequence and seen.last_sequence == last:
                                if index == 0:
                                    return seen
                                raise KafkaApiError(
                                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                    f"producer {pid}: a retried batch follows a new one in one request",
                                )
                    epoch = entry.epoch
                    next_seq = (
                        (entry.batches[-1].last_sequence + 1) % _SEQUENCE_MODULUS if entry.batches else None
                    )
            if batch.producer_epoch < epoch:
                raise KafkaApiError(
                    ErrorCode.INVALID_PRODUCER_EPOCH,
                    f"producer {pid} epoch {batch.producer_epoch} is older than the current epoch {epoch}",
                )
            if batch.producer_epoch > epoch:
                if batch.base_sequence != 0:
                    raise KafkaApiError(
                        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        f"producer {pid}: new epoch {batch.producer_epoch} must start at sequence 0, "
                        f"got {batch.base_sequence}",
                    )
            elif next_seq is not None and batch.base_sequence != next_seq:
                raise KafkaApiError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {pid} epoch {epoch}: expected sequence {next_seq}, got {batch.base_sequence}",
                )
            expected[pid] = (batch.producer_epoch, (last + 1) % _SEQUENCE_MODULUS)
        return None

    def record(
        self, batches: list[BatchHeader], base_offset: int, done: asyncio.Future[None] | None
    ) -> list[SequencedBatch]:
        """Remember the sequences of batches just given offsets (after `check` passed); what was remembered
        (with a sequencing store, `base_offset` is 0 and the caller adds the assigned base once it is known)."""
        offset = base_offset
        remembered: list[SequencedBatch] = []
        for batch in batches:
            if batch.producer_id >= 0 and not batch.is_control:
                remembered.append(self._remember(
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_sequence,
                    last_sequence(batch.base_sequence, batch.last_offset_delta),
                    offset,
                    done,
                ))
            offset += batch.last_offset_delta + 1
        return remembered

    def forget_from(self, offset: int) -> None:
        """Forget batches given offsets from `offset` on (never written: a full disk refused them)."""
        for entry in self.entries.values():
            if entry.batches and entry.batches[-1].base_offset >= offset:
                kept = [b for b in entry.batches if b.base_offset < offset]
                entry.batches.clear()
                entry.batches.extend(kept)

    def observe_epoch(self, producer_id: int, epoch: int) -> None:
        """A transaction marker carries the producer's (possibly bumped) epoch: older epochs are fenced."""
        entry = self.entries.get(producer_id)
        if entry is None:
            self.entries[producer_id] = ProducerEntry(epoch)
        elif epoch > entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()

    def expire(self, max_idle_s: float, keep: Iterable[int] = ()) -> int:
        """Forget producers idle longer than `max_idle_s` (producer id expiration); return how many."""
        cutoff = time.monotonic() - max_idle_s
        kept = set(keep)
        idle = [pid for pid, e in self.entries.items() if e.last_seen < cutoff and pid not in kept]
        for pid in idle:
            del self.entries[pid]
        return len(idle)

    def replay(self, stored: Iterable[StoredBatch]) -> None:
        """Rebuild from stored batches in offset order (start-up)."""
        for batch in stored:
            if batch.producer_id < 0:
                continue
            if batch.is_control:
                self.observe_epoch(batch.producer_id, batch.producer_epoch)
                continue
            self._remember(
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                last_sequence(batch.base_sequence, batch.last_offset - batch.base_offset),
                batch.base_offset,
                None,
            )

    def _remember(
        self, pid: int, epoch: int, first: int, last: int, base_offset: int, done: asyncio.Future[None] | None
    ) -> SequencedBatch:
        entry = self.entries.get(pid)
        if entry is None or epoch > entry.epoch:
            entry = self.entries[pid] = ProducerEntry(epoch)
        sequenced = SequencedBatch(first, last, base_offset, done)
        entry.batches.append(sequenced)
        entry.last_seen = time.monotonic()
        return sequenced
