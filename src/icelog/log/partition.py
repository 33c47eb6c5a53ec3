"""One partition's log in memory: its offsets, its indexed intake chunks, reads and long-poll waits."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.batch import batch_max_timestamp, empty_batch, first_record_at_or_after, iter_stored_batches
from icelog.log.producers import ProducerStateTable
from icelog.log.transactions import AbortedRange, TxnIndex
from icelog.meta.store import IntakeChunk

_BATCH_CACHE_CHUNKS = 64


class ChunkReader(Protocol):
    """Reads stored bytes of a chunk (the intake files, or later an archive)."""

    def read_chunk(self, chunk: IntakeChunk) -> bytes: ...

    def read_range(self, chunk: IntakeChunk, offset_in_chunk: int, length: int) -> bytes: ...


class OffsetRangeSource(Protocol):
    """A source of record batches for offsets below the intake (the Iceberg table, readback/source.py).

    `start_offset`/`end_offset` answer from memory (the event loop asks them); `read` and
    `offset_for_timestamp` may do I/O and run on worker threads. `read` returns whole batches from the
    one holding `offset` (or the next one present), at least one if any, and [] past its end.
    """

    def start_offset(self) -> int | None: ...

    def end_offset(self) -> int | None: ...

    def read(self, offset: int, max_bytes: int) -> list[bytes]: ...

    def offset_for_timestamp(self, timestamp_ms: int, min_offset: int) -> tuple[int, int] | None: ...

    def retention_start(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int | None:
        """The first offset Kafka retention keeps of what the source holds (its cached plan), or None."""
        ...


class PartitionLog:
    """Offsets and data of one topic-partition. Mutated only on the event loop thread.

    `read` may run on a worker thread (Fetch keeps file reads off the event loop): the chunk lists are
    only appended to or replaced whole (never cut in place), so a reader sees a consistent pair.
    """

    def __init__(
        self,
        topic_id: uuid.UUID,
        partition: int,
        log_start_offset: int,
        high_watermark: int,
        reader: ChunkReader,
    ) -> None:
        self.topic_id = topic_id
        self.partition = partition
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark
        self.next_offset = high_watermark  # offsets handed out, durable or not
        self.chunks: list[IntakeChunk] = []
        self._bases: list[int] = []
        self.intake_bytes = 0
        self._reader = reader
        self._waiters: list[asyncio.Future[None]] = []
        self._batch_cache: OrderedDict[int, list[tuple[int, int, int, int]]] = OrderedDict()
        self._cache_lock = threading.Lock()  # readers on several worker threads share the cache
        # Older offsets served from elsewhere (the Iceberg archive) plug in here, checked in order.
        self.older_sources: list[OffsetRangeSource] = []
        # Where Kafka retention moved the log start consumers see over the older sources (stored; 0: never).
        self.retention_start_offset = 0
        # Idempotent-producer sequences and transaction state (rebuilt from the intake at start-up).
        self.producers = ProducerStateTable()
        self.txn_index = TxnIndex()

    # -- writes --------------------------------------------------------------------------------
    def reserve(self, record_count: int) -> int:
        """Hand out the next `record_count` offsets; return the first."""
        base = self.next_offset
        self.next_offset += record_count
        return base

    def add_durable_chunk(self, chunk: IntakeChunk) -> None:
        """Index a chunk that is now durable and move the high watermark past it."""
        self._bases.append(chunk.base_offset)  # bases first: a reader bisects them, then indexes chunks
        self.chunks.append(chunk)
        self.intake_bytes += chunk.length
        if chunk.end_offset > self.high_watermark:
            self.high_watermark = chunk.end_offset
        self.next_offset = max(self.next_offset, self.high_watermark)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def load_chunks(self, chunks: list[IntakeChunk]) -> None:
        """Start-up: index the partition's durable chunks (in offset order) in one step."""
        if not chunks:
            return
        self._bases = self._bases + [c.base_offset for c in chunks]
        self.chunks = self.chunks + chunks
        self.intake_bytes += sum(c.length for c in chunks)
        self.high_watermark = max(self.high_watermark, chunks[-1].end_offset)
        self.next_offset = max(self.next_offset, self.high_watermark)

    def drop_chunks_before(self, log_start_offset: int, on_drop: Callable[[IntakeChunk], None]) -> None:
        """Forget chunks wholly below a new log start offset."""
        keep = 0
        while keep < len(self.chunks) and self.chunks[keep].end_offset <= log_start_offset:
            on_drop(self.chunks[keep])
            self.intake_bytes -= self.chunks[keep].length
            keep += 1
        # Replaced, not cut in place: a Fetch reading on a worker thread keeps the lists it took.
        self.chunks = self.chunks[keep:]
        self._bases = self._bases[keep:]
        self.log_start_offset = max(self.log_start_offset, log_start_offset)
        self.txn_index.drop_before(self.log_start_offset)

    # -- transactions --------------------------------------------------------------------------
    @property
    def last_stable_offset(self) -> int:
        """read_committed readers (and the archiver) stop here: no open transaction starts below it."""
        return self.txn_index.last_stable_offset(self.high_watermark)

    def aborted_ranges(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """Aborted transactions overlapping [start_offset, end_offset): their records must be skipped."""
        return self.txn_index.aborted_between(start_offset, end_offset)

    # -- reads ---------------------------------------------------------------------------------
    def chunks_from(self, offset: int) -> list[IntakeChunk]:
        """The chunks from the one holding `offset` (or the first) onwards; safe on a worker thread."""
        bases, chunks = self._bases, self.chunks  # one consistent view (see the class docstring)
        return chunks[max(bisect.bisect_right(bases, offset) - 1, 0) :]

    @property
    def visible_start_offset(self) -> int:
        """The log start consumers see: the first offset an older source (the table) holds, else the intake's.

        `log_start_offset` stays the intake's own start (what retention trimmed the intake to).
        """
        start = self.log_start_offset
        for source in self.older_sources:
            first = source.start_offset()
            if first is not None and first < start:
                start = max(first, self.retention_start_offset)
        return start

    def check_fetch_offset(self, offset: int) -> None:
        """Raise OFFSET_OUT_OF_RANGE unless visible log start <= offset <= high watermark."""
        start = self.visible_start_offset
        if offset < start or offset > self.high_watermark:
            raise KafkaApiError(
                ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is outside [{start}, {self.high_watermark}]"
            )

    def read(self, offset: int, max_bytes: int, upper_offset: int | None = None) -> list[bytes]:
        """Whole record batches from the one containing `offset`, about `max_bytes` in all.

        At least one batch is returned when any exists, even if larger than max_bytes (as Kafka does).
        Only the bytes returned are read from disk: a chunk's batch positions are indexed on first use.
        """
        self.check_fetch_offset(offset)
        if offset < self.log_start_offset:
            for source in self.older_sources:  # below the intake: the table holds these offsets
                batches = source.read(offset, max_bytes)
                if batches:
                    return batches
            # No record left there (rows deleted from the table): an empty batch moves the consumer on
            # to where the intake goes on.
            gap = empty_batch(offset, self.log_start_offset - 1)
            offset = self.log_start_offset
        else:
            gap = b""
        limit = self.high_watermark if upper_offset is None else upper_offset
        out: list[bytes] = [gap] if gap else []
        size = len(gap)
        for chunk in self.chunks_from(offset):
            if chunk.base_offset >= limit or size >= max_bytes:
                break
            if chunk.end_offset <= offset:
                continue
            if chunk.base_offset >= offset and chunk.end_offset <= limit and size + chunk.length <= max_bytes:
                out.append(self._reader.read_chunk(chunk))
                size += chunk.length
                continue
            start = end = -1
            full = False
            for pos, batch_size, base, last in self._batch_positions(chunk):
                if last < offset:
                    continue
                if base >= limit or (size > 0 and size + batch_size > max_bytes):
                    full = True
                    break
                if start < 0:
                    start = pos
                end = pos + batch_size
                size += batch_size
            if start >= 0:
                out.append(self._reader.read_range(chunk, start, end - start))
            if full:
                break
        return out

    def _batch_positions(self, chunk: IntakeChunk) -> list[tuple[int, int, int, int]]:
        """(position, size, base offset, last offset) of each batch in a chunk, cached (LRU)."""
        with self._cache_lock:
            cached = self._batch_cache.get(chunk.base_offset)
            if cached is not None:
                self._batch_cache.move_to_end(chunk.base_offset)
                return cached
        cached = iter_stored_batches(self._reader.read_chunk(chunk))
        with self._cache_lock:
            self._batch_cache[chunk.base_offset] = cached
            if len(self._batch_cache) > _BATCH_CACHE_CHUNKS:
                self._batch_cache.popitem(last=False)
        return cached

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with a timestamp >= timestamp_ms, or None.

        Older sources (the table) first, then the intake; may read files, so call it off the event loop.
        """
        for source in self.older_sources:
            found = source.offset_for_timestamp(timestamp_ms, self.visible_start_offset)
            if found is not None:
                return found
        for chunk in self.chunks:
            if chunk.max_timestamp < timestamp_ms or chunk.end_offset <= self.log_start_offset:
                continue
            data = self._reader.read_chunk(chunk)
            view = memoryview(data)
            for pos, size, _base, last in iter_stored_batches(view):
                if last < self.log_start_offset or batch_max_timestamp(view, pos) < timestamp_ms:
                    continue
                found = first_record_at_or_after(bytes(view[pos : pos + size]), timestamp_ms)
                if found is not None and found[0] >= self.log_start_offset:
                    return found
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3)."""
        best: tuple[int, int] | None = None
        for chunk in self.chunks:
            if best is None or chunk.max_timestamp > best[1]:
                found = self.offset_for_timestamp_in(chunk, chunk.max_timestamp)
                if found is not None:
                    best = found
        return best

    def offset_for_timestamp_in(self, chunk: IntakeChunk, timestamp_ms: int) -> tuple[int, int] | None:
        view = memoryview(self._reader.read_chunk(chunk))
        for pos, size, _base, _last in iter_stored_batches(view):
            if batch_max_timestamp(view, pos) >= timestamp_ms:
                return first_record_at_or_after(bytes(view[pos : pos + size]), timestamp_ms)
        return None

    # -- long polls ----------------------------------------------------------------------------
    def data_waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time the high watermark moves; cancel it when no longer needed.

        A cancelled (or otherwise finished) waiter leaves the list at once, so long polls on an idle
        partition do not pile up.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        waiter.add_done_callback(self._forget_waiter)
        return waiter

    @property
    def waiter_count(self) -> int:
        """Long polls waiting on this partition now (for tests and status)."""
        return len(self._waiters)

    def _forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):  # already taken by add_durable_chunk
            self._waiters.remove(waiter)
