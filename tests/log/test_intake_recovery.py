"""Intake recovery, driven through LogManager directly (no sockets): what survives a crash, and how.

A crash is simulated by closing one LogManager and opening another on the same data directory after
changing what is on disk: frames written but not indexed, an index that lost its last commits, torn
tails. Acknowledged data must always be readable again and offsets must never be reused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from icelog.config import IntakeSettings, Settings
from icelog.errors import ErrorCode, KafkaApiError, StoreUnavailableError
from icelog.log import intake_file
from icelog.log.manager import LogManager
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import IntakeChunk, IntakeTail, MetadataStore

TOPIC = "events"


class FlakyIndexStore(SqliteStore):
    """A SQLite store whose intake commits can be made to fail or to vanish.

    `fail_commits`: the frame is on disk but the index commit raises (a crash between fsync and index).
    `lose_commits`: the commit reports success but is not stored (SQLite's synchronous=NORMAL losing the
    last transactions to a power cut); the intake files are then the only record of those frames.
    """

    fail_commits = False
    lose_commits = False
    unavailable = False  # a networked store's database down: commits fail retriably
    unavailable_commits = 0

    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        if self.fail_commits:
            raise OSError("simulated crash before the intake index commit")
        if self.unavailable:
            self.unavailable_commits += 1
            raise StoreUnavailableError("metadata store at db:5432/meta unavailable: connection refused")
        if not self.lose_commits:
            super().commit_intake(chunks, tail)


def make_settings(data_dir: Path, segment_bytes: int = 1 << 20) -> Settings:
    # fsync off: a process crash (all these tests simulate) keeps the page cache anyway.
    return Settings(data_dir=data_dir, intake=IntakeSettings(segment_bytes=segment_bytes, fsync=False))


def records(values: list[bytes], timestamp: int = 1_700_000_000_000) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for value in values:
        builder.append(timestamp=timestamp, key=None, value=value)
    builder.close()
    return bytes(builder.buffer())


async def append(logs: LogManager, values: list[bytes], partition: int = 0) -> int:
    """Append one batch and wait until it is durable; return its base offset."""
    state, part = logs.partition(TOPIC, partition)
    result, done = logs.append(state, part, records(values))
    await done
    return result.base_offset


def read_all(logs: LogManager, partition: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record from the log start to the high watermark."""
    _, part = logs.partition(TOPIC, partition)
    out: list[tuple[int, bytes]] = []
    offset = part.log_start_offset
    while offset < part.high_watermark:
        data = b"".join(part.read(offset, 1 << 20))
        assert data, f"no data at offset {offset} below the high watermark {part.high_watermark}"
        for batch in MemoryRecords(data):
            for record in batch:
                if record.offset >= offset:
                    out.append((record.offset, bytes(record.value)))
                    offset = record.offset + 1
    return out


def run(data_dir: Path, body: Callable[[LogManager], Awaitable[None]], store: MetadataStore | None = None,
        segment_bytes: int = 1 << 20) -> None:
    """Open a LogManager (recovering the intake), run `body` on it, close it."""

    async def main() -> None:
        settings = make_settings(data_dir, segment_bytes)
        logs = LogManager(settings, store or SqliteStore(data_dir / "meta.db"))
        logs.open()
        logs.start()
        try:
            await body(logs)
        finally:
            await logs.close()

    asyncio.run(main())


def intake_files(data_dir: Path) -> list[Path]:
    directory = data_dir / "intake"
    return [intake_file.file_path(directory, i) for i in intake_file.list_files(directory)]


async def expect(logs: LogManager, expected: list[bytes], partition: int = 0) -> None:
    assert read_all(logs, partition) == list(enumerate(expected))


def values(entries: list[tuple[int, bytes]]) -> list[bytes]:
    return [value for _, value in entries]


def batch_values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


