"""The intake writer: group commit of many partitions' batches into shared, fsync'd intake files.

Appends queue up while the previous group commit is on disk; the next commit takes everything queued
(up to `flush_max_bytes`), writes one frame per partition, fsyncs once and indexes the frames in the
metadata store. Only then are the appends acknowledged and the high watermarks moved.

The active file is allocated ahead of its writes (`preallocate_bytes`, zeros past the last frame): an
fdatasync of data written inside allocated space does not wait on the block allocation an appending
write needs, which on ext4 made the I/O thread's kernel time 2-4x that of the same writes preallocated.
A file is cut to its last frame when the writer rolls past it, and recovery cuts the zero tail as it cuts
a torn one (a zero header is not a frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from icelog.config import IntakeSettings
from icelog.errors import ErrorCode, IcelogError, KafkaApiError, first_line
from icelog.faults import armed
from icelog.log import intake_file
from icelog.log.storage import Append, ChunkLocation, IntakeStats, OnDurable, OnNotWritten
from icelog.meta.store import IntakeChunk, IntakeIndex, IntakeTail

log = logging.getLogger(__name__)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Test hook (faults.py): with ICELOG_TEST_FAULT=intake-enospc, intake writes fail with ENOSPC while a file of
# this name exists next to the intake directory.
ENOSPC_FAULT = "intake-enospc"
# Retrying a group's index commit while the store is unreachable: the first wait, doubling up to the last.
_STORE_RETRY_FIRST_S, _STORE_RETRY_MAX_S = 0.1, 2.0


class NoSpaceError(OSError):
    """An intake write found the disk full: nothing of its group is written (the file is cut back)."""


@dataclass
class _PendingAppend:
    append: Append
    done: asyncio.Future[None] = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.append.payload)


class IntakeFiles:
    """The one reader of intake files (log/storage.ChunkReader), one cached descriptor each, safe to use from
    worker threads; pickled, it carries only its directory (archive tasks read with it in Spark's workers).

    A descriptor is closed only when no read is using it: a file forgotten (deleted by retention) while a
    Fetch reads it on another thread is closed after that read, never under it (a reused descriptor
    number would read another file).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._reading: dict[int, int] = {}  # descriptor -> reads in progress
        self._doomed: set[int] = set()  # descriptors to close when their last read ends
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[IntakeFiles], tuple[Path]]:
        return IntakeFiles, (self.directory,)

    def read(self, chunk: ChunkLocation, offset_in_chunk: int = 0, length: int = -1) -> bytes:
        if length < 0:
            length = chunk.length - offset_in_chunk
        with self._lock:
            fd = self._fds.get(chunk.file_id)
            if fd is None:
                fd = os.open(intake_file.file_path(self.directory, chunk.file_id), os.O_RDONLY)
                self._fds[chunk.file_id] = fd
            self._reading[fd] = self._reading.get(fd, 0) + 1
        try:
            data = os.pread(fd, length, chunk.position + offset_in_chunk)
        finally:
            with self._lock:
                self._reading[fd] -= 1
                if not self._reading[fd]:
                    del self._reading[fd]
                    if fd in self._doomed:
                        self._doomed.discard(fd)
                        os.close(fd)
        if len(data) != length:
            raise KafkaApiError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"intake file {chunk.file_id} is short: wanted {length} bytes at {chunk.position + offset_in_chunk}",
            )
        return data

    def forget(self, file_id: int) -> None:
        with self._lock:
            fd = self._fds.pop(file_id, None)
            if fd is None:
                return
            if fd in self._reading:
                self._doomed.add(fd)
            else:
                os.close(fd)

    def close(self) -> None:
        for file_id in list(self._fds):
            self.forget(file_id)


