"""A broker whose metadata store is PostgreSQL (meta_url=postgresql://…), with real clients: it serves and restarts
with everything, and a PostgreSQL that goes away for half a minute under load costs no acknowledged record.

(kill -9 under load on PostgreSQL is test_crash.py's test, run over both backends.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from icelog.errors import is_retriable
from tests.support.broker import BrokerProcess
from tests.support.postgres import PASSWORD, PostgresCluster, start_cluster
from tests.support.reading import read_partition
from tests.system.test_crash import BROKER_ENV, PARTITIONS, Workload, create_topic, make_producer

OUTAGE_S = 30


def pg_broker(data_dir: Path, url: str) -> BrokerProcess:
    return BrokerProcess(data_dir, env={**BROKER_ENV, "ICELOG_META_URL": url})


def test_a_broker_on_postgresql_serves_clients_and_restarts_with_everything(
    postgres_cluster: PostgresCluster, tmp_path: Path,
) -> None:
    url = postgres_cluster.new_database()
    broker = pg_broker(tmp_path / "data", url).start()
    try:
        create_topic(broker, "orders", 2)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        sent = [f"order-{i}".encode() for i in range(500)]
        for i, value in enumerate(sent):
            producer.produce("orders", value, key=str(i % 7).encode(), partition=i % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "billing",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe(["orders"])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(message.value())
        consumer.commit(asynchronous=False)
        partitions = [TopicPartition("orders", p) for p in (0, 1)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(partitions)}
        consumer.close()
        assert len(got) >= 300 and set(got) <= set(sent)

        broker.kill()  # not even a clean stop: the metadata must all be in PostgreSQL already
        broker.start()
        values = read_partition(broker.bootstrap, "orders", 0)[0] + read_partition(broker.bootstrap, "orders", 1)[0]
        assert sorted(values) == sorted(sent)
        again = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "billing"})
        after = {tp.partition: tp.offset for tp in again.committed(partitions)}
        again.close()
        assert after == committed and sum(after.values()) >= 300
        assert not (broker.data_dir / "meta.db").exists(), "no SQLite store beside PostgreSQL"
        assert PASSWORD not in broker.log(), "the password is never logged"
    finally:
        broker.stop()


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of the test's own: it is stopped and started."""
    cluster = start_cluster()
    yield cluster
    cluster.destroy()


@pytest.mark.slow
def test_postgresql_down_for_30s_under_load_refuses_produce_retriably_then_resumes_losing_nothing(
    own_cluster: PostgresCluster, tmp_path: Path,
) -> None:
    broker = pg_broker(tmp_path / "data", own_cluster.new_database()).start()
    try:
        create_topic(broker, "events", PARTITIONS)
        producer = make_producer(broker)
        producer_config_timeout_s = 60  # make_producer's message.timeout.ms: each record's delivery is retried so long
        work = Workload(producer, "events", random.Random(7))
        work.run(2)
        assert producer.flush(30) == 0 and work.deliveries.acked

        own_cluster.stop("fast")
        stopped = time.monotonic()
        acked_at_stop = len(work.deliveries.acked)
        work.run(3)  # the store's absence is noticed within the pool's wait (3 s), later on a loaded machine:
        deadline = time.monotonic() + 30  # the probe below must come after the broker has noticed (its one line)
        while "refusing produce: the metadata store is unavailable" not in broker.log():
            assert time.monotonic() < deadline, "the broker did not notice the store was gone\n" + broker.log()
            work.run(0.5)
        acked_while_noticing = len(work.deliveries.acked)
        probe_errors: list[Any] = []
        probe = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0, "acks": "all"})
        probe.produce("events", b"probe", partition=0, on_delivery=lambda err, _m: probe_errors.append(err))
        assert probe.flush(30) == 0
        while time.monotonic() - stopped < OUTAGE_S:
            work.run(1)
        assert broker.proc is not None and broker.proc.poll() is None, "the broker stays up\n" + broker.log()
        assert len(work.deliveries.acked) == acked_while_noticing, "nothing acknowledged while the store is down"
        assert not work.deliveries.failed, "clients retry the refusal by themselves"
        # A client that does not retry sees the code icelog refuses with: retriable in Kafka's protocol (the workload's
        # producer retried the same answer by itself), nothing written. (librdkafka's delivery-report error objects
        # say retriable() False once a client's own retries are spent, whatever the code.)
        assert probe_errors and probe_errors[0] is not None
        assert probe_errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS and is_retriable(probe_errors[0].code())

        own_cluster.start()
        work.run(3)
        assert producer.flush(producer_config_timeout_s) == 0
        assert len(work.deliveries.acked) > acked_at_stop, "produce resumed by itself"
        assert not work.deliveries.failed, work.deliveries.failed
        log = broker.log()
        assert log.count("refusing produce: the metadata store is unavailable") == 1, log
        assert "produce resumes" in log and PASSWORD not in log

        broker.kill()  # what was acknowledged is stored: it survives a kill -9 right after
        broker.start()
        produced_in = {value: p for p, values in enumerate(work.sent) for value in values}
        for partition in range(PARTITIONS):
            log_values, _ = read_partition(broker.bootstrap, "events", partition)
            assert all(produced_in.get(v) == partition for v in log_values), "a record nobody sent"
            for value in work.sent[partition]:
                _, offset = work.deliveries.acked[value]
                assert offset < len(log_values) and log_values[offset] == value, "an acknowledged record lost"
            assert set(log_values) == set(work.sent[partition]), "records missing"
    finally:
        broker.stop()