# --------------------------------------------------------------------------------------------------
def test_clean_restart_keeps_every_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 2, {})
        assert await append(logs, batch_values("a", 3)) == 0
        assert await append(logs, batch_values("b", 2), partition=1) == 0
        assert await append(logs, batch_values("c", 4)) == 3

    async def check(logs: LogManager) -> None:
        assert read_all(logs) == list(enumerate(batch_values("a", 3) + batch_values("c", 4)))
        assert read_all(logs, 1) == list(enumerate(batch_values("b", 2)))
        assert await append(logs, [b"next"]) == 7

    run(data_dir, write)
    run(data_dir, check)


def test_frame_written_but_not_indexed_is_recovered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash after the fsync and before the index commit: the records were never acknowledged, but they
    are whole on disk, so recovery indexes them (Kafka keeps such records too) and offsets continue after."""
    data_dir = tmp_path / "data"
    store = FlakyIndexStore(data_dir / "meta.db")

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, batch_values("acked", 3))
        store.fail_commits = True
        with pytest.raises(KafkaApiError):
            await append(logs, batch_values("unacked", 2))
        with pytest.raises(KafkaApiError):  # the writer stops after a failed commit
            await append(logs, [b"refused"])
        with pytest.raises(OSError, match="simulated crash"):  # what the broker waits on to stop
            await logs.storage.failure()

    caplog.set_level(logging.INFO, logger="icelog")
    run(data_dir, write, store=store)
    index = SqliteStore(data_dir / "meta.db")
    assert index.intake_chunks()[-1].end_offset == 3, "the failed commit must not have indexed the frame"
    index.close()

    async def check(logs: LogManager) -> None:
        assert "recovered 1 intake frames" in caplog.text
        assert values(read_all(logs)) == batch_values("acked", 3) + batch_values("unacked", 2)
        assert await append(logs, [b"after"]) == 5
        assert read_all(logs)[-1] == (5, b"after")

    run(data_dir, check)
    everything = batch_values("acked", 3) + batch_values("unacked", 2) + [b"after"]
    run(data_dir, lambda logs: expect(logs, everything))


def test_an_unavailable_store_holds_the_group_unacknowledged_refuses_appends_retriably_then_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A networked store's database goes away after a group's frames are on disk: the group is neither
    acknowledged nor undone (its commit may have been stored), new appends are refused retriably, and once the
    store answers the group is indexed, acknowledged, and appends resume with the next offsets."""
    data_dir = tmp_path / "data"
    store = FlakyIndexStore(data_dir / "meta.db")

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, batch_values("acked", 3))
        store.unavailable = True
        state, part = logs.partition(TOPIC, 0)
        _, held = logs.append(state, part, records(batch_values("held", 2)))
        while not logs.storage.unavailable:
            await asyncio.sleep(0.01)
        with pytest.raises(KafkaApiError) as refused:
            logs.append(state, part, records([b"refused"]))
        assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS and refused.value.retriable
        await asyncio.sleep(0.5)
        assert not held.done() and store.unavailable_commits >= 2, "retried, never acknowledged meanwhile"
        assert part.high_watermark == 3

        store.unavailable = False
        await asyncio.wait_for(held, 10)
        assert logs.storage.unavailable is None and logs.storage.failed is None
        assert await append(logs, [b"after"]) == 5
        assert values(read_all(logs)) == batch_values("acked", 3) + batch_values("held", 2) + [b"after"]

    caplog.set_level(logging.INFO, logger="icelog")
    run(data_dir, write, store=store)
    assert "refusing produce: the metadata store is unavailable" in caplog.text
    assert "produce resumes" in caplog.text
    run(data_dir, lambda logs: expect(logs, batch_values("acked", 3) + batch_values("held", 2) + [b"after"]))


