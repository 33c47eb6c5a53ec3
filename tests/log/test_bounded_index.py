"""The intake chunk index is bounded: a partition keeps only its newest chunks (and a small cache of older
ones) in memory and looks the rest up in the metadata store, so start-up does not grow with the intake.

Every test runs with `intake.index_cache_chunks` far below the partition's chunk count, so reads from the
oldest offset, producer-state replay, ListOffsets by time and retention all go through the store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.config import ArchiveSettings, IntakeSettings, Settings
from icelog.log.manager import LogManager
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import ArchiveState, IntakeChunk, IntakeTail
from tests.log.test_idempotence import create_topic, init_producer_id
from tests.log.test_retention import earliest, frames_by_file, wait_for
from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient
from tests.wire.test_bad_input import NONE, OFFSET_OUT_OF_RANGE, Connection, fetch_partition, list_offset

CACHE = 4  # index rows a partition keeps: the newest 4 chunks, and 4 older ones cached
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
HOUR_MS = 3_600_000
T0 = int(time.time() * 1000) - HOUR_MS // 2  # first record's timestamp: each batch is one second later


def timed_batch(index: int, producer_id: int = -1, epoch: int = -1) -> bytes:
    """Batch `index` (all of one size): two records at T0 + index seconds, sequence 2 * index if idempotent."""
    sequence = 2 * index if producer_id >= 0 else -1
    builder = DefaultRecordBatchBuilder(2, 0, 0, producer_id, epoch, sequence, 1 << 20)
    for i in range(2):
        builder.append(i, timestamp=T0 + index * 1000, key=f"k{index:03d}".encode(),
                       value=f"v{index:03d}-{i}".encode() + b"." * 40, headers=[("h", f"{index:03d}".encode())])
    return bytes(builder.build())


def with_offset(batch: bytes, base_offset: int) -> bytes:
    """A produced batch as stored: only the base offset (outside the CRC) is assigned by the broker."""
    return struct.pack(">q", base_offset) + batch[8:]


def split_batches(data: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos + 12 <= len(data):
        size = 12 + struct.unpack_from(">i", data, pos + 8)[0]
        out.append(data[pos : pos + size])
        pos += size
    return out


def fetch_all_batches(broker: BrokerProcess, topic: str) -> list[bytes]:
    """Every stored batch from offset 0 to the high watermark, as Fetch returns them (raw bytes)."""
    out: list[bytes] = []
    offset = 0
    with Connection(broker) as conn:
        while True:
            data = fetch_partition(conn, topic, offset)
            assert data.error_code == NONE, f"Fetch at {offset}: error {data.error_code}"
            if offset >= data.high_watermark:
                return out
            batches = split_batches(bytes(data.records or b""))
            assert batches, f"no data at offset {offset} below the high watermark {data.high_watermark}"
            for batch in batches:
                base, count = struct.unpack_from(">q", batch, 0)[0], struct.unpack_from(">i", batch, 57)[0]
                if base >= offset:
                    out.append(batch)
                    offset = base + count


def consume_values(broker: BrokerProcess, topic: str, expected: int) -> list[tuple[int, bytes, int]]:
    """(offset, value, timestamp) of every record, read by librdkafka from the beginning."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        out: list[tuple[int, bytes, int]] = []
        deadline = time.monotonic() + 60
        while len(out) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append((message.offset(), message.value(), message.timestamp()[1]))
        return out
    finally:
        consumer.close()


@pytest.fixture
def tiny_index_broker(fresh_broker: BrokerProcess) -> BrokerProcess:
    fresh_broker.env.update({
        "ICELOG_INTAKE__INDEX_CACHE_CHUNKS": str(CACHE),
        "ICELOG_INTAKE__SEGMENT_BYTES": "8192",  # many intake files
        "ICELOG_INTAKE__PRODUCER_SNAPSHOT_INTERVAL_MS": "300",
        "ICELOG_RETENTION_CHECK_INTERVAL_MS": "200",
    })
    return fresh_broker.start()


