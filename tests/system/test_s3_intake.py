"""The intake on object storage (intake.url=s3://…), end to end with real clients, a real SeaweedFS and PostgreSQL:
a broker whose data dir is deleted after a kill -9 serves every acknowledged record from the bucket and the idempotent
producer goes on; a store stopped for 30 s under load gets retriable refusals, nothing acknowledged meanwhile, and
produce resumes by itself losing nothing.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import KafkaError, Producer

from icelog.errors import is_retriable
from icelog.faults import FAULT_ENV
from tests.support.broker import BrokerProcess
from tests.support.postgres import PostgresCluster
from tests.support.reading import read_partition
from tests.support.seaweedfs import BUCKET, SeaweedFS
from tests.system.test_crash import BROKER_ENV, PARTITIONS, Workload, create_topic, make_producer

OUTAGE_S = 30


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[SeaweedFS]:
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    yield store
    store.discard()


def s3_broker(data_dir: Path, store: SeaweedFS, meta_url: str, flag: bool = False) -> BrokerProcess:
    """A broker whose intake is s3://BUCKET/cluster-a: named by ICELOG_INTAKE__URL, or by `--intake-url` (`flag`)."""
    url = f"s3://{BUCKET}/cluster-a"
    env = {**BROKER_ENV, **store.env(), "ICELOG_META_URL": meta_url, "ICELOG_INTAKE__COMMIT_INTERVAL_MS": "100"}
    if flag:
        return BrokerProcess(data_dir, env=env, extra_args=["--intake-url", url])
    return BrokerProcess(data_dir, env={**env, "ICELOG_INTAKE__URL": url})


