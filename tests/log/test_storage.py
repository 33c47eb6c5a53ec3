"""The intake storage protocol's behaviour (log/storage.py), once per backend: local files and object storage
(a real SeaweedFS). Driven through LogManager, as the broker drives it: what a producer is acknowledged is read back,
after a restart too; one object per commit interval holds every partition; retention releases what no partition
needs; a crash between the object's PUT and its commit serves nothing of it; a store that is down holds produce
unacknowledged and refuses new appends retriably, then resumes.
"""

from __future__ import annotations

import asyncio
import pickle
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from icelog.config import IntakeSettings, Settings
from icelog.errors import ConfigError, ErrorCode, KafkaApiError
from icelog.log.backends import open_reader
from icelog.log.manager import LogManager
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import BrokerLease, IntakeChunk, IntakeTail
from tests.log.test_intake_recovery import TOPIC, append, read_all, records, values
from tests.support.seaweedfs import BUCKET, SeaweedFS

BACKENDS = ["local", "s3"]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    store = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    yield store
    store.discard()


class Backend:
    """Settings for one backend; the metadata store lives outside the data dir, so the dir can be deleted."""

    def __init__(self, kind: str, root: Path, store: SeaweedFS | None) -> None:
        self.kind, self.root, self.store = kind, root, store
        self.prefix = f"t-{uuid.uuid4().hex[:12]}"
        self.data_dir = root / "data"
        self.meta_path = root / "meta.db"

    def settings(self, **intake: object) -> Settings:
        if self.kind == "s3":
            intake = {"url": f"s3://{BUCKET}/{self.prefix}", "commit_interval_ms": 50, **intake}
        return Settings(data_dir=self.data_dir, meta_url=f"sqlite:///{self.meta_path}",  # no archive: the intake alone
                        archive={"enabled": False, "default_kind": "none"},  # type: ignore[arg-type]
                        intake=IntakeSettings(fsync=False, **intake))  # type: ignore[arg-type]

    def objects(self) -> list[str]:
        assert self.store is not None
        return self.store.keys(f"{self.prefix}/intake/")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    store: SeaweedFS | None = None
    if request.param == "s3":
        store = request.getfixturevalue("bucket")
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
    return Backend(request.param, tmp_path, store)


def run(settings: Settings, body, store: SqliteStore | None = None) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        logs = LogManager(settings, store or SqliteStore(Path(settings.meta_url.removeprefix("sqlite:///"))))
        logs.open()
        logs.start()
        try:
            await body(logs)
        finally:
            await logs.close()

    asyncio.run(main())


def test_acknowledged_appends_of_many_partitions_read_back_after_a_restart(backend: Backend) -> None:
    settings = backend.settings()
    acked: dict[int, list[bytes]] = {0: [], 1: []}

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 2, {})
        for n in range(3):
            sent = await asyncio.gather(*(append(logs, [f"p{p}-{n}-{i}".encode() for i in range(3)], p)
                                          for p in (0, 1)))
            assert sent == [3 * n, 3 * n]
            for p in (0, 1):
                acked[p] += [f"p{p}-{n}-{i}".encode() for i in range(3)]
        for p in (0, 1):
            assert values(read_all(logs, p)) == acked[p]

    run(settings, write)
    if backend.kind == "s3":  # nothing of the intake is on the broker's disk
        assert not (backend.data_dir / "intake").exists()
        shutil.rmtree(backend.data_dir, ignore_errors=True)

    async def again(logs: LogManager) -> None:
        for p in (0, 1):
            assert values(read_all(logs, p)) == acked[p]
        assert await append(logs, [b"next"], 1) == 9, "offsets continue after the last acknowledged one"
        _, part = logs.partition(TOPIC, 1)
        chunk = next(iter(part.chunks_from(0)))
        reader = pickle.loads(pickle.dumps(open_reader(settings)))  # as archive tasks get it in Spark's workers
        assert reader.read(chunk) == logs.storage.read(chunk)

    run(settings, again)


