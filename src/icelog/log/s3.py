"""The object-storage backend of the intake (log/storage.IntakeStorage): one object per commit interval.

Appends gather until `intake.commit_interval_ms` has passed since the last object was cut (or until
`intake.object_max_bytes`): at most one object per interval, and an append after a quiet spell goes at once. The
group becomes one object holding a frame per partition (the intake file format, log/intake_file.py: an operator can
read an object as a file), PUT under `<prefix>/intake/<id, 20 digits>.intake`, then its chunks and the new tail
(the object's id) are committed to the metadata store in one transaction; only then are the appends acknowledged.
So:
- a crash after the PUT and before the commit leaves an object the index never names: it is never served, and the
  next start-up deletes every object past the recorded tail (`recover`);
- up to PUTS_IN_FLIGHT objects are PUT at once (the next interval's object does not wait for a slow PUT); their
  chunks are committed in object order, and nothing after an object that failed is committed;
- a PUT or a commit that fails is retried with backoff for as long as the broker runs; meanwhile `unavailable` says
  why and the log refuses new appends retriably (NOT_ENOUGH_REPLICAS), and nothing of the group is acknowledged;
- retention deletes an object once no indexed chunk references it (`release`: reference counting by the index).

The store is the sequencer (`assigns_offsets = True`): appends come without offsets, each partition's frame holds
its batches numbered from 0 (offsets relative to the chunk), and the commit (IntakeIndex.commit_sequenced, one
transaction) gives each chunk its partition's committed end as base offset. Offsets are handed out only by that
commit, so a crash before it hands out nothing (the object is deleted at the next start), and a crash after it
leaves them taken (the records are served; a producer that retries is deduplicated from the rebuilt producer
state). Reads add the chunk's base offset to each batch's stored offset (log/storage.py); the stored bytes are never
rewritten. A commit whose answer was lost is retried: the store finds the tail already at the object and returns
its chunks as committed (no offset is assigned twice).

boto3 reads the endpoint and credentials the way every AWS tool does (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, profiles); its own retries are off: this module retries, so it can say why.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from icelog.config import IntakeSettings
from icelog.errors import ConfigError, ErrorCode, IcelogError, KafkaApiError, first_line
from icelog.faults import fault_point
from icelog.log import intake_file
from icelog.log.storage import (
    Append,
    Capacity,
    ChunkLocation,
    IntakeReader,
    IntakeStats,
    OnDurable,
    OnNotWritten,
)
from icelog.meta.store import BrokerLease, IntakeChunk, IntakeIndex, IntakeTail
from icelog.records.batch import rebase_offsets, shift_offsets

log = logging.getLogger(__name__)

# Retrying a request or a commit while the store does not answer: the first wait, doubling up to the last.
_RETRY_FIRST_S, _RETRY_MAX_S = 0.1, 2.0
_READ_ATTEMPTS = 5  # a GET that fails this many times in a row fails the read (KAFKA_STORAGE_ERROR)
# Objects PUT at once: the next interval's object goes up while an earlier one is still in flight (commits stay in
# order), so an object that takes longer than the interval to store delays no other's PUT.
PUTS_IN_FLIGHT = 4
# A release looks at the oldest live objects only, at most this many (retention trims partitions from the front, so
# objects are freed roughly oldest first): its cost does not grow with the intake kept.
RELEASE_WINDOW = 1000
KINDS = ("put", "get", "delete", "list")
# A cluster's broker numbers its objects in a range of its own, (node id + 1) << NODE_ID_BITS onwards, so brokers
# sharing a bucket never pick one id, and each recovers (and deletes past its tail) only its own; a broker alone
# (no cluster) numbers them from 1, below every node's range.
NODE_ID_BITS = 40


def id_range(lease: BrokerLease | None) -> tuple[int, int]:
    """The object ids [first, end) a broker numbers its objects in."""
    if lease is None:
        return 0, 1 << NODE_ID_BITS
    first = (lease.node_id + 1) << NODE_ID_BITS
    return first, first + (1 << NODE_ID_BITS)


@dataclass
class RequestStats:
    """What the object store was asked, per kind (put, get, delete, list): the cost a user pays."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))


