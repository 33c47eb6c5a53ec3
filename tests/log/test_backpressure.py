"""The broker keeps its pace while the lake works: back-pressure, and the archiver below the broker's CPU priority.

Back-pressure: a lake that cannot keep up slows, then refuses, producers; they resume by themselves.

Real `icelog serve` processes, a real librdkafka producer (confluent-kafka) and kafka-python, the session's
Spark archiver (tests/conftest.py, tests/support/archive.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaProducer
from kafka.errors import NotEnoughReplicasError

from icelog.archive.archiver import Archiver
from icelog.meta.store import MetadataStore
from tests.support.archive import create_topic
from tests.support.broker import BrokerProcess

BOUND = 200_000
VALUE_SIZE = 1000
BATCH_BYTES = 20_000


@pytest.mark.slow
def test_producer_is_throttled_then_held_at_the_bound_then_completes_exactly_once_in_order(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "archive-backpressure"
    create_topic(lake_broker, topic, partitions=1, configs={"icelog.archive.max.lag.bytes": str(BOUND)})
    topic_id = lake_store.get_topic(topic).topic_id
    throttles: list[int] = []
    delivered: list[tuple[int, bytes]] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.offset(), msg.value()))

    producer = Producer({
        "bootstrap.servers": lake_broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
        "batch.size": BATCH_BYTES, "compression.type": "none", "message.timeout.ms": 600_000,
        "retry.backoff.max.ms": 1000, "throttle_cb": lambda event: throttles.append(event.throttle_time),
    })
    sent = [b"%06d" % i + b"x" * (VALUE_SIZE - 6) for i in range(3 * BOUND // VALUE_SIZE)]
    for value in sent:
        producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)

    # No archiver runs: the producer is slowed past 80 % of the bound, then held at the bound.
    assert producer.flush(15) > 0, "everything was accepted although nothing was archived"
    assert not errors, errors  # refused batches are retried by the client, not failed
    assert throttles and max(throttles) > 0
    stored = sum(c.length for c in lake_store.intake_chunks(topic_id))
    assert BOUND * 0.8 <= stored <= BOUND + 2 * BATCH_BYTES  # the intake stopped growing at the bound

    # The lake catches up: the producer resumes by itself, pass after pass.
    for _ in range(40):
        lake_archiver.run_pass(force=True, topics=[topic])
        if producer.flush(5) == 0:
            break
    assert producer.flush(0) == 0 and not errors, errors
    assert [v for _, v in sorted(delivered)] == sent
    assert [o for o, _ in sorted(delivered)] == list(range(len(sent)))

    consumer = Consumer({"bootstrap.servers": lake_broker.bootstrap, "group.id": "bp", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    read: list[bytes] = []
    while len(read) < len(sent):
        msg = consumer.poll(10)
        assert msg is not None, f"read {len(read)} of {len(sent)}"
        if msg.error() is None:
            read.append(msg.value())
        else:
            assert msg.error().code() == KafkaError._PARTITION_EOF
    consumer.close()
    assert read == sent  # every message once, in order


def test_produce_is_refused_with_a_retriable_error_when_the_disk_is_low(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env={"ICELOG_INTAKE__MIN_FREE_BYTES": str(10**18)}).start()
    try:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0, acks="all")
        future = producer.send("low-disk", b"not stored")
        with pytest.raises(NotEnoughReplicasError) as refused:
            future.get(30)
        assert refused.value.retriable
        producer.close()
    finally:
        broker.stop()


def test_throttle_grows_from_80_percent_and_refusal_is_retriable_at_the_bound() -> None:

    from icelog.errors import ErrorCode, KafkaApiError
    from icelog.log.pressure import THROTTLE_MAX_MS, admission

    assert admission("t", 799, 1000, None, 0) == 0
    ramp = [admission("t", n, 1000, None, 0) for n in (800, 900, 999)]
    assert 0 < ramp[0] < ramp[1] < ramp[2] <= THROTTLE_MAX_MS + 1
    with pytest.raises(KafkaApiError) as refused:
        admission("t", 1000, 1000, None, 0)
    assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS and "max.lag.bytes" in refused.value.message
    assert admission("t", 10**12, None, 10**9, 10**6) == 0  # not archived: no lag bound
    with pytest.raises(KafkaApiError, match="min_free_bytes"):
        admission("t", 0, None, 10, 100)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # field 4 (ppid), after the command name
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.spark  # the broker's archiver starts Spark
def test_the_archiver_and_its_spark_run_below_the_brokers_cpu_priority(tmp_path: Path) -> None:
    import os
    import time

    broker = BrokerProcess(
        tmp_path / "data", env={"ICELOG_ARCHIVE__ENABLED": "true", "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
                                 "ICELOG_ARCHIVE__NICE": "10"},  # (the tests' own default: 0)
    ).start()
    try:
        create_topic(broker, "niced", partitions=1)  # an archived topic: the archiver starts Spark
        assert broker.proc is not None
        deadline = time.monotonic() + 180
        jvm: list[int] = []
        archiver: list[int] = []
        while not jvm:
            assert time.monotonic() < deadline, broker.log()[-3000:]
            archiver = _children(broker.proc.pid)
            jvm = [c for a in archiver for c in _children(a)]
            time.sleep(0.5)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, broker.proc.pid) == own
        expected = [min(19, own + 10)] * len(archiver + jvm)  # archive.nice, added to the broker's
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in archiver + jvm] == expected
    finally:
        broker.stop()