def test_one_object_per_commit_interval_holds_every_partition(backend: Backend) -> None:
    if backend.kind != "s3":
        pytest.skip("one object per commit interval is the object store's layout (local files group by load)")
    settings = backend.settings(commit_interval_ms=1000)

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 13, {})
        # After a quiet spell an append goes at once; the next interval's appends wait for the interval's end.
        await append(logs, [b"first"], 12)
        before = logs.storage.stats.commits
        assert before == 1
        await asyncio.gather(*(append(logs, [f"v{p}".encode()], p) for p in range(12)))
        assert logs.storage.stats.commits - before == 1, "twelve partitions' appends of one interval: one PUT"
        for p in range(12):
            assert values(read_all(logs, p)) == [f"v{p}".encode()]

    run(settings, write)
    assert len(backend.objects()) == 2


def test_deleting_a_topic_releases_what_no_partition_needs(backend: Backend) -> None:
    settings = backend.settings()

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        logs.create_topic("kept", 1, {})
        await append(logs, [b"gone"])
        state, part = logs.partition("kept", 0)
        await append(logs, [b"a"])
        await logs.append(state, part, records([b"kept"], int(time.time() * 1000)))[1]  # (within retention.ms)
        await append(logs, [b"b"])
        logs.delete_topic(TOPIC)
        logs.enforce_retention()  # the retention pass releases what the deleted topic held (off the event loop)
        assert logs.store.intake_chunks() and all(c.topic_id == state.record.topic_id
                                                  for c in logs.store.intake_chunks())
        assert values(read_all_of(logs, "kept")) == [b"kept"]

        if backend.kind == "s3":
            assert len(backend.objects()) == 1, "only the object holding the kept topic's batch is left"

    run(settings, write)


def read_all_of(logs: LogManager, topic: str) -> list[tuple[int, bytes]]:
    _, part = logs.partition(topic, 0)
    from tests.log.test_intake_recovery import MemoryRecords  # the same decoding as read_all

    out = []
    for data in part.read(part.log_start_offset, 1 << 20):
        batches = MemoryRecords(data)
        while (batch := batches.next_batch()) is not None:
            out += [(r.offset, r.value) for r in batch]
    return out


class CrashBeforeIndex(SqliteStore):
    """The object (or frame) is stored, then the process dies before the index commit names it."""

    crash = False

    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        if self.crash:
            raise OSError("simulated crash between the PUT and the index commit")
        super().commit_intake(chunks, tail)

    def commit_sequenced(
        self, chunks: Iterable[IntakeChunk], tail: IntakeTail, leader: BrokerLease | None = None
    ) -> list[IntakeChunk]:
        if self.crash:
            raise OSError("simulated crash between the PUT and the index commit")
        return super().commit_sequenced(chunks, tail, leader)


class CrashAfterIndex(SqliteStore):
    """The index commit (the sequencer's, for object storage) goes through, then the process dies before the
    producer is answered."""

    crash = False

    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        super().commit_intake(chunks, tail)
        if self.crash:
            raise OSError("simulated crash after the index commit, before the answer")

    def commit_sequenced(
        self, chunks: Iterable[IntakeChunk], tail: IntakeTail, leader: BrokerLease | None = None
    ) -> list[IntakeChunk]:
        assigned = super().commit_sequenced(chunks, tail, leader)
        if self.crash:
            raise OSError("simulated crash after the index commit, before the answer")
        return assigned


def test_a_crash_between_store_and_commit_loses_nothing_acknowledged(backend: Backend) -> None:
    settings = backend.settings()
    store = CrashBeforeIndex(backend.meta_path)

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        assert await append(logs, [b"acked-0", b"acked-1"]) == 0
        store.crash = True
        with pytest.raises(KafkaApiError) as failed:
            await append(logs, [b"never-acked"])
        assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        with pytest.raises(OSError, match="simulated crash"):
            await logs.storage.failure()

    run(settings, write, store)
    if backend.kind == "s3":
        assert len(backend.objects()) == 2, "the PUT went through; the index never named the object"

    async def again(logs: LogManager) -> None:
        got = values(read_all(logs))
        assert got[:2] == [b"acked-0", b"acked-1"]
        if backend.kind == "s3":  # an uncommitted object is never served, and is deleted
            assert got == [b"acked-0", b"acked-1"]
            assert len(backend.objects()) == 1
        else:  # local files: a whole, fsync'd frame is indexed by recovery (never acknowledged, still durable)
            assert got == [b"acked-0", b"acked-1", b"never-acked"]
        next_offset = len(got)
        assert await append(logs, [b"after"]) == next_offset
        assert values(read_all(logs))[-1] == b"after"

    run(settings, again)


