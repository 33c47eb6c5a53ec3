"""Disk full does not stop the broker: produce is refused retriably at `intake.min_free_bytes`, reads go on,
and produce resumes by itself once there is space again (issue 29, case 6).

The data directory is a small tmpfs mounted for the test (root only; skipped otherwise), so "the disk" is
exactly as large as the test says and grows when the test remounts it larger.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.support.broker import BrokerProcess

MB = 1024 * 1024
DISK = 32 * MB
FLOOR = 16 * MB
VALUE_SIZE = 10_000
SLACK = 2 * MB  # the metadata store's own writes (its WAL) between two readings of the free space


class Deliveries:
    """A producer's delivery reports: (offset, value) of each acknowledged record, and the errors."""

    def __init__(self) -> None:
        self.delivered: list[tuple[int, bytes]] = []
        self.errors: list[Any] = []

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append((msg.offset(), msg.value()))



@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-full", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    read: list[bytes] = []
    try:
        while len(read) < count:
            msg = consumer.poll(10)
            assert msg is not None, f"read {len(read)} of {count}"
            error = msg.error()
            if error is None:
                value = msg.value()
                assert value is not None
                read.append(value)
            else:
                assert error.code() == KafkaError._PARTITION_EOF
                if len(read) >= count:
                    break
    finally:
        consumer.close()
    return read


@pytest.mark.slow
def test_a_full_disk_refuses_produce_retriably_keeps_reads_and_resumes_when_space_returns(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk / "data", env={
        "ICELOG_INTAKE__MIN_FREE_BYTES": str(FLOOR), "ICELOG_INTAKE__PREALLOCATE_BYTES": "0",
    })
    broker.log_path = small_disk.parent / "broker.log"  # not on the small disk
    broker.start()
    topic = "disk-full"
    try:
        deliveries = Deliveries()
        delivered, errors, on_delivery = deliveries.delivered, deliveries.errors, deliveries.on_delivery

        producer = Producer({
            "bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
            "compression.type": "none", "message.timeout.ms": 600_000, "retry.backoff.max.ms": 500,
        })
        # More than the disk holds above the floor, produced as fast as the client can.
        sent = [b"%06d" % i + os.urandom(VALUE_SIZE - 6) for i in range(2 * (DISK - FLOOR) // VALUE_SIZE)]
        for value in sent:
            producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
        assert producer.flush(10) > 0, "everything was accepted although it does not fit above the floor"
        assert broker.proc is not None and broker.proc.poll() is None, broker.log()
        assert not errors, errors  # refused batches are retried by the client, not failed
        free = shutil.disk_usage(small_disk).free
        assert free >= FLOOR - SLACK, f"the intake wrote past intake.min_free_bytes: {free} bytes free"
        log = broker.log()
        assert log.count("refusing produce: the data directory has") == 1, log  # once, not per request
        assert "Traceback" not in log
        status = subprocess.run(
            [sys.executable, "-m", "icelog", "status", "--data-dir", str(broker.data_dir)], capture_output=True,
            text=True, env={**os.environ, "ICELOG_INTAKE__MIN_FREE_BYTES": str(FLOOR)}, check=True,
        ).stderr
        assert "min_free_bytes=16777216" in status and "refused" in status, status

        # A client that does not retry sees the retriable error (a batch of its that does not fit above the floor).
        probe = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0, "acks": "all", "linger.ms": 50})
        probe_errors: list[Any] = []
        for value in sent[:200]:
            probe.produce("disk-full-probe", value=value, partition=0,
                          on_delivery=lambda err, _m: probe_errors.append(err))
        assert probe.flush(30) == 0
        refused = [e for e in probe_errors if e is not None]
        # (retriable in Kafka's protocol: the main producer above retried the same answer by itself)
        assert refused and all(e.code() == KafkaError.NOT_ENOUGH_REPLICAS for e in refused)

        # Reads go on: everything acknowledged so far is there.
        acked = [v for _, v in sorted(delivered)]
        assert acked and _read_all(broker.bootstrap, topic, len(acked))[: len(acked)] == acked

        # Space returns: the same producer's retries go through by themselves.
        subprocess.run(["mount", "-o", f"remount,size={4 * DISK}", str(small_disk)], check=True)
        assert producer.flush(60) == 0 and not errors, errors
        assert broker.proc.poll() is None
        assert [v for _, v in sorted(delivered)] == sent
        assert [o for o, _ in sorted(delivered)] == list(range(len(sent)))
        assert _read_all(broker.bootstrap, topic, len(sent)) == sent  # each once, in order
        assert "produce resumes" in broker.log()
    finally:
        broker.stop()


@pytest.mark.slow
def test_enospc_in_an_intake_write_fails_the_appends_retriably_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env={"ICELOG_TEST_FAULT": "intake-enospc"}).start()
    topic = "enospc"
    try:
        deliveries = Deliveries()
        delivered, errors, on_delivery = deliveries.delivered, deliveries.errors, deliveries.on_delivery

        producer = Producer({
            "bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 600_000, "retry.backoff.max.ms": 500,
        })
        sent = [b"%06d" % i + os.urandom(994) for i in range(400)]
        for value in sent[:200]:
            producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0 and not errors, errors

        (broker.data_dir / "intake-enospc").touch()  # from now on every intake write finds the disk full
        for value in sent[200:]:
            producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
        assert producer.flush(5) > 0, "acknowledged although nothing could be written"
        assert broker.proc is not None and broker.proc.poll() is None, broker.log()
        assert not errors, errors  # retried by the client, not failed
        assert len(delivered) == 200

        probe = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0, "acks": "all"})
        probe_errors: list[Any] = []
        probe.produce(topic, value=b"refused", partition=0, on_delivery=lambda err, _m: probe_errors.append(err))
        assert probe.flush(30) == 0
        assert probe_errors[0] is not None
        assert probe_errors[0].code() in (KafkaError.KAFKA_STORAGE_ERROR, KafkaError.NOT_ENOUGH_REPLICAS)

        assert _read_all(broker.bootstrap, topic, 200)[:200] == sent[:200]  # reads go on

        (broker.data_dir / "intake-enospc").unlink()  # space returns
        assert producer.flush(60) == 0 and not errors, errors
        assert broker.proc.poll() is None
        assert [v for _, v in sorted(delivered)] == sent
        assert [o for o, _ in sorted(delivered)] == list(range(len(sent)))
        assert _read_all(broker.bootstrap, topic, len(sent)) == sent  # each once, in order, nothing half-written
        log = broker.log()
        assert log.count("refusing produce") == 1 and "produce resumes" in log and "Traceback" not in log, log
    finally:
        broker.stop()