# Called after each request with (kind, bytes, seconds, failed): the broker's metrics; None when metrics are off.
OnRequest = Callable[[str, int, float, bool], None]


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes) of s3://BUCKET[/PREFIX]."""
    rest = url.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class ObjectStore:
    """One bucket and prefix through boto3, every request counted; picklable (it carries only the URL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = parse_url(url)
        self.stats = RequestStats()
        self.on_request: OnRequest | None = None
        self._client: Any = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[ObjectStore], tuple[str]]:
        return ObjectStore, (self.url,)

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.session.Session().client("s3", config=Config(
                    retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10,
                    s3={"addressing_style": "path"}, max_pool_connections=16,
                ))
            return self._client

    def key(self, object_id: int) -> str:
        name = f"intake/{object_id:020d}.intake"
        return f"{self.prefix}/{name}" if self.prefix else name

    def _request(self, kind: str, size: int, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        failed = True
        result = None
        try:
            result = call()
            failed = False
            return result
        finally:
            if size < 0:  # the answer's size (a whole object read)
                size = len(result) if isinstance(result, bytes) else 0
            seconds = time.perf_counter() - started
            self.stats.requests[kind] += 1
            self.stats.seconds[kind] += seconds
            if failed:
                self.stats.errors[kind] += 1
            else:
                self.stats.bytes[kind] += size
            if self.on_request is not None:
                self.on_request(kind, 0 if failed else size, seconds, failed)

    def put(self, object_id: int, body: bytes) -> None:
        self._request("put", len(body), lambda: self._s3().put_object(
            Bucket=self.bucket, Key=self.key(object_id), Body=body))

    def get(self, object_id: int, position: int, length: int) -> bytes:
        def call() -> bytes:
            whole = length < 0  # the whole object
            answer = self._s3().get_object(Bucket=self.bucket, Key=self.key(object_id), **(
                {} if whole else {"Range": f"bytes={position}-{position + length - 1}"}))
            data: bytes = answer["Body"].read()
            return data

        data: bytes = self._request("get", length, call)
        return data

    def delete(self, object_id: int) -> None:
        self._request("delete", 0, lambda: self._s3().delete_object(Bucket=self.bucket, Key=self.key(object_id)))

    def object_ids(self) -> Iterator[int]:
        """Ids of the intake objects under the prefix, ascending (S3 lists keys in order)."""
        prefix = self.key(0).rsplit("/", 1)[0] + "/"
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._request("list", 0, lambda kw=kwargs: self._s3().list_objects_v2(**kw))  # type: ignore[misc]
            for entry in page.get("Contents", []):
                stem = str(entry["Key"]).rsplit("/", 1)[-1].removesuffix(".intake")
                if stem.isdigit():
                    yield int(stem)
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")


class ObjectReader:
    """The intake reader of object storage (log/storage.IntakeReader): ranged GETs, retried; picklable."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.objects = ObjectStore(url)

    def __reduce__(self) -> tuple[type[ObjectReader], tuple[str]]:
        return ObjectReader, (self.url,)

    def read(self, chunk: ChunkLocation, offset_in_chunk: int = 0, length: int = -1) -> bytes:
        if length < 0:
            length = chunk.length - offset_in_chunk
        if length == 0:
            return b""
        data = _retried_get(self.objects, chunk.file_id, chunk.position + offset_in_chunk, length)
        if len(data) != length:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"intake object {chunk.file_id} is short: wanted {length} bytes")
        return shift_offsets(data, chunk.base_offset)  # stored relative to the chunk

    def close(self) -> None:
        """Nothing to release (boto3's connection pool goes with the reader)."""


def _any_failure(exc: Exception) -> bool:
    """An object store request: any failure (a refused connection, a 5xx, a timeout) may pass on a retry."""
    return True


def _store_outage(exc: Exception) -> bool:
    """A metadata store commit: only an outage is retried (StoreUnavailableError); anything else stops."""
    return isinstance(exc, IcelogError) and exc.retriable