@pytest.mark.crash
def test_restart_over_many_chunks_serves_the_whole_partition_with_a_tiny_index_cache(
    tiny_index_broker: BrokerProcess,
) -> None:
    """200 chunks, 4 index rows in memory: after a kill and restart a consumer reads every byte from 0,
    ListOffsets finds offsets by time in the oldest chunks, and the idempotent producer resumes."""
    broker = tiny_index_broker
    topic = "bounded-index"
    create_topic(broker.bootstrap, topic)
    client = RawClient(broker.bootstrap)
    pid, epoch = init_producer_id(client)
    produced = [timed_batch(i, pid, epoch) for i in range(200)]
    for i, batch in enumerate(produced[:150]):  # one produce request per batch: one chunk each
        assert client.produce(topic, 0, batch) == (0, 2 * i)
    time.sleep(1.0)  # a producer-state snapshot is taken (every 300 ms) ...
    for i, batch in enumerate(produced[150:], start=150):  # ... and 50 chunks are written after it
        assert client.produce(topic, 0, batch) == (0, 2 * i)
    client.close()
    stored = [with_offset(batch, 2 * i) for i, batch in enumerate(produced)]
    assert fetch_all_batches(broker, topic) == stored

    broker.restart()  # SIGKILL: no shutdown snapshot; start-up replays the 50 chunks after the last one

    assert fetch_all_batches(broker, topic) == stored, "byte-identical from offset 0 after the restart"
    records = consume_values(broker, topic, 400)
    assert [(o, v, ts) for o, v, ts in records] == [
        (2 * i + r, f"v{i:03d}-{r}".encode() + b"." * 40, T0 + i * 1000) for i in range(200) for r in range(2)
    ]
    with Connection(broker) as conn:
        for index in (0, 3, 77, 150, 199):
            found = list_offset(conn, topic, T0 + index * 1000 - 500)
            assert (found.error_code, found.offset, found.timestamp) == (NONE, 2 * index, T0 + index * 1000)
        assert list_offset(conn, topic, T0 + 200 * 1000).offset == -1, "no record that late"

    client = RawClient(broker.bootstrap)
    assert client.produce(topic, 0, produced[199]) == (0, 398), "a retry of the last batch is a duplicate"
    assert client.produce(topic, 0, timed_batch(200, pid, epoch)) == (0, 400)
    assert client.produce(topic, 0, timed_batch(205, pid, epoch))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    client.close()
    assert len(fetch_all_batches(broker, topic)) == 201


def status_intake(broker: BrokerProcess, topic: str) -> tuple[int, int, int]:
    """(LOG-START, INTAKE-CHUNKS, INTAKE-BYTES) of partition 0 in `icelog status`."""
    proc = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(broker.data_dir)],
                          capture_output=True, text=True, timeout=60, check=True)
    header, *rows = [line.split() for line in proc.stdout.splitlines()]
    for row in rows:
        cells = dict(zip(header, row, strict=False))
        if cells["TOPIC"] == topic and cells["PARTITION"] == "0":
            return int(cells["LOG-START"]), int(cells["INTAKE-CHUNKS"]), int(cells["INTAKE-BYTES"])
    raise AssertionError(f"{topic} not in `icelog status`:\n{proc.stdout}")


