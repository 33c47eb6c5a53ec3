"""SIGKILL the broker while a real client writes, restart it, and check that nothing acknowledged is lost.

The producer (librdkafka, acks=all, lz4, no idempotence) tags every record with a unique payload, and its
delivery reports say exactly which records were acknowledged and at which offset. Without idempotence a
retry may legitimately store a record twice (its first attempt was written but the answer was lost in the
crash), so the checks are: every acknowledged record is at the offset its delivery report named; each
partition's offsets run from 0 to the high watermark without gaps; acknowledged records are in produce
order; an offset, once seen by a consumer, holds the same record forever; nothing else appears.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.log import intake_file
from tests.support.broker import BrokerProcess
from tests.support.reading import read_partition

pytestmark = pytest.mark.crash

PARTITIONS = 3
ROUNDS = 5

BROKER_ENV = {
    # Small intake files, so kills also land around file rolls and recovery spans several files.
    "ICELOG_INTAKE__SEGMENT_BYTES": str(64 * 1024),
    # No Spark archiver child: these tests are about the intake alone.
    "ICELOG_ARCHIVE__ENABLED": "false",
}


@dataclass
class Deliveries:
    """What the producer was told: acknowledged payload -> (partition, offset); failed payloads."""

    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: dict[bytes, str] = field(default_factory=dict)

    def report(self, err: KafkaError | None, msg: Message) -> None:
        value = msg.value()
        assert value is not None
        if err is None:
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None and offset >= 0
            assert value not in self.acked, "one delivery report per produce() call"
            self.acked[value] = (partition, offset)
        else:
            self.failed[value] = str(err)


def make_producer(broker: BrokerProcess) -> Producer:
    return Producer({
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "compression.type": "lz4",
        "enable.idempotence": False,
        # Without idempotence, retries keep produce order only with one request in flight.
        "max.in.flight.requests.per.connection": 1,
        "linger.ms": 2,
        "message.timeout.ms": 60_000,
        "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "queue.buffering.max.messages": 20_000,
    })


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=20)


class Workload:
    """Produces unique records round-robin over the partitions, remembering produce order."""

    def __init__(self, producer: Producer, topic: str, rng: random.Random) -> None:
        self.producer = producer
        self.topic = topic
        self.rng = rng
        self.deliveries = Deliveries()
        self.sent: list[list[bytes]] = [[] for _ in range(PARTITIONS)]
        self.count = 0

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(25):
                partition = self.count % PARTITIONS
                # Unique, recognisable, of varying size (and compressible, for lz4).
                value = f"rec-{self.count:07d}-p{partition}-".encode() + b"x" * self.rng.randrange(0, 300)
                try:
                    self.producer.produce(
                        self.topic, value, partition=partition, on_delivery=self.deliveries.report
                    )
                except BufferError:  # the local queue is full while the broker is down: wait for room
                    self.producer.poll(0.05)
                    continue
                self.sent[partition].append(value)
                self.count += 1
            self.producer.poll(0.01)


@pytest.mark.parametrize("meta", ["sqlite", "postgresql"])
def test_acknowledged_records_survive_repeated_sigkill(
    fresh_broker: BrokerProcess, topic_name: str, meta: str, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("ICELOG_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    broker = fresh_broker
    broker.env.update(BROKER_ENV)
    if meta == "postgresql":  # the metadata store on the session's throwaway PostgreSQL (tests/support/postgres.py)
        broker.env["ICELOG_META_URL"] = request.getfixturevalue("postgres_cluster").new_database()
    broker.start()
    create_topic(broker, topic_name, PARTITIONS)
    producer = make_producer(broker)
    work = Workload(producer, topic_name, rng)
    seen: list[list[bytes]] = [[] for _ in range(PARTITIONS)]  # what consumers saw, by offset
    in_flight_at_kill: list[int] = []

    for _ in range(ROUNDS):
        work.run(rng.uniform(0.3, 1.0))
        for partition in range(PARTITIONS):
            # Whatever a consumer saw once (up to the high watermark) must never change.
            values, _ = read_partition(broker.bootstrap, topic_name, partition, start=len(seen[partition]))
            seen[partition] += values
        work.run(rng.uniform(0.05, 0.6))  # the kill lands at a random moment of continuous writes
        in_flight_at_kill.append(len(producer))
        broker.kill()
        work.run(rng.uniform(0.0, 0.3))  # the producer keeps going while the broker is down
        broker.start()
    work.run(0.5)
    assert producer.flush(90) == 0, "every record gets a delivery report"

    context = f"(seed {seed}; ICELOG_CRASH_SEED={seed} reproduces the schedule)"
    deliveries = work.deliveries
    failures = set(deliveries.failed.values())
    assert not deliveries.failed, f"{len(deliveries.failed)} records failed: {failures} {context}"
    assert any(in_flight_at_kill), f"no kill hit records in flight {context}"
    produced_in = {value: p for p, values in enumerate(work.sent) for value in values}
    for partition in range(PARTITIONS):
        log, _ = read_partition(broker.bootstrap, topic_name, partition)
        where = f"partition {partition} {context}"
        assert log[: len(seen[partition])] == seen[partition], f"{where}: offsets seen before a kill changed"
        assert all(produced_in.get(value) == partition for value in log), f"{where}: a record nobody sent"
        acked_offsets = [deliveries.acked[v] for v in work.sent[partition] if v in deliveries.acked]
        assert [p for p, _ in acked_offsets] == [partition] * len(acked_offsets)
        offsets = [offset for _, offset in acked_offsets]
        assert offsets == sorted(set(offsets)), f"{where}: acknowledged records out of produce order"
        for value in work.sent[partition]:
            if value in deliveries.acked:
                offset = deliveries.acked[value][1]
                assert offset < len(log) and log[offset] == value, f"{where}: acknowledged record lost"
        # Every record sent was acknowledged (none failed), so each must be in the log at least once.
        assert set(log) == set(work.sent[partition]), f"{where}: records missing"
    assert len(deliveries.acked) == work.count
    assert (broker.data_dir / "meta.db").exists() == (meta == "sqlite"), "the metadata was where meta_url says"


def newest_intake_file(broker: BrokerProcess) -> Path:
    directory = broker.data_dir / "intake"
    return intake_file.file_path(directory, intake_file.list_files(directory)[-1])


def _frames_end(path: Path) -> int:
    """Where the last whole frame ends: a killed broker leaves its preallocated zeros after it."""
    return intake_file.scan_frames(path, 0)[1]


def _write_garbage(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(_frames_end(path))
        handle.write(os.urandom(100) + b"not a frame" * 10)


def _write_cut_frame(path: Path) -> None:
    """A copy of the last frame, cut in the middle, after the frames: the write a crash interrupted."""
    frames, end, _ = intake_file.scan_frames(path, 0)
    last = frames[-1]
    data = path.read_bytes()
    frame = data[last.payload_position - intake_file.FRAME_HEADER_SIZE : last.end_position]
    with open(path, "r+b") as handle:
        handle.seek(end)
        handle.write(frame[: len(frame) * 2 // 3])


def _leave_preallocated_tail(path: Path) -> None:
    """Nothing but the kill: the zeros the writer allocated ahead of its frames."""


@pytest.mark.parametrize(
    "damage", [_write_garbage, _write_cut_frame, _leave_preallocated_tail], ids=["garbage", "cut-frame", "zeros"]
)
def test_torn_intake_tail_is_truncated_on_restart(
    fresh_broker: BrokerProcess, topic_name: str, damage: Callable[[Path], None]
) -> None:
    broker = fresh_broker
    broker.env.update(BROKER_ENV)
    broker.start()
    create_topic(broker, topic_name, 2)
    producer = make_producer(broker)
    deliveries = Deliveries()
    for i in range(300):
        producer.produce(topic_name, f"before-{i}".encode(), partition=i % 2, on_delivery=deliveries.report)
        if i % 50 == 49:
            producer.flush(10)
    assert producer.flush(30) == 0 and len(deliveries.acked) == 300
    broker.kill()

    path = newest_intake_file(broker)
    size = _frames_end(path)
    assert path.stat().st_size > size, "the active intake file is allocated ahead of its frames"
    damage(path)
    broker.start()

    torn = "torn or corrupt tail" in broker.log() and "truncating" in broker.log()
    assert torn == (damage is not _leave_preallocated_tail), "only bytes that are not zeros are reported as torn"
    assert path.stat().st_size == size
    logs = [read_partition(broker.bootstrap, topic_name, p)[0] for p in range(2)]
    for value, (partition, offset) in deliveries.acked.items():
        assert logs[partition][offset] == value
    assert [len(values) for values in logs] == [150, 150], "nothing but the acknowledged records"

    # Writing continues right after the acknowledged data: no gap, no reused offset.
    after = Deliveries()
    producer.produce(topic_name, b"after", partition=0, on_delivery=after.report)
    assert producer.flush(30) == 0
    assert after.acked == {b"after": (0, 150)}
    broker.restart()
    assert read_partition(broker.bootstrap, topic_name, 0)[0] == logs[0] + [b"after"]