def test_a_store_that_is_down_holds_produce_unacknowledged_then_resumes(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    try:
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
        backend = Backend("s3", tmp_path, store)

        async def write(logs: LogManager) -> None:
            logs.create_topic(TOPIC, 1, {})
            assert await append(logs, [b"before"]) == 0
            store.stop()
            state, part = logs.partition(TOPIC, 0)
            _, held = logs.append(state, part, records([b"held"]))
            while logs.storage.unavailable is None:
                await asyncio.sleep(0.05)
            with pytest.raises(KafkaApiError) as refused:
                logs.append(state, part, records([b"refused"]))
            assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS and refused.value.retriable
            assert "object store is unavailable" in refused.value.message
            assert not held.done() and part.high_watermark == 1
            await asyncio.to_thread(store.start)
            await held
            assert logs.storage.unavailable is None
            assert await append(logs, [b"after"]) == 2
            assert values(read_all(logs)) == [b"before", b"held", b"after"]

        run(backend.settings(), write)
    finally:
        store.discard()


def test_retention_releases_objects_once_every_partition_in_them_is_trimmed(backend: Backend) -> None:
    """An object (or file) shared by partitions is deleted only when none of them needs it any more."""
    settings = backend.settings(segment_bytes=1)  # local files: a file per group commit, as objects are
    old = 1_000_000_000_000  # 2001: far past retention.ms

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 2, {"retention.ms": "3600000"})
        for n in range(3):  # three commits, each holding both partitions' expired records
            await asyncio.gather(*(logs.append(*logs.partition(TOPIC, p), records([f"old-{n}".encode()], old))[1]
                                   for p in (0, 1)))
        state, part = logs.partition(TOPIC, 0)
        await logs.append(state, part, records([b"new"], int(time.time() * 1000)))[1]
        before = len(backend.objects()) if backend.kind == "s3" else None
        assert logs.enforce_retention() == 6, "both partitions' expired chunks are dropped"
        assert values(read_all(logs, 0)) == [b"new"] and values(read_all(logs, 1)) == []
        assert {c.file_id for c in logs.store.intake_chunks()} == {part.hot_chunks[-1].file_id}
        if before is not None:
            # (a pair may span two objects: after a quiet spell an append leaves at once)
            assert before >= 4 and len(backend.objects()) == 1, "every expired object is deleted"

    run(settings, write)


def test_a_prefix_holding_another_clusters_objects_is_refused_untouched(backend: Backend, tmp_path: Path) -> None:
    if backend.kind != "s3":
        pytest.skip("a bucket prefix is the object store's")

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, [b"theirs"])

    run(backend.settings(), write)
    other = Backend("s3", tmp_path / "other", backend.store)
    other.prefix = backend.prefix  # a second cluster (its own metadata store) pointed at the same prefix
    other.root.mkdir()
    logs = LogManager(other.settings(), SqliteStore(other.meta_path))
    with pytest.raises(ConfigError, match="has never indexed"):
        logs.open()
    logs.store.close()
    assert len(backend.objects()) == 1, "nothing of the first cluster is deleted"