@pytest.mark.crash
def test_retention_after_a_restart_walks_chunks_it_does_not_hold_in_memory(
    tiny_index_broker: BrokerProcess,
) -> None:
    """retention.ms and retention.bytes set after a restart drop the right chunks (none of which the
    restarted broker holds in memory), delete their intake files, and `icelog status` agrees."""
    broker = tiny_index_broker
    by_time, by_bytes = "bounded-retention-ms", "bounded-retention-bytes"
    for name in (by_time, by_bytes):
        create_topic(broker.bootstrap, name)
    old = [timed_batch(i) for i in range(30)]  # timestamps ~30 min ago
    client = RawClient(broker.bootstrap)
    for batch in old:
        assert client.produce(by_time, 0, batch)[0] == NONE
        assert client.produce(by_bytes, 0, batch)[0] == NONE
    recent = [b"fresh-" + bytes([48 + i]) for i in range(3)]
    for value in recent:
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
        builder.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
        assert client.produce(by_time, 0, bytes(builder.build()))[0] == NONE
    client.close()
    assert earliest(broker, by_time) == 0
    files_before = set(frames_by_file(broker))
    size = len(old[0])
    assert status_intake(broker, by_bytes) == (0, 30, 30 * size)

    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name, config in ((by_time, {"retention.ms": str(60_000)}),
                         (by_bytes, {"retention.bytes": str(int(5.5 * size)), "retention.ms": "-1"})):
        resource = ConfigResource(ConfigResource.Type.TOPIC, name, set_config=config)
        for future in admin.alter_configs([resource]).values():
            future.result(timeout=20)

    wait_for(lambda: earliest(broker, by_time) == 60, "retention.ms to drop the 30 old chunks")
    wait_for(lambda: earliest(broker, by_bytes) == 48, "retention.bytes to keep the newest 6 chunks")
    with Connection(broker) as conn:
        assert fetch_partition(conn, by_time, 59).error_code == OFFSET_OUT_OF_RANGE
        kept = fetch_partition(conn, by_bytes, 48)
        assert kept.error_code == NONE
        assert split_batches(bytes(kept.records))[0] == with_offset(old[24], 48)
        assert list_offset(conn, by_time, T0).offset == 60, "ListOffsets by time skips what retention dropped"
    assert [v for _, v, _ in consume_values(broker, by_time, 3)] == recent
    assert status_intake(broker, by_bytes) == (48, 6, 6 * size)
    assert status_intake(broker, by_time)[:2] == (60, 3)
    assert min(frames_by_file(broker)) > min(files_before), "intake files of dropped chunks are deleted"


# -- in process: memory stays bounded ------------------------------------------------------------------
def test_reading_every_chunk_keeps_the_index_within_its_cache(tmp_path: Path) -> None:
    """A LogManager restarted over 300 chunks holds at most ~2 x index_cache_chunks rows while a reader
    walks the partition from 0, serves every byte, and answers ListOffsets by time and max timestamp."""
    settings = Settings(data_dir=tmp_path / "data", intake=IntakeSettings(fsync=False, index_cache_chunks=CACHE))
    batches = [timed_batch(i, producer_id=3, epoch=0) for i in range(300)]

    async def write() -> None:
        logs = LogManager(settings, SqliteStore(settings.data_dir / "meta.db"))
        logs.open()
        logs.start()
        logs.create_topic("t", 1, {})
        state, part = logs.partition("t", 0)
        for batch in batches:
            await logs.append(state, part, batch)[1]
        assert len(part.hot_chunks) <= CACHE, "the in-memory tail stays bounded while appending"
        assert logs._snapshot_task is not None
        logs._snapshot_task.cancel()  # then "crash": no shutdown snapshot, so start-up replays every chunk
        await logs.storage.close()
        logs.store.close()

    async def read_back() -> None:
        logs = LogManager(settings, SqliteStore(settings.data_dir / "meta.db"))
        logs.open()
        logs.start()
        try:
            state, part = logs.partition("t", 0)
            assert part.cached_chunk_rows <= 2 * CACHE, "start-up replayed 300 chunks through the bounded cache"
            data = b""
            offset = 0
            while offset < part.high_watermark:
                got = b"".join(part.read(offset, 300))  # about one batch per read
                assert part.cached_chunk_rows <= 2 * CACHE
                data += got
                offset = struct.unpack_from(">q", split_batches(got)[-1], 0)[0] + 2
            assert split_batches(data) == [with_offset(b, 2 * i) for i, b in enumerate(batches)]
            assert part.offset_for_timestamp(T0 + 10_500) == (22, T0 + 11_000)
            assert part.max_timestamp_offset() == (598, T0 + 299_000)
            assert part.intake_bytes == sum(len(b) for b in batches)
            retry = logs.append(state, part, batches[-1])[0]
            assert retry.base_offset == 598, "producer state replayed through the store's index"
        finally:
            await logs.close()

    asyncio.run(write())
    asyncio.run(read_back())