def test_lost_index_commits_are_rederived_from_the_intake_files(tmp_path: Path) -> None:
    """The index lost its last commits (the intake files did not); frames across several rolled files,
    interleaving partitions, are indexed again from the last recorded tail."""
    data_dir = tmp_path / "data"
    store = FlakyIndexStore(data_dir / "meta.db")
    expected: dict[int, list[bytes]] = {0: [], 1: []}

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 2, {})
        for i in range(2):
            expected[i % 2] += batch_values(f"indexed{i}", 5)
            await append(logs, batch_values(f"indexed{i}", 5), partition=i % 2)
        store.lose_commits = True
        for i in range(8):
            expected[i % 2] += batch_values(f"lost{i}", 20)
            await append(logs, batch_values(f"lost{i}", 20), partition=i % 2)

    run(data_dir, write, store=store, segment_bytes=600)
    assert len(intake_files(data_dir)) >= 4, "the test needs the lost frames to span several files"
    before = SqliteStore(data_dir / "meta.db")
    assert sum(c.record_count for c in before.intake_chunks()) == 10
    before.close()

    async def check(logs: LogManager) -> None:
        for partition in (0, 1):
            assert read_all(logs, partition) == list(enumerate(expected[partition]))
        assert await append(logs, [b"after"], partition=1) == len(expected[1])

    run(data_dir, check, segment_bytes=600)
    after = SqliteStore(data_dir / "meta.db")
    last_file = intake_file.list_files(data_dir / "intake")[-1]
    assert after.intake_tail() == IntakeTail(last_file, intake_files(data_dir)[-1].stat().st_size)
    after.close()


def test_replaying_frames_already_indexed_is_idempotent(tmp_path: Path) -> None:
    """An index tail older than its chunks (recovery re-scans frames it already knows) adds nothing."""
    data_dir = tmp_path / "data"

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        for i in range(4):
            await append(logs, batch_values(f"b{i}", 3))

    run(data_dir, write, segment_bytes=300)
    store = SqliteStore(data_dir / "meta.db")
    chunks_before = store.intake_chunks()
    first_file = intake_file.list_files(data_dir / "intake")[0]
    store.commit_intake([], IntakeTail(first_file, 0))  # move the tail back to the very start
    store.close()

    run(data_dir, lambda logs: expect(logs, [v for i in range(4) for v in batch_values(f"b{i}", 3)]))
    store = SqliteStore(data_dir / "meta.db")
    assert store.intake_chunks() == chunks_before
    partitions = store.partitions(chunks_before[0].topic_id)
    assert [(p.log_start_offset, p.high_watermark) for p in partitions] == [(0, 12)]
    store.close()


def _torn_frame(data_dir: Path) -> bytes:
    """The first half of a copy of the newest file's last frame: a write cut short by a crash."""
    path = intake_files(data_dir)[-1]
    frames, _, _ = intake_file.scan_frames(path, 0)
    last = frames[-1]
    whole = path.read_bytes()[last.payload_position - intake_file.FRAME_HEADER_SIZE : last.end_position]
    return whole[: len(whole) // 2]


def _bad_crc_frame(data_dir: Path) -> bytes:
    """A whole frame for new offsets whose payload no longer matches its CRC (a torn page)."""
    path = intake_files(data_dir)[-1]
    frames, _, _ = intake_file.scan_frames(path, 0)
    last = frames[-1]
    payload = bytearray(path.read_bytes()[last.payload_position : last.end_position])
    header = intake_file.encode_frame(
        last.topic_id, last.partition, last.end_offset, 2 * last.end_offset - last.base_offset,
        last.max_timestamp, bytes(payload),
    )
    payload[-1] ^= 0xFF
    return header + bytes(payload)


TAILS: dict[str, Callable[[Path], bytes]] = {
    "garbage": lambda _: b"\x00garbage after the last frame\xff" * 3,
    "header-only": lambda d: _torn_frame(d)[: intake_file.FRAME_HEADER_SIZE - 9],
    "half-frame": _torn_frame,
    "bad-crc": _bad_crc_frame,
}


@pytest.mark.parametrize("tail", sorted(TAILS))
def test_torn_tail_is_truncated_and_appends_continue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: str
) -> None:
    data_dir = tmp_path / "data"

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, batch_values("a", 3))
        await append(logs, batch_values("b", 2))

    run(data_dir, write)
    path = intake_files(data_dir)[-1]
    good_size = path.stat().st_size
    with open(path, "ab") as handle:
        handle.write(TAILS[tail](data_dir))

    caplog.set_level(logging.WARNING, logger="icelog")

    async def check(logs: LogManager) -> None:
        assert "torn or corrupt tail" in caplog.text
        assert path.stat().st_size == good_size
        assert values(read_all(logs)) == batch_values("a", 3) + batch_values("b", 2)
        assert await append(logs, [b"after"]) == 5

    run(data_dir, check)
    # The next frame went right where the torn one was cut off, and the index points at it.
    run(data_dir, lambda logs: expect(logs, batch_values("a", 3) + batch_values("b", 2) + [b"after"]))


