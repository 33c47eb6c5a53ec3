"""One partition's log: its offsets, its intake chunk index (hot tail in memory, the rest looked up), reads
and long-poll waits."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.producers import ProducerStateTable
from icelog.log.storage import ChunkReader
from icelog.log.transactions import AbortedRange, TxnIndex
from icelog.meta.store import IntakeChunk, IntakeIndex
from icelog.records.batch import batch_max_timestamp, empty_batch, first_record_at_or_after, iter_stored_batches

_PAGE_CHUNKS = 256  # chunk rows looked up from the store at a time (fewer when the cache is smaller)


@dataclass
class _Hot:
    """The newest chunks, in offset order, with their base offsets (appended in place, bases first)."""

    bases: list[int] = field(default_factory=list)
    chunks: list[IntakeChunk] = field(default_factory=list)


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

    def max_timestamp_offset(self, min_offset: int) -> tuple[int, int] | None: ...

    def retention_start(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int | None:
        """The first offset Kafka retention keeps of what the source holds (its cached plan), or None."""
        ...


class PartitionLog:
    """Offsets and data of one topic-partition. Mutated only on the event loop thread.

    The chunk index is bounded: the newest chunks (at most `cache_chunks`) are kept in memory to serve
    appends and readers at the tail; older ones are looked up in the metadata store by offset (every chunk
    in memory is indexed there first) and kept in a bounded LRU of pages. So start-up loads a fixed number
    of rows per partition, whatever the size of the intake.

    `read` may run on a worker thread (Fetch keeps file reads off the event loop): the hot list is only
    appended to or replaced whole (never cut in place), the page cache takes a lock, and the store
    serialises its connection, so a reader sees a consistent view.
    """

    def __init__(
        self,
        topic_id: uuid.UUID,
        partition: int,
        log_start_offset: int,
        high_watermark: int,
        reader: ChunkReader,  # the intake storage
        index: IntakeIndex,  # the durable index older chunks are paged in from
        intake_bytes: int = 0,
        cache_chunks: int = 4096,
        batch_cache_chunks: int = 64,
    ) -> None:
        self.topic_id = topic_id
        self.partition = partition
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark
        self.next_offset = high_watermark  # offsets handed out, durable or not
        self._hot = _Hot()
        self.intake_bytes = intake_bytes  # of every indexed chunk, hot or not
        self._reader = reader
        self._index = index
        self._cache_chunks = max(cache_chunks, 2)
        self._page_chunks = max(1, min(_PAGE_CHUNKS, self._cache_chunks // 4))
        self._pages: OrderedDict[int, list[IntakeChunk]] = OrderedDict()  # first base offset -> page (LRU)
        self._pages_lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []
        self._batch_cache: OrderedDict[int, list[tuple[int, int, int, int]]] = OrderedDict()
        self._batch_cache_chunks = max(batch_cache_chunks, 1)
        self._cache_lock = threading.Lock()  # readers on several worker threads share the cache
        # Older offsets served from elsewhere (the Iceberg archive) plug in here, checked in order.
        self.older_sources: list[OffsetRangeSource] = []
        # Where Kafka retention moved the log start consumers see over the older sources (stored; 0: never).
        self.retention_start_offset = 0
        # Idempotent-producer sequences and transaction state (rebuilt from the intake at start-up).
        self.producers = ProducerStateTable()
        self.txn_index = TxnIndex()
        # Whether this broker serves the partition: always alone; in a cluster, while it holds the leadership
        # (cluster/controller.py), which a fresh PartitionLog is made for each time it is taken.
        self.led = True
        self.leader_epoch = 0  # Kafka's leader epoch: moves with each new leader of a cluster (0: a broker alone)

    # -- writes --------------------------------------------------------------------------------
    def reserve(self, record_count: int) -> int:
        """Hand out the next `record_count` offsets; return the first."""
        base = self.next_offset
        self.next_offset += record_count
        return base

    def add_durable_chunk(self, chunk: IntakeChunk) -> None:
        """Index a chunk that is now durable (and in the store's index) and move the high watermark past it."""
        hot = self._hot
        if len(hot.chunks) >= self._cache_chunks:
            # Keep the newest half (replaced whole: a reader keeps the view it took); the rest is in the store.
            keep = self._cache_chunks // 2
            hot = self._hot = _Hot(hot.bases[-keep:], hot.chunks[-keep:])
        hot.bases.append(chunk.base_offset)  # bases first: a reader bisects them, then indexes chunks
        hot.chunks.append(chunk)
        self.intake_bytes += chunk.length
        if chunk.end_offset > self.high_watermark:
            self.high_watermark = chunk.end_offset
        self.next_offset = max(self.next_offset, self.high_watermark)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def load_tail(self, chunks: list[IntakeChunk]) -> None:
        """Start-up: keep the partition's newest durable chunks (in offset order) in memory."""
        chunks = chunks[-self._cache_chunks :]
        self._hot = _Hot([c.base_offset for c in chunks], list(chunks))
        if chunks:
            self.high_watermark = max(self.high_watermark, chunks[-1].end_offset)
        self.next_offset = max(self.next_offset, self.high_watermark)

    def drop_chunks_before(self, log_start_offset: int, dropped_bytes: int) -> None:
        """Forget chunks wholly below a new log start offset (trimmed from the store, `dropped_bytes` in all)."""
        hot = self._hot
        keep = bisect.bisect_right(hot.chunks, log_start_offset, key=lambda c: c.end_offset)
        # Replaced, not cut in place: a Fetch reading on a worker thread keeps the view it took.
        self._hot = _Hot(hot.bases[keep:], hot.chunks[keep:])
        with self._pages_lock:
            for first in [k for k, page in self._pages.items() if page[-1].end_offset <= log_start_offset]:
                del self._pages[first]
        with self._cache_lock:  # what describes trimmed chunks goes with them
            for base in [b for b in self._batch_cache if b < log_start_offset]:
                del self._batch_cache[base]
        self.intake_bytes = max(self.intake_bytes - dropped_bytes, 0)
        self.log_start_offset = max(self.log_start_offset, log_start_offset)
        self.txn_index.drop_before(self.log_start_offset)

    @property
    def hot_chunks(self) -> list[IntakeChunk]:
        """The chunks held in memory (the newest); older ones come from the store (for tests and status)."""
        return self._hot.chunks

    # -- transactions --------------------------------------------------------------------------
    @property
    def last_stable_offset(self) -> int:
        """read_committed readers (and the archiver) stop here: no open transaction starts below it."""
        return self.txn_index.last_stable_offset(self.high_watermark)

    def aborted_ranges(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """Aborted transactions overlapping [start_offset, end_offset): their records must be skipped."""
        return self.txn_index.aborted_between(start_offset, end_offset)

    # -- reads ---------------------------------------------------------------------------------
    def chunks_from(self, offset: int) -> Iterator[IntakeChunk]:
        """The chunks from the one holding `offset` (or the first) onwards, lazily; safe on a worker thread.

        Chunks below the in-memory tail are paged in from the store (through a bounded cache), so a walk
        holds a page at a time whatever the size of the partition.
        """
        hot = self._hot  # one consistent view (see the class docstring)
        bases, chunks = hot.bases, hot.chunks
        if chunks and offset >= bases[0]:
            yield from chunks[bisect.bisect_right(bases, offset) - 1 :]
            return
        stop = bases[0] if chunks else None
        for chunk in self._older_chunks(offset):
            if stop is not None and chunk.base_offset >= stop:
                break
            yield chunk
        yield from chunks

    def _older_chunks(self, offset: int) -> Iterator[IntakeChunk]:
        """Chunks from the store's index, from the one holding `offset` (or the first) on, page by page."""
        while True:
            page = self._page_holding(offset)
            if not page:
                return
            yield from page[bisect.bisect_right(page, offset, key=lambda c: c.end_offset) :]
            offset = page[-1].end_offset

    def _page_holding(self, offset: int) -> list[IntakeChunk]:
        with self._pages_lock:
            for first, page in self._pages.items():
                if first <= offset < page[-1].end_offset:
                    self._pages.move_to_end(first)
                    return page
        page = self._index.intake_chunks_after(self.topic_id, self.partition, offset, self._page_chunks)
        if page:
            with self._pages_lock:
                self._pages[page[0].base_offset] = page
                while len(self._pages) * self._page_chunks > self._cache_chunks:
                    self._pages.popitem(last=False)
        return page

    @property
    def cached_chunk_rows(self) -> int:
        """Chunk rows in memory now: the hot tail and the cached pages (bounded by about 2 × cache_chunks)."""
        with self._pages_lock:
            return len(self._hot.chunks) + sum(len(page) for page in self._pages.values())

    @property
    def cached_batch_positions(self) -> tuple[int, int]:
        """Chunks whose batch positions are indexed now, and the positions (bounded by batch_cache_chunks)."""
        with self._cache_lock:
            return len(self._batch_cache), sum(len(p) for p in self._batch_cache.values())

    @property
    def visible_start_offset(self) -> int:
        """The log start consumers see: where Kafka retention left it once an older source (the table) holds
        offsets below the intake, else the intake's start.

        It never follows the table's first row: rows an analyst deletes (the first ones too) are skipped by
        reads, as after Kafka log compaction, so a consumer at an offset with no row left is served from the
        next one, never refused. `log_start_offset` stays the intake's own start.
        """
        start = self.log_start_offset
        for source in self.older_sources:
            first = source.start_offset()
            if first is not None and first < start:
                start = min(start, self.retention_start_offset)
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
                out.append(self._reader.read(chunk))
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
                out.append(self._reader.read(chunk, start, end - start))
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
        cached = iter_stored_batches(self._reader.read(chunk))
        with self._cache_lock:
            self._batch_cache[chunk.base_offset] = cached
            if len(self._batch_cache) > self._batch_cache_chunks:
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
        offset = self.log_start_offset
        high_watermark = self.high_watermark
        while True:
            # Only chunks that may hold such a record (max timestamp >= timestamp_ms) are read.
            page = self._index.intake_chunks_by_time(
                self.topic_id, self.partition, offset, timestamp_ms, self._page_chunks
            )
            for chunk in page:
                if chunk.base_offset >= high_watermark:
                    return None
                data = self._reader.read(chunk)
                view = memoryview(data)
                for pos, size, _base, last in iter_stored_batches(view):
                    if last < self.log_start_offset or batch_max_timestamp(view, pos) < timestamp_ms:
                        continue
                    found = first_record_at_or_after(bytes(view[pos : pos + size]), timestamp_ms)
                    if found is not None and found[0] >= self.log_start_offset:
                        return found
            if len(page) < self._page_chunks:
                return None
            offset = page[-1].end_offset

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3), the first on a tie.

        Over the whole visible log: older sources (the table) and the intake; may read files (worker thread).
        """
        found: tuple[int, int] | None = None
        chunk = self._index.intake_max_timestamp_chunk(self.topic_id, self.partition)
        if chunk is not None and chunk.base_offset < self.high_watermark:
            found = self.offset_for_timestamp_in(chunk, chunk.max_timestamp)
        for source in self.older_sources:
            older = source.max_timestamp_offset(self.visible_start_offset)
            if older is not None and (found is None or older[1] >= found[1]):
                found = older  # the table's offsets come first: on a tie it holds the first such record
        return found

    def offset_for_timestamp_in(self, chunk: IntakeChunk, timestamp_ms: int) -> tuple[int, int] | None:
        view = memoryview(self._reader.read(chunk))
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

    def wake_waiters(self) -> None:
        """End every long poll on the partition now (it is no longer served here: they answer what they have)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def waiter_count(self) -> int:
        """Long polls waiting on this partition now (for tests and status)."""
        return len(self._waiters)

    def _forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):  # already taken by add_durable_chunk
            self._waiters.remove(waiter)