def test_an_intake_url_that_is_not_s3_stops_start_up_saying_why(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "icelog", "serve", "--intake-url", "http://store/intake",
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--intake-url: intake.url must be s3://BUCKET[/PREFIX]" in done.stderr + done.stdout


def check_every_acknowledged_record(broker: BrokerProcess, work: Workload) -> None:
    """Each partition holds exactly what was sent to it, every acknowledged record at its acknowledged offset."""
    for partition in range(PARTITIONS):
        log_values, _ = read_partition(broker.bootstrap, "events", partition)
        for value in work.sent[partition]:
            if value in work.deliveries.acked:
                _, offset = work.deliveries.acked[value]
                assert offset < len(log_values) and log_values[offset] == value, "an acknowledged record lost"
        assert len(log_values) == len(set(log_values)), "a record written twice"
        assert set(log_values) <= set(work.sent[partition]), "a record nobody sent"


def test_a_broker_whose_data_dir_is_deleted_serves_everything_from_the_bucket(
    postgres_cluster: PostgresCluster, bucket: SeaweedFS, tmp_path: Path,
) -> None:
    broker = s3_broker(tmp_path / "data", bucket, postgres_cluster.new_database()).start()
    try:
        create_topic(broker, "events", PARTITIONS)
        producer = make_producer(broker)  # idempotent, acks=all
        work = Workload(producer, "events", random.Random(11))
        work.run(2)
        assert producer.flush(30) == 0 and work.deliveries.acked and not work.deliveries.failed
        assert not (broker.data_dir / "intake").exists(), "nothing of the intake on the broker's disk"
        assert bucket.keys("cluster-a/intake/"), "the intake is in the bucket"

        broker.kill()
        shutil.rmtree(broker.data_dir)  # the disk is a cache: a fresh broker starts empty
        broker.start()
        check_every_acknowledged_record(broker, work)
        before = {p: len(read_partition(broker.bootstrap, "events", p)[0]) for p in range(PARTITIONS)}

        # The same idempotent producer goes on (its producer id and sequences survive in the store and the bucket):
        # offsets continue, nothing is refused as out of sequence, nothing is written twice.
        work.run(1)
        assert producer.flush(30) == 0 and not work.deliveries.failed, work.deliveries.failed
        check_every_acknowledged_record(broker, work)
        after = {p: len(read_partition(broker.bootstrap, "events", p)[0]) for p in range(PARTITIONS)}
        assert all(after[p] > before[p] for p in range(PARTITIONS)), "offsets continue after the restart"
        assert sum(after.values()) == len(work.deliveries.acked)
    finally:
        broker.stop()


@pytest.mark.slow
def test_the_store_down_for_30s_under_load_refuses_produce_retriably_then_resumes_losing_nothing(
    postgres_cluster: PostgresCluster, bucket: SeaweedFS, tmp_path: Path,
) -> None:
    broker = s3_broker(tmp_path / "data", bucket, postgres_cluster.new_database()).start()
    try:
        create_topic(broker, "events", PARTITIONS)
        producer = make_producer(broker)
        work = Workload(producer, "events", random.Random(7))
        work.run(2)
        assert producer.flush(30) == 0 and work.deliveries.acked

        bucket.stop()
        stopped = time.monotonic()
        deadline = stopped + 30
        while "refusing produce: the object store is unavailable" not in broker.log():
            assert time.monotonic() < deadline, "the broker did not notice the store was gone\n" + broker.log()
            work.run(0.5)
        acked_while_noticing = len(work.deliveries.acked)
        ready = requests.get(f"{broker.metrics_url}/readyz", timeout=10)
        assert ready.status_code == 503 and "object store is unavailable" in ready.text, ready.text
        probe_errors: list[Any] = []
        probe = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0, "acks": "all"})
        probe.produce("events", b"probe", partition=0, on_delivery=lambda err, _m: probe_errors.append(err))
        assert probe.flush(30) == 0
        while time.monotonic() - stopped < OUTAGE_S:
            work.run(1)
        assert broker.proc is not None and broker.proc.poll() is None, "the broker stays up\n" + broker.log()
        assert len(work.deliveries.acked) == acked_while_noticing, "nothing acknowledged while the store is down"
        assert not work.deliveries.failed, "clients retry the refusal by themselves"
        assert probe_errors and probe_errors[0] is not None
        assert probe_errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS and is_retriable(probe_errors[0].code())

        bucket.start()
        work.run(3)
        assert producer.flush(60) == 0
        assert not work.deliveries.failed, work.deliveries.failed
        assert len(work.deliveries.acked) > acked_while_noticing, "produce resumed by itself"
        metrics = requests.get(f"{broker.metrics_url}/metrics", timeout=10).text
        assert 'icelog_object_store_errors_total{kind="put"}' in metrics, "failed PUTs are counted"

        broker.kill()  # what was acknowledged is stored: it survives a kill -9 right after
        broker.start()
        check_every_acknowledged_record(broker, work)
    finally:
        broker.stop()


def test_a_kill_between_the_put_and_the_commit_serves_nothing_of_the_object(bucket: SeaweedFS, tmp_path: Path) -> None:
    """kill -9 right after an object's PUT (ICELOG_TEST_FAULT=intake-object-put): the store never named it, so the
    producer was not acknowledged, the object is deleted at the next start and its offsets go to the next records."""
    broker = s3_broker(tmp_path / "data", bucket, f"sqlite:///{tmp_path / 'meta.db'}")
    broker.env[FAULT_ENV] = "intake-object-put"
    broker.start()
    try:
        create_topic(broker, "events", 1)
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 5000})
        producer.produce("events", b"lost", partition=0, on_delivery=lambda err, _m: errors.append(err))
        producer.flush(10)
        assert broker.proc is not None and broker.proc.wait(30) == 137, "killed at the fault point"
        assert errors and errors[0] is not None, "never acknowledged"
        assert len(bucket.keys("cluster-a/intake/")) == 1, "the PUT went through"

        del broker.env[FAULT_ENV]
        broker.start()
        assert bucket.keys("cluster-a/intake/") == [], "the uncommitted object is deleted at start-up"
        assert read_partition(broker.bootstrap, "events", 0)[0] == []
        fresh = Producer({"bootstrap.servers": broker.bootstrap})
        offsets: list[int] = []
        fresh.produce("events", b"kept", partition=0, on_delivery=lambda _e, m: offsets.append(m.offset()))
        assert fresh.flush(30) == 0 and offsets == [0]
        assert read_partition(broker.bootstrap, "events", 0)[0] == [b"kept"]
    finally:
        broker.stop()