def _retried_get(objects: ObjectStore, object_id: int, position: int, length: int) -> bytes:
    delay = _RETRY_FIRST_S
    for attempt in range(_READ_ATTEMPTS):
        try:
            return objects.get(object_id, position, length)
        except Exception as exc:  # botocore's errors and connection failures alike
            if attempt + 1 == _READ_ATTEMPTS:
                raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                    f"intake object {object_id} cannot be read: {first_line(exc)}") from exc
            time.sleep(delay)
            delay = min(2 * delay, _RETRY_MAX_S)
    raise AssertionError("unreachable")


@dataclass
class _Object:
    """One object on its way: PUT in flight (or done), then committed in id order."""

    object_id: int
    group: list[_Pending]
    chunks: list[IntakeChunk]
    body: bytes
    put: concurrent.futures.Future[None]
    started: float


@dataclass
class _Pending:
    append: Append
    done: asyncio.Future[None] = field(repr=False)
    arrived: float = field(default_factory=time.monotonic)


class ObjectStorage:
    """The intake in an S3 bucket: one object per commit interval, committed to the metadata store, then acked."""

    assigns_offsets = True

    def __init__(self, url: str, index: IntakeIndex, settings: IntakeSettings) -> None:
        self.url = url
        self.objects = ObjectStore(url)
        self._index = index
        self.settings = settings
        self._stats = IntakeStats()
        self.on_commit: Callable[[int, int, float], None] | None = None
        self._failed: BaseException | None = None
        self._unavailable: str | None = None
        self._pending: list[_Pending] = []
        self._ready = threading.Condition()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._task: asyncio.Future[None] | None = None
        self._on_durable: OnDurable | None = None
        self._puts = concurrent.futures.ThreadPoolExecutor(PUTS_IN_FLIGHT, thread_name_prefix="intake-s3-put")
        self._in_flight: collections.deque[_Object] = collections.deque()  # guarded by _ready; oldest first
        self._gathering = True  # the gatherer may still add objects (the committer ends once it stopped and all done)
        self._broken: BaseException | None = None  # the committer's first failure: nothing after it is committed
        # A cluster's broker (set before recover): its own tail and object ids, and the fence of its commits (only
        # partitions it leads are indexed; log/storage.py's Protocol says why the others fail retriably).
        self.lease: BrokerLease | None = None
        self._next_id = 1
        self._committed_id = 0  # the newest object the index names (ids up to it may be released)
        # Committed objects not deleted yet, oldest first (listed once at start-up, then kept: no LIST per release).
        self._live: collections.deque[int] = collections.deque()
        self._live_lock = threading.Lock()
        # The newest objects' bytes, for reads at the tail without a GET (bounded by object_cache_bytes).
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_lock = threading.Lock()

    # -- the Protocol's state -----------------------------------------------------------------
    @property
    def stats(self) -> IntakeStats:
        return self._stats

    @property
    def on_request(self) -> OnRequest | None:
        return self.objects.on_request

    @on_request.setter
    def on_request(self, hook: OnRequest | None) -> None:
        self.objects.on_request = hook

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def unavailable(self) -> str | None:
        return self._unavailable

    # -- start-up -------------------------------------------------------------------------------
    def recover(self) -> list[IntakeChunk]:
        """Delete objects past the recorded tail: PUT before a crash, never committed, so never acknowledged.

        A new store records a tail at once (object 0), so that a later start tells objects it never committed from
        objects of another cluster under the same prefix, which it refuses to touch. A cluster's broker looks only
        at its own range of ids (other brokers' objects are theirs to recover).
        """
        first, end = id_range(self.lease)
        node = self.lease.node_id if self.lease is not None else None
        tail = self._index.intake_tail(node)
        found = [i for i in self.objects.object_ids() if first <= i < end]
        if tail is None:
            if found:
                raise ConfigError(
                    f"intake.url {self.url} holds {len(found)} intake objects the metadata store has never indexed "
                    "(another cluster's, or a store that lost its state): give this broker a prefix of its own")
            tail = IntakeTail(first, 0)
            if self.lease is None:
                self._index.commit_intake([], tail)
            else:
                self._index.commit_sequenced([], tail, self.lease)
        self._committed_id = tail.file_id
        newest = self._committed_id
        for object_id in found:
            newest = max(newest, object_id)
            if object_id > self._committed_id:
                log.warning("deleting intake object %d: written but never committed (never acknowledged)", object_id)
                self.objects.delete(object_id)
            else:
                self._live.append(object_id)
        self._next_id = newest + 1  # never reused: a reader may still hold a deleted object's id
        return []

    def start(self, on_durable: OnDurable, on_not_written: OnNotWritten) -> None:
        self._on_durable = on_durable
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_future()
        self._threads = [threading.Thread(target=self._gather_loop, name="intake-s3-gather", daemon=True),
                         threading.Thread(target=self._commit_loop, name="intake-s3-commit", daemon=True)]
        for thread in self._threads:
            thread.start()

    def failure(self) -> asyncio.Future[None]:
        assert self._task is not None, "start() the storage first"
        return self._task

    # -- appends -------------------------------------------------------------------------------
    def submit(self, append: Append) -> asyncio.Future[None]:
        if self._failed is not None:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"intake storage failed: {self._failed}")
        assert self._loop is not None, "start() the storage first"
        done: asyncio.Future[None] = self._loop.create_future()
        self._stats.bytes_submitted += len(append.payload) + intake_file.FRAME_HEADER_SIZE
        with self._ready:
            self._pending.append(_Pending(append, done))
            self._ready.notify_all()  # the gatherer (the committer waits on the same condition)
        return done

    def _gather_loop(self) -> None:
        """The gathering thread: wait for the interval (or the size cap), make one object, start its PUT."""
        interval = self.settings.commit_interval_ms / 1000
        last_cut = -math.inf
        try:
            while True:
                with self._ready:
                    while (not self._pending or len(self._in_flight) >= PUTS_IN_FLIGHT) and not self._closing:
                        self._ready.wait()
                    if not self._pending or self._broken is not None:
                        return
                    # At most one object per interval, counted from the last one cut (the cost bound), and no
                    # wait beyond it: an append after a quiet interval goes at once (its latency is the PUT and the
                    # commit), and under load objects are cut at the interval's cadence, whatever the client's
                    # pipelining (a producer's 5 requests in flight are answered together, and what it queued
                    # meanwhile must not wait a whole interval more after it arrives).
                    deadline = max(self._pending[0].arrived, last_cut + interval)
                    while not self._closing and self._queued() < self.settings.object_max_bytes:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._ready.wait(left)
                    group = self._take_group()
                    last_cut = time.monotonic()
                made = self._make_object(group)  # outside the lock: appends keep queueing meanwhile
                with self._ready:
                    self._in_flight.append(made)
                    self._ready.notify_all()
        finally:
            with self._ready:
                self._gathering = False
                self._ready.notify_all()

    def _commit_loop(self) -> None:
        """The committing thread: in id order, wait for an object's PUT, commit its chunks, hand it to the loop."""
        assert self._loop is not None
        while True:
            with self._ready:
                while not self._in_flight and self._gathering:
                    self._ready.wait()
                if not self._in_flight:
                    return
                made = self._in_flight[0]
            try:
                if self._broken is not None:  # nothing after a failed object is committed: its offsets follow
                    raise self._broken
                made.put.result()
                fault_point("intake-object-put")  # crash tests: stored, never committed
                self._commit(made)
            except BaseException as exc:  # a shutdown during an outage, or no outage: nothing is acknowledged
                with contextlib.suppress(BaseException):
                    made.put.result()  # (let its PUT end: _closing stops its retries)
                with self._ready:
                    if self._broken is None:
                        self._broken = exc
                    self._closing = True  # stops retries, the gatherer and new objects
                    self._in_flight.popleft()
                    self._ready.notify_all()
                self._loop.call_soon_threadsafe(self._fail, made.group, exc)
                continue  # the objects behind it are failed in turn
            with self._ready:
                self._in_flight.popleft()
                self._ready.notify_all()
            self._loop.call_soon_threadsafe(self._complete, made.group, made.chunks)

    def _queued(self) -> int:
        return sum(len(p.append.payload) for p in self._pending)

    def _take_group(self) -> list[_Pending]:
        taken = size = 0
        for item in self._pending:
            if taken and size + len(item.append.payload) > self.settings.object_max_bytes:
                break
            size += len(item.append.payload)
            taken += 1
        group, self._pending = self._pending[:taken], self._pending[taken:]
        return group

    def _make_object(self, group: list[_Pending]) -> _Object:
        """One object of one frame per partition, its PUT started (retried until it goes through or we stop)."""
        by_partition: dict[tuple[uuid.UUID, int], list[Append]] = {}
        for item in group:
            by_partition.setdefault((item.append.topic_id, item.append.partition), []).append(item.append)
        object_id = self._next_id
        self._next_id += 1
        parts: list[bytes | bytearray] = []
        chunks: list[IntakeChunk] = []
        position = 0
        for (topic_id, partition), items in by_partition.items():
            payloads = [i.payload for i in items]
            length = sum(len(p) for p in payloads)
            end = 0  # offsets relative to the chunk: the commit assigns its base
            for payload in payloads:
                assert isinstance(payload, bytearray), "the log hands its own buffers to the storage"
                end = rebase_offsets(payload, end)
            max_ts = max(i.max_timestamp for i in items)
            parts.append(intake_file.encode_frame(topic_id, partition, 0, end, max_ts, payloads))
            parts.extend(payloads)
            position += intake_file.FRAME_HEADER_SIZE
            chunks.append(IntakeChunk(topic_id, partition, 0, end, object_id, position, length, max_ts))
            position += length
        body = b"".join(parts)
        put = self._puts.submit(self._retry, "the object store", lambda: self.objects.put(object_id, body),
                                _any_failure)
        return _Object(object_id, group, chunks, body, put, time.perf_counter())

    def _commit(self, made: _Object) -> None:
        """Index a stored object's chunks (retried while the metadata store is out), then count it."""
        tail = IntakeTail(made.object_id, len(made.body))
        assigned: list[IntakeChunk] = []

        def sequence() -> None:
            assigned[:] = self._index.commit_sequenced(made.chunks, tail, self.lease)

        self._retry("the metadata store", sequence, _store_outage)
        fault_point("intake-object-committed")  # crash tests: committed, never answered
        made.chunks = assigned
        seconds = time.perf_counter() - made.started
        self._committed_id = made.object_id
        with self._live_lock:
            self._live.append(made.object_id)
        self._remember(made.object_id, made.body)
        self._stats.commits += 1
        self._stats.appends += len(made.group)
        self._stats.bytes_written += len(made.body)
        self._stats.fsync_seconds += seconds
        if self.on_commit is not None:
            self.on_commit(len(made.body), len(made.group), seconds)

    def _retry(self, what: str, call: Callable[[], None], retriable: Callable[[Exception], bool]) -> None:
        """Call until it goes through; meanwhile appends are refused retriably (`unavailable`). A shutdown, or a
        failure that is no outage, ends it (fail-stop: nothing of the group is acknowledged)."""
        delay = _RETRY_FIRST_S
        while True:
            try:
                call()
            except Exception as exc:
                if not retriable(exc) or self._closing:
                    raise
                if self._unavailable is None:
                    log.warning("refusing produce: %s is unavailable (%s); appends fail retriably "
                                "(NOT_ENOUGH_REPLICAS) until it answers again", what, first_line(exc))
                self._unavailable = f"{what} is unavailable ({first_line(exc)})"
                time.sleep(delay)
                delay = min(2 * delay, _RETRY_MAX_S)
                continue
            if self._unavailable is not None:
                self._unavailable = None
                log.warning("%s answers again: produce resumes", what)
            return

    def _complete(self, group: list[_Pending], chunks: list[IntakeChunk]) -> None:
        if self._failed is not None:
            self._fail(group, self._failed)
            return
        assert self._on_durable is not None
        try:
            # Each append's base offset: its chunk's, plus the records of the appends before it in the chunk.
            next_offset = {(c.topic_id, c.partition): c.base_offset for c in chunks}
            for item in group:
                key = (item.append.topic_id, item.append.partition)
                base = next_offset.get(key)
                if base is None:  # not indexed: the partition was deleted, or led by another broker since
                    item.done.set_exception(KafkaApiError(
                        ErrorCode.NOT_LEADER_OR_FOLLOWER, "this broker no longer leads the partition"))
                    continue
                next_offset[key] = base + item.append.end_offset
                if item.append.on_assigned is not None:
                    item.append.on_assigned(base)
            self._on_durable(chunks)
        except Exception as exc:
            self._fail(group, exc)
            return
        for item in group:
            if not item.done.done():
                item.done.set_result(None)

    def _fail(self, group: list[_Pending], exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.critical("intake commit to object storage failed; the broker must restart: %s", exc)
        with self._ready:
            waiting, self._pending = group + self._pending, []
            self._closing = True
            self._ready.notify_all()
        for item in waiting:
            if not item.done.done():
                item.done.set_exception(KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, "intake write failed"))
        if self._task is not None and not self._task.done():
            self._task.set_exception(exc)

    # -- reads, release, capacity ---------------------------------------------------------------
    def _remember(self, object_id: int, body: bytes) -> None:
        limit = self.settings.object_cache_bytes
        if len(body) > limit:
            return
        with self._cache_lock:
            if object_id in self._cache:  # (two readers of one object missed it at once)
                return
            self._cache[object_id] = body
            self._cache_bytes += len(body)
            while self._cache_bytes > limit:
                _, dropped = self._cache.popitem(last=False)
                self._cache_bytes -= len(dropped)

    def read(self, chunk: ChunkLocation, offset_in_chunk: int = 0, length: int = -1) -> bytes:
        if length < 0:
            length = chunk.length - offset_in_chunk
        start = chunk.position + offset_in_chunk
        with self._cache_lock:
            body = self._cache.get(chunk.file_id)
            if body is not None:
                self._cache.move_to_end(chunk.file_id)
        if body is None and length and chunk.position + chunk.length <= self.settings.object_max_bytes:
            # An object this broker did not write (another broker's, before it took the partition over, or one
            # cached before a restart): read whole into the cache once, so a consumer's next fetches from it, and
            # the other partitions' readers of the same object, cost no GET each (an object is cut at
            # object_max_bytes, so this one is not much bigger).
            body = _retried_get(self.objects, chunk.file_id, 0, -1)
            self._remember(chunk.file_id, body)
        if body is not None:
            data = body[start : start + length]
        else:
            data = _retried_get(self.objects, chunk.file_id, start, length) if length else b""
        if len(data) != length:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"intake object {chunk.file_id} is short: wanted {length} bytes at {start}")
        return shift_offsets(data, chunk.base_offset)  # stored relative to the chunk

    def release(self) -> int:
        """Delete committed objects no indexed chunk references any more (every partition in them trimmed): of the
        oldest RELEASE_WINDOW live objects, those the index no longer names. One that cannot be deleted now stays
        live, for the next release."""
        with self._live_lock:
            candidates = list(itertools.islice(self._live, RELEASE_WINDOW))
        in_use = self._index.intake_files_in_use(candidates)
        deleted: set[int] = set()
        try:
            for object_id in (i for i in candidates if i not in in_use):
                with self._cache_lock:
                    body = self._cache.pop(object_id, None)
                    if body is not None:
                        self._cache_bytes -= len(body)
                self.objects.delete(object_id)  # (S3's DELETE is idempotent: two releases at once are harmless)
                deleted.add(object_id)
                log.info("deleted intake object %d: no partition needs it", object_id)
        finally:
            if deleted:
                with self._live_lock:
                    self._live = collections.deque(i for i in self._live if i not in deleted)
        return len(deleted)

    def capacity(self) -> Capacity:
        """Object storage has no free space the broker must watch, and no size."""
        return Capacity(None, None, self.url)

    def reader(self) -> IntakeReader:
        return ObjectReader(self.url)

    async def close(self) -> None:
        """Finish queued commits (a store still down fails them after the current retry), then stop."""
        if self._threads:
            with self._ready:
                self._closing = True
                self._ready.notify_all()
            for thread in self._threads:
                await asyncio.get_running_loop().run_in_executor(None, thread.join)
            self._threads = []
        self._puts.shutdown(wait=True)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
