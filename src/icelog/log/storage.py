"""The log's storage seam: where the intake's record batches are written, read back, recovered and released.

One Protocol for every backend, as the metadata store has one per slice (meta/store.py); the broker, Fetch, the
archive tasks and the transaction-marker reader see only it. The backend is picked in one place (log/backends.py:
`open_storage`, `open_reader`), as tansu picks its `Storage` by URL scheme: local files (log/local.py: group commit
into fsync'd intake files, the default) or object storage (log/s3.py: one object per commit interval).

The write side is a group commit: appends are submitted one at a time, the backend gathers them, stores them
together and indexes them in the metadata store, then reports where each partition's batches landed (the chunks,
in commit order) through `on_durable`. Only then are they acknowledged. Two ways to hand out offsets fit it:
- `assigns_offsets = False` (local files): the log assigns offsets in memory before `submit` (an append carries
  its base offset, patched into its batches); the chunks come back with those offsets.
- `assigns_offsets = True` (object storage: the sequencer): `submit` carries no offsets (`base_offset` -1, the
  batches numbered from 0 and `end_offset` their record count); the metadata store assigns them in the
  transaction that commits the object's batch coordinates (IntakeIndex.commit_sequenced: from each partition's
  committed end), and the backend calls each append's `on_assigned` with its base offset, in commit order, before
  `on_durable` sees the chunks. The stored bytes keep offsets relative to their chunk (0 for its first batch);
  `read` adds the chunk's base offset to the base offset of each batch it returns (bytes 0-7, outside the batch
  CRC), so every reader sees the committed offsets and nothing stored is rewritten.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from icelog.meta.store import IntakeChunk

# On the event loop, in commit order: the chunks one group commit stored and indexed (where each append landed).
OnDurable = Callable[[list[IntakeChunk]], None]
# On the event loop: appends the backend refused without storing anything, as (topic id, partition, base offset);
# their offsets are handed out again (a full disk).
OnNotWritten = Callable[[list[tuple[uuid.UUID, int, int]]], None]


class ChunkLocation(Protocol):
    """Where a chunk's batches lie in the backend: an intake file or object (`file_id`), a position and a length,
    and the offset of its first batch (what a sequencing backend adds to the offsets it stored).
    An indexed `IntakeChunk` and an archive plan's `ChunkRef` are both one."""

    @property
    def file_id(self) -> int: ...

    @property
    def position(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def base_offset(self) -> int: ...


class ChunkReader(Protocol):
    """Reads stored chunks, safe on worker threads (the one chunk read: every reader of the intake uses it)."""

    def read(self, chunk: ChunkLocation, offset_in_chunk: int = 0, length: int = -1) -> bytes:
        """`length` bytes (-1: the rest of the chunk) of a chunk's batches from `offset_in_chunk`; raises
        KafkaApiError(KAFKA_STORAGE_ERROR) when the store holds fewer."""
        ...


class IntakeReader(ChunkReader, Protocol):
    """A reader of its own for another process (the archiver, its Spark tasks): picklable, so it holds only where
    the intake is and opens what it reads on first use in each process."""

    def close(self) -> None:
        """Release open files or connections (the reader may be used again: it reopens them)."""
        ...


@dataclass(frozen=True)
class Append:
    """One partition's record batches queued for a group commit."""

    topic_id: uuid.UUID
    partition: int
    payload: bytes | bytearray
    base_offset: int  # -1 when the backend assigns offsets at commit (the batches are numbered from 0)
    end_offset: int  # exclusive; the record count when base_offset is -1
    max_timestamp: int
    marker: bool = False  # a transaction marker (its transaction's state already counts it written)
    # A sequencing backend calls it on the event loop with the base offset the store assigned, before `on_durable`.
    on_assigned: Callable[[int], None] | None = field(default=None, compare=False)


@dataclass
class IntakeStats:
    """Counters for benchmarks, metrics and `icelog status`."""

    commits: int = 0
    appends: int = 0
    bytes_written: int = 0
    fsync_seconds: float = 0.0
    bytes_submitted: int = 0  # queued (framing included), written or not: the free-space estimate's debit


@dataclass(frozen=True)
class Capacity:
    """What the backend can still take: `free_bytes` None means no bound the broker must watch (object storage).
    `location` names where the intake is (a directory, or the s3:// URL); `total_bytes` None: no size known."""

    free_bytes: int | None
    total_bytes: int | None = None
    location: str = ""


class IntakeStorage(ChunkReader, Protocol):
    """A backend of the intake: group commit, reads, recovery, release of what retention frees, capacity."""

    assigns_offsets: bool
    # Called on the committing thread after each group commit with (bytes written, appends, seconds waiting for
    # durability): the broker's metrics (instruments.IntakeMetrics); None when metrics are off.
    on_commit: Callable[[int, int, float], None] | None
    # Called after each request to a remote store with (kind, bytes, seconds, failed): put, get, delete, list (the
    # cost a user pays). Local files make none.
    on_request: Callable[[str, int, float, bool], None] | None

    @property
    def stats(self) -> IntakeStats:
        """What the backend wrote so far (the free-space estimate and the metrics read it)."""
        ...

    @property
    def failed(self) -> BaseException | None:
        """Why the backend stopped for good (fail-stop: the broker must restart), or None."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why appends are refused retriably right now (the metadata store or the object store does not answer)."""
        ...

    def recover(self) -> list[IntakeChunk]:
        """After a crash: index what was stored but not indexed, remove what can never be served; before start."""
        ...

    def start(self, on_durable: OnDurable, on_not_written: OnNotWritten) -> None:
        """Start committing (on the running event loop)."""
        ...

    def submit(self, append: Append) -> asyncio.Future[None]:
        """Queue an append; the future resolves once it is stored and indexed (after `on_durable` saw its chunk)."""
        ...

    def failure(self) -> asyncio.Future[None]:
        """A future that ends, raising, should a group commit fail for good (started backends only)."""
        ...

    def release(self) -> int:
        """Delete stored files or objects no indexed chunk references any more (after trims); how many."""
        ...

    def capacity(self) -> Capacity:
        """Free space now (may do I/O: call it off the event loop)."""
        ...

    def reader(self) -> IntakeReader:
        """A reader of this backend for other processes (the archiver and its Spark tasks)."""
        ...

    async def close(self) -> None:
        """Finish queued commits, then stop."""
        ...