def test_a_kill_after_the_commit_before_the_answer_keeps_the_offsets_and_dedups_the_retry(
    bucket: SeaweedFS, tmp_path: Path,
) -> None:
    """kill -9 right after the sequencer's commit (ICELOG_TEST_FAULT=intake-object-committed), before the answer: the
    records are stored at the offsets the commit assigned; the idempotent producer's retry to the restarted broker is
    answered with those offsets, not written again, and the next records follow them."""
    broker = s3_broker(tmp_path / "data", bucket, f"sqlite:///{tmp_path / 'meta.db'}")
    broker.env[FAULT_ENV] = "intake-object-committed"
    broker.start()
    try:
        create_topic(broker, "events", 1)
        delivered: dict[bytes, int] = {}
        errors: list[Any] = []

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered[msg.value()] = msg.offset()

        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                             "message.timeout.ms": 120000, "reconnect.backoff.max.ms": 500})
        producer.produce("events", b"committed-0", partition=0, on_delivery=report)
        producer.produce("events", b"committed-1", partition=0, on_delivery=report)
        producer.flush(1)
        assert broker.proc is not None and broker.proc.wait(30) == 137, "killed at the fault point"
        assert not delivered, "never answered"

        del broker.env[FAULT_ENV]
        broker.start()
        assert producer.flush(90) == 0 and not errors, errors
        assert delivered == {b"committed-0": 0, b"committed-1": 1}, "the retry answered with the assigned offsets"
        producer.produce("events", b"after", partition=0, on_delivery=report)
        assert producer.flush(30) == 0 and delivered[b"after"] == 2
        got = read_partition(broker.bootstrap, "events", 0)[0]
        assert got == [b"committed-0", b"committed-1", b"after"], "nothing twice"
    finally:
        broker.stop()


def test_an_open_transaction_is_resolved_by_a_fresh_broker_from_the_store_and_the_bucket(
    postgres_cluster: PostgresCluster, bucket: SeaweedFS, tmp_path: Path,
) -> None:
    """kill -9 with a transaction open, data dir deleted: the fresh broker knows the transaction (metadata store) and
    its batches (bucket), aborts it at its timeout, and read_committed consumers see only what was committed."""
    from tests.coordinator.test_transactions import end_offsets, read_values, wait_for

    broker = s3_broker(tmp_path / "data", bucket, postgres_cluster.new_database(), flag=True).start()
    try:
        bootstrap, topic = broker.bootstrap, "txn"
        create_topic(broker, topic, 1)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "s3-crash",
                             "transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, value=b"committed")
        producer.commit_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, value=b"in-flight")
        producer.flush(30)
        assert bucket.keys("cluster-a/intake/"), "--intake-url put the intake in the bucket"

        broker.kill()
        shutil.rmtree(broker.data_dir)
        broker.start()

        assert read_values(bootstrap, topic, 1, "read_uncommitted") == [b"committed", b"in-flight"]
        wait_for(lambda: end_offsets(bootstrap, topic, 1, "read_committed")
                 == end_offsets(bootstrap, topic, 1, "read_uncommitted"), "the open transaction to time out")
        assert read_values(bootstrap, topic, 1, "read_committed") == [b"committed"]
        fresh = Producer({"bootstrap.servers": bootstrap, "transactional.id": "s3-crash"})
        fresh.init_transactions(30)
        fresh.begin_transaction()
        fresh.produce(topic, value=b"after")
        fresh.commit_transaction(30)
        assert read_values(bootstrap, topic, 1, "read_committed") == [b"committed", b"after"]
    finally:
        broker.stop()
