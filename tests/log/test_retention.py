"""retention.ms and retention.bytes with Kafka's semantics, on a broker of the test's own.

The broker checks retention every 200 ms and rolls intake files at 4 KiB, so old data spans several files.
Kafka drops whole segments; icelog drops whole intake chunks (one partition's batches of one group commit)
and deletes an intake file once no partition needs any of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.log import intake_file
from tests.support.broker import BrokerProcess
from tests.support.hand_records import record as raw_record
from tests.wire.test_bad_input import (
    NONE,
    OFFSET_OUT_OF_RANGE,
    Connection,
    batch,
    fetch_partition,
    list_offset,
    produce,
    raw_batch,
)

EARLIEST, LATEST = -2, -1
HOUR_MS = 3_600_000


@pytest.fixture
def retention_broker(fresh_broker: BrokerProcess) -> BrokerProcess:
    fresh_broker.env.update({
        "ICELOG_RETENTION_CHECK_INTERVAL_MS": "200",
        "ICELOG_INTAKE__SEGMENT_BYTES": "4096",
        # Plain Kafka topics: an archived topic keeps its intake until the archiver has copied it.
        "ICELOG_ARCHIVE__ENABLED": "false",
        "ICELOG_ARCHIVE__DEFAULT_KIND": "none",
    })
    return fresh_broker.start()


def create_topic(broker: BrokerProcess, name: str, partitions: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=configs)]).values():
        future.result(timeout=20)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll until the condition holds; retention runs in the background on its own schedule."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def earliest(broker: BrokerProcess, topic: str, partition: int = 0) -> int:
    with Connection(broker) as conn:
        result = list_offset(conn, topic, EARLIEST, partition)
        assert result.error_code == NONE
        return int(result.offset)


def consume_from_earliest(broker: BrokerProcess, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """What a consumer starting from the beginning gets: (offset, value) up to the high watermark."""
    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        consumer.assign([TopicPartition(topic, partition)])  # no offset: starts from auto.offset.reset
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            out.append((message.offset(), message.value()))
        assert not out or out[0][0] == low, "a consumer from the beginning starts at the log start offset"
        return out
    finally:
        consumer.close()


def frames_by_file(broker: BrokerProcess) -> dict[int, list[intake_file.Frame]]:
    directory = broker.data_dir / "intake"
    return {fid: intake_file.scan_frames(intake_file.file_path(directory, fid), 0)[0]
            for fid in intake_file.list_files(directory)}


def test_retention_ms_drops_old_records_and_their_intake_files(
    retention_broker: BrokerProcess, topic_name: str
) -> None:
    broker = retention_broker
    create_topic(broker, topic_name, 2, {"retention.ms": str(HOUR_MS)})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    now_ms = int(time.time() * 1000)
    old = [f"old-{i}".encode() + b"." * 300 for i in range(40)]
    new = [f"new-{i}".encode() + b"." * 300 for i in range(10)]
    for i, value in enumerate(old):
        producer.produce(topic_name, value, partition=0, timestamp=now_ms - 2 * HOUR_MS + i)
        if i % 5 == 4:
            producer.flush(10)  # several group commits, so the old records span several intake files
    producer.flush(10)
    for value in new:
        producer.produce(topic_name, value, partition=0, timestamp=now_ms)
    for i in range(5):  # partition 1 holds only expired records
        producer.produce(topic_name, b"expired", partition=1, timestamp=now_ms - 2 * HOUR_MS + i)
    assert producer.flush(10) == 0

    wait_for(lambda: earliest(broker, topic_name) == len(old), f"the log start offset to reach {len(old)}")
    wait_for(lambda: earliest(broker, topic_name, 1) == 5, "partition 1's log start offset to reach 5")

    assert consume_from_earliest(broker, topic_name) == list(enumerate(new, start=len(old)))
    with Connection(broker) as conn:
        below = fetch_partition(conn, topic_name, len(old) - 1)
        assert below.error_code == OFFSET_OUT_OF_RANGE
        assert (below.log_start_offset, below.high_watermark) == (len(old), len(old) + len(new))
        assert fetch_partition(conn, topic_name, 0).error_code == OFFSET_OUT_OF_RANGE
        assert list_offset(conn, topic_name, LATEST).offset == len(old) + len(new)
    # Every intake file left holds a record still in the log, except the one being written.
    files = frames_by_file(broker)
    assert min(files) > 1, "the files that held only expired records are deleted"
    newest = max(files)
    for file_id, frames in files.items():
        needed = any(f.end_offset > len(old) for f in frames)
        assert file_id == newest or needed, f"intake file {file_id} holds only expired records"

    with Connection(broker) as conn:  # an emptied partition keeps its offsets: log start = end = 5
        assert list_offset(conn, topic_name, LATEST, 1).offset == 5

    # The new log starts survive a crash and restart; nothing deleted comes back, no offset is reused.
    broker.restart()
    assert earliest(broker, topic_name) == len(old)
    assert consume_from_earliest(broker, topic_name) == list(enumerate(new, start=len(old)))
    assert min(frames_by_file(broker)) == min(files)
    assert earliest(broker, topic_name, 1) == 5
    with Connection(broker) as conn:
        assert produce(conn, topic_name, batch([b"fresh"]), partition=1).base_offset == 5
    assert consume_from_earliest(broker, topic_name, 1) == [(5, b"fresh")]


def test_retention_bytes_keeps_the_newest_chunks_per_partition(
    retention_broker: BrokerProcess, topic_name: str
) -> None:
    broker = retention_broker
    one = batch([b"r" * 1000])
    size = len(one)  # every produce below is one batch of this size, stored as its own chunk
    retention_bytes = int(5.5 * size)
    create_topic(broker, topic_name, 2, {"retention.bytes": str(retention_bytes), "retention.ms": "-1"})

    with Connection(broker) as conn:
        for i in range(20):
            assert produce(conn, topic_name, batch([f"p0-{i:02d}".encode() + b"r" * 994])).error_code == NONE
        for i in range(3):
            assert produce(conn, topic_name, batch([f"p1-{i:02d}".encode() + b"r" * 994]), 1).error_code == 0

    # Kafka deletes the oldest segment while the partition minus that segment is still >= retention.bytes:
    # with equal chunks of `size` bytes that keeps 6 (6 * size >= 5.5 * size > 5 * size), so 14 are dropped.
    wait_for(lambda: earliest(broker, topic_name) == 14, "the log start offset to reach 14")

    records = consume_from_earliest(broker, topic_name)
    assert [offset for offset, _ in records] == list(range(14, 20))
    assert [value[:5] for _, value in records] == [f"p0-{i:02d}".encode() for i in range(14, 20)]
    with Connection(broker) as conn:
        assert fetch_partition(conn, topic_name, 13).error_code == OFFSET_OUT_OF_RANGE
        assert fetch_partition(conn, topic_name, 14).error_code == NONE
    # retention.bytes applies per partition: partition 1 is under the limit and keeps everything.
    assert earliest(broker, topic_name, 1) == 0
    partition_1 = consume_from_earliest(broker, topic_name, 1)
    assert [value[:5] for _, value in partition_1] == [b"p1-00", b"p1-01", b"p1-02"]

    # More data moves the log start on, one chunk at a time.
    with Connection(broker) as conn:
        for i in range(20, 23):
            assert produce(conn, topic_name, batch([f"p0-{i:02d}".encode() + b"r" * 994])).error_code == NONE
    wait_for(lambda: earliest(broker, topic_name) == 17, "the log start offset to reach 17")
    assert [offset for offset, _ in consume_from_earliest(broker, topic_name)] == list(range(17, 23))


def test_retention_keeps_everything_by_default_for_recent_data(
    retention_broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """The default retention.ms (7 days) and retention.bytes (-1) must not drop recent records, however
    many intake files they fill."""
    broker = retention_broker
    create_topic(broker, topic_name, 1, {})
    with Connection(broker) as conn:
        for i in range(12):
            assert produce(conn, topic_name, batch([f"v{i}".encode() + b"." * 1000])).error_code == NONE
    assert len(frames_by_file(broker)) >= 3
    time.sleep(0.6)  # a few retention passes (they run every 200 ms)
    assert earliest(broker, topic_name) == 0
    assert [offset for offset, _ in consume_from_earliest(broker, topic_name)] == list(range(12))


def test_retention_ms_goes_by_the_records_timestamps_not_the_producers_header(
    retention_broker: BrokerProcess, topic_name: str
) -> None:
    """Kafka stores a batch's records' max timestamp whatever the producer's header says (Sarama writes -1):
    retention keeps recent records under a header of -1 and drops old ones under a header of now."""
    broker = retention_broker
    create_topic(broker, topic_name, 2, {"retention.ms": str(HOUR_MS)})
    now_ms = int(time.time() * 1000)
    old = b"".join(raw_record(i, b"old", ts_delta=i) for i in range(3))
    recent = b"".join(raw_record(i, b"recent", ts_delta=i) for i in range(3))
    with Connection(broker) as conn:
        # partition 0: old records whose header says now; partition 1: recent records whose header says -1
        assert produce(conn, topic_name, raw_batch(old, 3, base_ts=now_ms - 2 * HOUR_MS, max_ts=now_ms)).error_code \
            == NONE
        assert produce(conn, topic_name, raw_batch(recent, 3, base_ts=now_ms, max_ts=-1), partition=1).error_code \
            == NONE

    wait_for(lambda: earliest(broker, topic_name) == 3, "the old records to expire")
    time.sleep(0.6)  # a few more retention passes (every 200 ms)
    assert earliest(broker, topic_name, 1) == 0
    assert consume_from_earliest(broker, topic_name, 1) == [(0, b"recent"), (1, b"recent"), (2, b"recent")]


def test_produce_and_fetch_are_served_while_a_retention_pass_is_in_flight(fresh_broker: BrokerProcess) -> None:
    """A retention pass reads the store, commits its trim with an fsync and deletes files: off the event loop.

    The broker holds its retention pass right after storing a trim (a test hook) until the test says; while it
    is held, a producer's records are acknowledged and a consumer reads them. Run on the event loop, as it was,
    the held pass stalled every connection: nothing was acknowledged until the pass ended.
    """
    broker = fresh_broker
    broker.env.update({
        "ICELOG_RETENTION_CHECK_INTERVAL_MS": "200",
        "ICELOG_INTAKE__SEGMENT_BYTES": "4096",
        "ICELOG_ARCHIVE__ENABLED": "false",
        "ICELOG_ARCHIVE__DEFAULT_KIND": "none",
        "ICELOG_TEST_FAULT": "trim-held",
    })
    broker.start()
    topic = "held-trim"
    create_topic(broker, topic, 2, {"retention.ms": str(HOUR_MS)})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    now_ms = int(time.time() * 1000)
    for i in range(5):
        producer.produce(topic, b"expired" + b"." * 300, partition=0, timestamp=now_ms - 2 * HOUR_MS + i)
    assert producer.flush(10) == 0
    release = broker.data_dir / "trim-held.release"
    wait_for(lambda: "holding at trim-held" in broker.log(), "the retention pass to hold after its trim")

    try:
        fresh = [b"fresh-%d" % i for i in range(3)]
        for value in fresh:
            producer.produce(topic, value, partition=1, timestamp=now_ms)
        assert producer.flush(20) == 0, "records produced while a retention pass is in flight are acknowledged"
        assert [v for _, v in consume_from_earliest(broker, topic, 1)] == fresh
        assert "holding at trim-held" in broker.log() and not release.exists(), "the pass was still held"
    finally:
        release.touch()
    # The held pass then ends as it would have: partition 0's expired records are gone, the fresh ones kept.
    wait_for(lambda: earliest(broker, topic) == 5, "partition 0's log start offset to reach 5")
    assert consume_from_earliest(broker, topic, 0) == []
    assert [v for _, v in consume_from_earliest(broker, topic, 1)] == fresh