def test_unarchived_bytes_are_counted_from_either_side_of_the_archived_offset(tmp_path: Path) -> None:
    """Back-pressure counts sum the shorter side of the archived offset in the store: same answer both ways."""
    settings = Settings(data_dir=tmp_path / "data", intake=IntakeSettings(fsync=False, index_cache_chunks=CACHE))
    batches = [timed_batch(i) for i in range(10)]  # 2 records each: chunk i holds offsets 2i, 2i + 1

    async def main() -> None:
        logs = LogManager(settings, SqliteStore(settings.data_dir / "meta.db"))
        logs.open()
        logs.start()
        try:
            state = logs.create_topic("archived", 1, {})  # archived: the default archive kind is iceberg
            assert state is not None and state.max_lag_bytes is not None
            for batch in batches:
                await logs.append(state, state.partitions[0], batch)[1]
            tid = state.record.topic_id
            counts = {a: logs.count_unarchived([ArchiveState(tid, 0, a)])[tid] for a in (0, 3, 4, 15, 19, 20)}
            size = len(batches[0])
            assert counts == {0: 10 * size, 3: 9 * size, 4: 8 * size, 15: 3 * size, 19: size, 20: 0}
        finally:
            await logs.close()

    asyncio.run(main())


def test_an_older_sqlite_store_gets_its_partition_intake_totals(tmp_path: Path) -> None:
    """A store written before the per-partition totals existed is backfilled when opened, then kept."""
    path = tmp_path / "meta.db"
    store = SqliteStore(path)
    topic = store.create_topic("t", 1, {})
    chunks = [IntakeChunk(topic.topic_id, 0, i, i + 1, 1, 100 * i, 10 + i, 0) for i in range(5)]
    store.commit_intake(chunks, IntakeTail(1, 1000))
    store.close()
    with sqlite3.connect(path) as conn:  # the schema of the previous release
        conn.execute("DROP TRIGGER intake_chunks_counted")
        conn.execute("DROP TRIGGER intake_chunks_uncounted")
        conn.execute("ALTER TABLE partitions DROP COLUMN intake_chunks")
        conn.execute("ALTER TABLE partitions DROP COLUMN intake_bytes")

    store = SqliteStore(path)
    assert [(p.intake_chunks, p.intake_bytes) for p in store.partitions(topic.topic_id)] == [(5, 60)]
    store.commit_intake([IntakeChunk(topic.topic_id, 0, 5, 6, 1, 600, 1, 0)], IntakeTail(1, 1000))
    store.trim_intake(topic.topic_id, 0, 2)
    assert [(p.intake_chunks, p.intake_bytes) for p in store.partitions(topic.topic_id)] == [(4, 61 - 21)]
    store.close()


def test_batch_positions_stay_within_their_cache_and_go_with_trimmed_chunks(tmp_path: Path) -> None:
    """Reads starting inside chunks index at most `batch_positions_cache_chunks` chunks' batch positions, and
    retention forgets those of the chunks it trimmed (what describes released intake is released with it)."""
    settings = Settings(data_dir=tmp_path / "data", archive=ArchiveSettings(default_kind="none"),
                        intake=IntakeSettings(fsync=False, index_cache_chunks=CACHE, batch_positions_cache_chunks=3))
    pairs = [timed_batch(2 * i) + timed_batch(2 * i + 1) for i in range(10)]  # a chunk of two batches each

    async def run() -> None:
        logs = LogManager(settings, SqliteStore(settings.data_dir / "meta.db"))
        logs.open()
        logs.start()
        try:
            logs.create_topic("t", 1, {"retention.bytes": str(2 * len(pairs[0])), "retention.ms": "-1"})
            state, part = logs.partition("t", 0)
            for pair in pairs:
                await logs.append(state, part, pair)[1]
            for i in range(len(pairs)):  # each read starts at a chunk's second batch: its positions are indexed
                assert split_batches(b"".join(part.read(4 * i + 2, 1)))[0][:8] == struct.pack(">q", 4 * i + 2)
                assert part.cached_batch_positions[0] <= 3
            assert part.cached_batch_positions == (3, 6)
            assert logs.enforce_retention() == 8  # keeps the newest two chunks (offsets 32..39)
            assert part.log_start_offset == 32
            assert part.cached_batch_positions == (2, 4), "the trimmed chunk's positions went with it"
        finally:
            await logs.close()

    asyncio.run(run())