class IntakeWriter:
    """Appends partitions' batches to the active intake file with group commit."""

    def __init__(
        self,
        directory: Path,
        store: IntakeIndex,
        settings: IntakeSettings,
    ) -> None:
        self.directory = directory
        self.store = store
        self.settings = settings
        self.stats = IntakeStats()
        # Called on the I/O thread after each group commit with (bytes written, appends, fsync seconds): the
        # broker's metrics (icelog/instruments.py IntakeMetrics); None when metrics are off.
        self.on_commit: Callable[[int, int, float], None] | None = None
        self._on_durable: OnDurable = _nothing
        # Appends a full disk refused, as (topic id, partition, base offset): their offsets are handed out again.
        self._on_not_written: OnNotWritten = _nothing
        self._undoing = False  # a full disk refused a group: the I/O thread waits until the loop has undone it
        self._pending: list[_PendingAppend] = []  # guarded by _ready: the loop appends, the I/O thread takes
        self._ready = threading.Condition()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Future[None] | None = None  # ends, raising, should a group commit fail
        self._fd = -1
        self.active_file_id = 0
        self._active_size = 0
        self._allocated = 0  # the active file's size on disk: frames up to _active_size, then zeros
        self._preallocate = settings.preallocate_bytes
        self.failed: BaseException | None = None
        # Why the store cannot index the group being committed (a retriable StoreError), or None: set and cleared
        # by the I/O thread, read by the manager, which refuses appends while it is set.
        self.store_unavailable: str | None = None

    # -- start-up ------------------------------------------------------------------------------
    def recover(self) -> list[IntakeChunk]:
        """Index frames written after the recorded tail, truncate a torn tail, open the active file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = intake_file.list_files(self.directory)
        tail = self.store.intake_tail()
        chunks: list[IntakeChunk] = []
        if not files:
            self._open_active(1 if tail is None else tail.file_id + 1)
            return chunks
        start_file = tail.file_id if tail else files[0]
        end_file, end_pos = files[-1], 0
        for file_id in files:
            if file_id < start_file:
                continue
            path = intake_file.file_path(self.directory, file_id)
            start = tail.position if tail and file_id == tail.file_id else 0
            frames, end, size = intake_file.scan_frames(path, start)
            if end < size:
                if intake_file.is_zero_tail(path, end):
                    log.info("intake file %s: cutting %d preallocated bytes after its frames", path.name, size - end)
                else:
                    log.warning(
                        "intake file %s: torn or corrupt tail at byte %d; truncating %d bytes "
                        "(never acknowledged: acknowledgement waits for fsync)",
                        path.name, end, size - end,
                    )
                with open(path, "r+b") as handle:
                    handle.truncate(end)
                    os.fsync(handle.fileno())
            chunks.extend(
                IntakeChunk(f.topic_id, f.partition, f.base_offset, f.end_offset, file_id, f.payload_position,
                            f.payload_length, f.max_timestamp)
                for f in frames
            )
            end_file, end_pos = file_id, end
        if chunks or tail is None or (end_file, end_pos) != (tail.file_id, tail.position):
            self.store.commit_intake(chunks, IntakeTail(end_file, end_pos))
        if chunks:
            log.info("recovered %d intake frames written after the last indexed position", len(chunks))
        self._open_active(end_file, end_pos)
        return chunks

    def _open_active(self, file_id: int, size: int = 0) -> None:
        path = intake_file.file_path(self.directory, file_id)
        created = not path.exists()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        if created:
            intake_file.fsync_directory(self.directory)
        self.active_file_id = file_id
        self._active_size = size
        self._allocated = os.fstat(self._fd).st_size

    def _allocate(self, end: int) -> None:
        """Make sure the active file is allocated up to `end`, `preallocate_bytes` at a time."""
        if not self._preallocate or end <= self._allocated:
            return
        target = max(end, min(self._allocated + self._preallocate, self.settings.segment_bytes))
        try:
            os.posix_fallocate(self._fd, self._allocated, target - self._allocated)
        except OSError as exc:  # no space for the step, or a file system without fallocate: append instead
            log.warning("intake preallocation stopped (%s); writes append to the file", exc)
            self._preallocate = 0
            return
        self._allocated = target

    def start(self, on_durable: OnDurable, on_not_written: OnNotWritten) -> None:
        """Start the I/O thread; `failure()` ends, raising, should a group commit ever fail."""
        self._on_durable, self._on_not_written = on_durable, on_not_written
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_future()
        self._thread = threading.Thread(target=self._commit_loop, name="intake-io", daemon=True)
        self._thread.start()

    def failure(self) -> asyncio.Future[None]:
        """Ends, raising, should a group commit ever fail (after start())."""
        assert self._task is not None, "start() the writer first"
        return self._task

    # -- appends -------------------------------------------------------------------------------
    def submit(self, append: Append) -> asyncio.Future[None]:
        """Queue batches whose offsets are assigned; the future resolves once they are durable."""
        if self.failed is not None:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"intake writer failed: {self.failed}")
        assert self._loop is not None, "start() the writer first"
        assert append.base_offset >= 0, "local files store batches whose offsets the log assigned"
        done: asyncio.Future[None] = self._loop.create_future()
        self.stats.bytes_submitted += len(append.payload) + intake_file.FRAME_HEADER_SIZE
        with self._ready:
            self._pending.append(_PendingAppend(append, done))
            self._ready.notify()
        return done

    def _commit_loop(self) -> None:
        """The I/O thread: take what is queued, commit it, hand the result to the event loop, repeat.

        The next group starts as soon as the last one is durable, without waiting for the event loop to
        see the completion (the loop may be busy decoding a request), so disk and loop work overlap.
        """
        assert self._loop is not None
        while True:
            with self._ready:
                while (not self._pending or self._undoing) and not self._closing:
                    self._ready.wait()
                if not self._pending or self._undoing:
                    return
                group = self._take_group()
            try:
                chunks = self._write_group(group)
            except NoSpaceError as exc:  # nothing of the group is on disk: refuse it and what follows, go on
                with self._ready:
                    self._undoing = True
                self._loop.call_soon_threadsafe(self._refuse, group, exc)
                continue
            except BaseException as exc:  # disk or store failure: stop accepting, fail waiters
                self._loop.call_soon_threadsafe(self._fail, group, exc)
                return
            self._loop.call_soon_threadsafe(self._complete, group, chunks)

    def _complete(self, group: list[_PendingAppend], chunks: list[IntakeChunk]) -> None:
        """On the event loop, in commit order: index the chunks in memory, then acknowledge."""
        if self.failed is not None:  # an earlier group failed: nothing after it is acknowledged
            self._fail(group, self.failed)
            return
        try:
            self._on_durable(chunks)
        except Exception as exc:  # the in-memory index cannot follow the disk: stop as a failed commit does
            self._fail(group, exc)
            return
        for item in group:
            if not item.done.done():
                item.done.set_result(None)

    def _refuse(self, group: list[_PendingAppend], exc: NoSpaceError) -> None:
        """On the event loop: fail a group a full disk refused, and every append queued after it (their
        offsets follow its offsets), retriably; the manager hands those offsets out again. Then resume."""
        if any(i.append.marker for i in group + self._pending):
            # A transaction marker is not undone (the transaction's state counts it written): stop, as any
            # failed commit does; start-up completes the prepared transaction.
            self._fail(group, exc)
            return
        with self._ready:
            refused, self._pending = group + self._pending, []
            self._undoing = False
            self._ready.notify()
        self._on_not_written([(i.append.topic_id, i.append.partition, i.append.base_offset) for i in refused])
        self.stats.bytes_submitted -= sum(i.size + intake_file.FRAME_HEADER_SIZE for i in refused)
        for item in refused:
            if not item.done.done():
                item.done.set_exception(KafkaApiError(
                    ErrorCode.KAFKA_STORAGE_ERROR, f"the data directory is full ({exc.strerror}); retry later"
                ))

    def _fail(self, group: list[_PendingAppend], exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
            log.critical("intake group commit failed; the broker must restart to recover: %s", exc)
        with self._ready:
            waiting, self._pending = group + self._pending, []
            self._closing = True  # the I/O thread stops after the group it may be writing
            self._ready.notify()
        for item in waiting:
            if not item.done.done():
                item.done.set_exception(KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, "intake write failed"))
        if self._task is not None and not self._task.done():
            self._task.set_exception(exc)

    def _take_group(self) -> list[_PendingAppend]:
        taken = 0
        size = 0
        for item in self._pending:
            if taken and size + item.size > self.settings.flush_max_bytes:
                break
            size += item.size
            taken += 1
        group, self._pending = self._pending[:taken], self._pending[taken:]
        return group

    def _write_group(self, group: list[_PendingAppend]) -> list[IntakeChunk]:
        """On the I/O thread: one frame per partition, one write, one fsync, one index commit."""
        by_partition: dict[tuple[uuid.UUID, int], list[Append]] = {}
        for item in group:
            by_partition.setdefault((item.append.topic_id, item.append.partition), []).append(item.append)
        total = sum(i.size for i in group) + intake_file.FRAME_HEADER_SIZE * len(by_partition)
        if self._active_size > 0 and self._active_size + total > self.settings.segment_bytes:
            self._roll()
        parts: list[bytes | bytearray] = []
        chunks: list[IntakeChunk] = []
        position = self._active_size
        for (topic_id, partition), items in by_partition.items():
            payloads = [i.payload for i in items]  # written as they are, never joined (copied) first
            length = sum(len(p) for p in payloads)
            base, end = items[0].base_offset, items[-1].end_offset
            max_ts = max(i.max_timestamp for i in items)
            parts.append(intake_file.encode_frame(topic_id, partition, base, end, max_ts, payloads))
            parts.extend(payloads)
            position += intake_file.FRAME_HEADER_SIZE
            chunks.append(IntakeChunk(topic_id, partition, base, end, self.active_file_id, position, length, max_ts))
            position += length
        try:
            if armed(ENOSPC_FAULT) and (self.directory.parent / ENOSPC_FAULT).exists():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._allocate(position)
            _write_all(self._fd, parts, self._active_size, total)
            started = time.perf_counter()
            if self.settings.fsync:
                os.fdatasync(self._fd)
            fsync_seconds = time.perf_counter() - started
            self.stats.fsync_seconds += fsync_seconds
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            # Cut what was written of the group (never indexed, never acknowledged): recovery would find
            # whole frames of it, and the next group writes at this position anyway.
            os.ftruncate(self._fd, self._active_size)
            self._allocated = min(self._allocated, self._active_size)
            raise NoSpaceError(exc.errno, exc.strerror) from exc
        self._active_size = position
        self._index(chunks, IntakeTail(self.active_file_id, position))
        self.stats.commits += 1
        self.stats.appends += len(group)
        self.stats.bytes_written += total
        if self.on_commit is not None:
            self.on_commit(total, len(group), fsync_seconds)
        return chunks

    def _index(self, chunks: list[IntakeChunk], tail: IntakeTail) -> None:
        """On the I/O thread: index a group's durable frames. While the store cannot be reached (a networked
        store's database down), retry until it can: the group is neither acknowledged nor undone meanwhile (its
        frames are on disk, and a commit that went unanswered may have been stored), and the manager refuses new
        appends retriably (`store_unavailable`). commit_intake is idempotent, so retrying is safe."""
        delay = _STORE_RETRY_FIRST_S
        while True:
            try:
                self.store.commit_intake(chunks, tail)
            except IcelogError as exc:
                if not exc.retriable or self._closing:  # a shutdown during an outage: recovery indexes the frames
                    raise
                if self.store_unavailable is None:
                    log.warning("refusing produce: the metadata store is unavailable (%s); appends fail retriably "
                                "(NOT_ENOUGH_REPLICAS) until it answers again", first_line(exc))
                self.store_unavailable = first_line(exc)
                time.sleep(delay)
                delay = min(2 * delay, _STORE_RETRY_MAX_S)
                continue
            if self.store_unavailable is not None:
                self.store_unavailable = None
                log.warning("the metadata store answers again: produce resumes")
            return

    def _cut_to_frames(self) -> None:
        """End the active file at its last frame (readers go by the index, but a file's size should too).

        Not fsync'd: should a crash undo the cut, recovery cuts the zero tail again.
        """
        if self._allocated > self._active_size:
            os.ftruncate(self._fd, self._active_size)
            self._allocated = self._active_size

    def _roll(self) -> None:
        self._cut_to_frames()
        os.close(self._fd)
        self._open_active(self.active_file_id + 1)

    async def close(self) -> None:
        """Finish queued commits, then stop."""
        if self._thread is not None:
            with self._ready:
                self._closing = True
                self._ready.notify()
            # The completions the thread queued (call_soon_threadsafe, in order) run before this await returns.
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._fd >= 0:
            if self.failed is None:
                self._cut_to_frames()  # a clean stop leaves no zero tail for recovery to cut
            os.close(self._fd)
            self._fd = -1


_IOV_MAX = 512


def _nothing(_: object) -> None:
    """The writer's hooks before start()."""


def _write_all(fd: int, parts: list[bytes | bytearray], position: int, total: int) -> None:
    """pwritev at `position` in slices under IOV_MAX; a short write raises (recovery truncates the torn frame)."""
    written = 0
    for start in range(0, len(parts), _IOV_MAX):
        written += os.pwritev(fd, parts[start : start + _IOV_MAX], position + written)
    if written != total:  # a regular file writes short only when the disk is full
        raise OSError(errno.ENOSPC, f"short write to intake file: {written} of {total} bytes")