def test_a_crash_after_the_commit_serves_the_records_and_dedups_the_producers_retry(backend: Backend) -> None:
    """Committed, never answered: the records are served after the restart (their offsets are taken), and the
    idempotent producer's retry of the unanswered batch is answered with the offsets it got, not written again."""
    from tests.support.wire_client import build_batch

    settings = backend.settings()
    store = CrashAfterIndex(backend.meta_path)
    first = build_batch([b"a0", b"a1"], producer_id=7, epoch=0, base_sequence=0)
    unanswered = build_batch([b"b0", b"b1", b"b2"], producer_id=7, epoch=0, base_sequence=2)

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        state, part = logs.partition(TOPIC, 0)
        result, done = logs.append(state, part, first)
        await done
        assert result.base_offset == 0
        store.crash = True
        with pytest.raises(KafkaApiError) as failed:
            await logs.append(state, part, unanswered)[1]
        assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        with pytest.raises(OSError, match="simulated crash"):
            await logs.storage.failure()
        assert logs._snapshot_task is not None
        logs._snapshot_task.cancel()  # a crash: no shutdown snapshot, producer state comes from the intake

    run(settings, write, store)

    async def again(logs: LogManager) -> None:
        assert read_all(logs) == [(0, b"a0"), (1, b"a1"), (2, b"b0"), (3, b"b1"), (4, b"b2")]
        state, part = logs.partition(TOPIC, 0)
        result, done = logs.append(state, part, unanswered)  # the producer's retry
        await done
        assert result.acked_offset == 2, "answered with the offsets the commit assigned"
        assert await append(logs, [b"after"]) == 5
        assert values(read_all(logs)) == [b"a0", b"a1", b"b0", b"b1", b"b2", b"after"]

    run(settings, again)


def test_transactions_keep_the_last_stable_offset_below_open_ones_and_skip_aborted_records(backend: Backend) -> None:
    """Transactional appends learn their offsets when they are committed (the sequencer's) or handed out: the LSO
    stops at an open transaction, an aborted one is listed for read_committed readers, after a restart too."""
    from tests.support.wire_client import build_batch

    settings = backend.settings()

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        state, part = logs.partition(TOPIC, 0)
        assert await append(logs, [b"plain"]) == 0
        aborted = build_batch([b"x0", b"x1"], producer_id=8, epoch=0, base_sequence=0, transactional=True)
        result, done = logs.append(state, part, aborted)
        await done
        assert result.base_offset == 1 and part.high_watermark == 3
        assert part.last_stable_offset == 1, "an open transaction holds read_committed readers at its first offset"
        await logs.append_marker(part, 8, 0, commit=False)
        opened = build_batch([b"y"], producer_id=9, epoch=0, base_sequence=0, transactional=True)
        await logs.append(state, part, opened)[1]
        assert part.high_watermark == 5 and part.last_stable_offset == 4
        await logs.append_marker(part, 9, 0, commit=True)
        assert part.last_stable_offset == part.high_watermark == 6
        assert [(r.producer_id, r.first_offset, r.last_offset) for r in part.aborted_ranges(0, 6)] == [(8, 1, 3)]

    run(settings, write)

    async def again(logs: LogManager) -> None:
        _, part = logs.partition(TOPIC, 0)
        assert part.last_stable_offset == part.high_watermark == 6
        assert [(r.producer_id, r.first_offset, r.last_offset) for r in part.aborted_ranges(0, 6)] == [(8, 1, 3)]
        assert [offset for offset, _ in read_all(logs)] == [0, 1, 2, 3, 4, 5]  # each served at its offset

    run(settings, again)


def test_a_restarted_broker_reads_an_object_once_for_many_fetches(backend: Backend) -> None:
    """Fetches at the tail after a restart (or a takeover: objects another broker wrote) are served from the object
    cache after one GET of each object, not one ranged GET per fetch."""
    if backend.kind != "s3":
        pytest.skip("the object cache is object storage's")
    settings = backend.settings(commit_interval_ms=1000)

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 4, {})
        for n in range(5):  # five appends per partition in one interval's object, then a second object
            await asyncio.gather(*(append(logs, [f"p{p}-{n}".encode()], p) for p in range(4)))

    run(settings, write)

    async def again(logs: LogManager) -> None:
        before = logs.storage.objects.stats.requests["get"]
        for p in range(4):
            _, part = logs.partition(TOPIC, p)
            for chunk in part.chunks_from(0):  # each chunk its own fetch
                logs.storage.read(chunk)
        gets = logs.storage.objects.stats.requests["get"] - before
        assert gets <= len(backend.objects()), f"{gets} GETs for {len(backend.objects())} objects"

    run(settings, again)