def test_frames_of_deleted_topics_are_not_resurrected(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, batch_values("old", 4))
        logs.delete_topic(TOPIC)
        logs.create_topic(TOPIC, 1, {})
        await append(logs, batch_values("new", 2))

    run(data_dir, write)
    store = SqliteStore(data_dir / "meta.db")
    store.commit_intake([], IntakeTail(intake_file.list_files(data_dir / "intake")[0], 0))  # rescan it all
    store.close()

    run(data_dir, lambda logs: expect(logs, batch_values("new", 2)))


def test_unknown_topic_id_in_frames_is_ignored(tmp_path: Path) -> None:
    """A frame for a topic the index never knew (created and deleted between two lost commits)."""
    data_dir = tmp_path / "data"
    run(data_dir, lambda logs: _create_and_fill(logs))
    path = intake_files(data_dir)[-1]
    payload = records([b"ghost"])
    with open(path, "ab") as handle:
        handle.write(intake_file.encode_frame(uuid.uuid4(), 0, 0, 1, 0, payload) + payload)

    run(data_dir, lambda logs: expect(logs, batch_values("a", 2)))


async def _create_and_fill(logs: LogManager) -> None:
    logs.create_topic(TOPIC, 1, {})
    await append(logs, batch_values("a", 2))


# -- producer-state snapshots ---------------------------------------------------------------------------
def test_producer_state_comes_back_from_its_snapshot_plus_the_intake_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Start-up loads the snapshot taken at shutdown and replays only chunks written after it."""
    from tests.support.wire_client import build_batch

    data_dir = tmp_path / "data"
    first = build_batch([b"a0", b"a1"], producer_id=7, epoch=0, base_sequence=0)
    second = build_batch([b"b"], producer_id=7, epoch=0, base_sequence=2)

    async def produce(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        state, part = logs.partition(TOPIC, 0)
        await logs.append(state, part, first)[1]
        await logs.append(state, part, build_batch([b"doomed"], producer_id=8, epoch=0, base_sequence=0,
                                                   transactional=True))[1]
        await logs.append_marker(part, 8, 0, commit=False)

    run(data_dir, produce)  # a clean stop: everything is in the snapshot

    async def produce_then_crash() -> None:
        logs = LogManager(make_settings(data_dir), SqliteStore(data_dir / "meta.db"))
        logs.open()
        logs.start()
        state, part = logs.partition(TOPIC, 0)
        assert logs.append(state, part, first)[0].base_offset == 0, "a retry of the first batch, from the snapshot"
        await logs.append(state, part, second)[1]
        assert logs._snapshot_task is not None
        logs._snapshot_task.cancel()  # then "crash": no shutdown snapshot
        await logs.storage.close()
        logs.store.close()

    with caplog.at_level(logging.INFO, logger="icelog.log.snapshots"):
        asyncio.run(produce_then_crash())
    assert "1 snapshot(s) loaded, 0 intake chunk(s) replayed" in caplog.text
    caplog.clear()

    async def check(logs: LogManager) -> None:
        state, part = logs.partition(TOPIC, 0)
        assert logs.append(state, part, second)[0].base_offset == 4, "a retry of the batch written after it"
        assert [(r.producer_id, r.first_offset, r.last_offset) for r in part.aborted_ranges(0, 5)] == [(8, 2, 3)]
        assert part.last_stable_offset == part.high_watermark == 5

    with caplog.at_level(logging.INFO, logger="icelog.log.snapshots"):
        run(data_dir, check)
    assert "1 snapshot(s) loaded, 1 intake chunk(s) replayed" in caplog.text


def test_long_polls_on_an_idle_partition_leave_no_waiter_behind(tmp_path: Path) -> None:
    """Each Fetch that times out on an idle partition removes its waiter (they used to pile up)."""
    from kafka.protocol.consumer import FetchRequest

    from icelog.wire.context import BrokerState, Connection, RequestContext
    from icelog.wire.handlers.fetch import fetch

    topic_cls = FetchRequest.FetchTopic
    request = FetchRequest(
        version=4, replica_id=-1, max_wait_ms=5, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
        topics=[topic_cls(topic=TOPIC, partitions=[
            topic_cls.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20)])],
    )

    async def body(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        await append(logs, [b"only"])
        ctx = RequestContext(BrokerState(logs.settings, logs, "localhost", 9092), 4, None, Connection("test"))
        _, part = logs.partition(TOPIC, 0)
        for _ in range(50):
            response = await fetch(ctx, request)
            assert response.responses[0].partitions[0].records in (b"", None)
        await asyncio.sleep(0)  # cancelled futures run their done callbacks on the next loop turn
        assert part.waiter_count == 0
        # A waiting Fetch is still woken by new data.
        request.topics[0].partitions[0].fetch_offset = 1
        request.max_wait_ms = 30_000
        waiting = asyncio.ensure_future(fetch(ctx, request))
        await asyncio.sleep(0.05)
        assert part.waiter_count == 1
        await append(logs, [b"wake"])
        response = await asyncio.wait_for(waiting, 10)
        assert response.responses[0].partitions[0].records
        await asyncio.sleep(0)
        assert part.waiter_count == 0

    run(tmp_path / "data", body)


def test_preallocated_files_end_at_their_frames_and_a_zero_tail_is_not_torn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer allocates ahead of its frames; rolled and cleanly closed files are cut back to them.

    A killed writer leaves zeros after its last frame: recovery cuts them quietly (they are not a torn
    write) and the next frame goes right after the last one.
    """
    data_dir = tmp_path / "data"
    sizes_while_open: list[int] = []

    async def write(logs: LogManager) -> None:
        logs.create_topic(TOPIC, 1, {})
        for i in range(12):
            await append(logs, batch_values(f"b{i}", 30))
            sizes_while_open.append(intake_files(data_dir)[-1].stat().st_size)

    run(data_dir, write, segment_bytes=4096)
    files = intake_files(data_dir)
    assert len(files) >= 2, "the test needs a roll"
    assert max(sizes_while_open) == 4096, "the active file is allocated up to the segment size"
    for path in files:
        frames, end, size = intake_file.scan_frames(path, 0)
        assert frames and end == size, f"{path.name} ends at its last frame"

    last = files[-1]
    frames_end = last.stat().st_size
    os.truncate(last, 4096)  # what a kill leaves: the allocated zeros after the frames
    caplog.set_level(logging.INFO, logger="icelog")

    async def check(logs: LogManager) -> None:
        assert "torn or corrupt tail" not in caplog.text
        assert "preallocated bytes" in caplog.text
        assert values(read_all(logs)) == [v for i in range(12) for v in batch_values(f"b{i}", 30)]
        assert await append(logs, [b"after"]) == 360

    run(data_dir, check, segment_bytes=4096)
    frames, end, size = intake_file.scan_frames(last, 0)
    assert end == size and frames[-1].payload_position == frames_end + intake_file.FRAME_HEADER_SIZE
