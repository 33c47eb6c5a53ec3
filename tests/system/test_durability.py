"""Acknowledged means durable: a broker killed at the worst moment of each durable write (the
ICELOG_TEST_FAULT hook, icelog/faults.py) keeps, after a restart, everything it had done before it could
answer. A kill cannot show a power loss; tests/meta/test_meta_store.py checks that each of these writes is
fsync'd (synchronous=FULL) before it returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import requests
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetCommitResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from icelog.log import intake_file
from icelog.meta.sqlite import SqliteStore
from tests.coordinator.test_transactions import _add_partitions, _end, _init, read_values
from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient, build_batch

pytestmark = pytest.mark.crash
KILLED = 137
HOUR_MS = 3_600_000


def create_topic(broker: BrokerProcess, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=configs or {})]).values():
        future.result(timeout=20)


def start_with_fault(broker: BrokerProcess, point: str) -> None:
    broker.env["ICELOG_TEST_FAULT"] = point
    broker.start()


def restart_after_fault(broker: BrokerProcess, timeout: float = 30) -> None:
    """Wait for the fault hook to kill the broker (exit 137), then start it without the hook."""
    assert broker.proc is not None
    broker.proc.wait(timeout)
    assert broker.proc.returncode == KILLED, f"the broker should have died at the fault point:\n{broker.log()}"
    broker.env.pop("ICELOG_TEST_FAULT")
    broker.start()


def unanswered(call: Callable[[], object]) -> None:
    """The request the broker dies on gets no answer: the connection closes."""
    with pytest.raises((ConnectionError, OSError)):
        call()


def test_committed_offsets_are_stored_before_the_answer(fresh_broker: BrokerProcess) -> None:
    start_with_fault(fresh_broker, "offsets-stored")
    create_topic(fresh_broker, "durable-offsets", 1)
    client = RawClient(fresh_broker.bootstrap)
    request = OffsetCommitRequest(
        group_id="g", generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1,
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name="durable-offsets", partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=42, committed_metadata="m")])],
    )
    unanswered(lambda: client.request(request, 2, OffsetCommitResponse))
    restart_after_fault(fresh_broker)

    consumer = Consumer({"bootstrap.servers": fresh_broker.bootstrap, "group.id": "g"})
    try:
        (committed,) = consumer.committed([TopicPartition("durable-offsets", 0)], timeout=20)
    finally:
        consumer.close()
    assert committed.offset == 42


def test_a_producer_id_block_is_stored_before_any_id_of_it_is_handed_out(fresh_broker: BrokerProcess) -> None:
    start_with_fault(fresh_broker, "producer-ids-stored")
    client = RawClient(fresh_broker.bootstrap)
    request = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
    unanswered(lambda: client.request(request, 1, InitProducerIdResponse))
    restart_after_fault(fresh_broker)

    client = RawClient(fresh_broker.bootstrap)
    given = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 1,
                           InitProducerIdResponse)
    client.close()
    assert given.error_code == 0
    assert given.producer_id >= 1000, "no id of the block stored before the crash (0-999) is handed out again"


def _open_transaction(broker: BrokerProcess, topic: str, txn_id: str) -> tuple[RawClient, int, int]:
    client = RawClient(broker.bootstrap)
    init = _init(client, txn_id)
    pid, epoch = init.producer_id, init.producer_epoch
    assert _add_partitions(client, txn_id, pid, epoch, topic, 1) == 0
    assert client.produce(topic, 0, build_batch([b"decided"], pid, epoch, 0, transactional=True))[0] == 0
    return client, pid, epoch


@pytest.mark.parametrize("point", ["txn-prepared", "txn-completed"])
def test_a_transaction_the_broker_died_completing_commits(fresh_broker: BrokerProcess, point: str) -> None:
    """EndTxn(commit) killed after PrepareCommit (no marker yet) or after CompleteCommit (not answered)."""
    start_with_fault(fresh_broker, point)
    topic = f"durable-{point}"
    create_topic(fresh_broker, topic, 1)
    client, pid, epoch = _open_transaction(fresh_broker, topic, point)
    unanswered(lambda: _end(client, point, pid, epoch, commit=True))
    restart_after_fault(fresh_broker)

    assert read_values(fresh_broker.bootstrap, topic, 1, "read_committed") == [b"decided"]
    client = RawClient(fresh_broker.bootstrap)
    assert _end(client, point, pid, epoch, commit=True) == 0, "the client's retry learns it committed"
    client.close()


def test_a_registered_schema_keeps_its_id(fresh_broker: BrokerProcess) -> None:
    start_with_fault(fresh_broker, "schema-stored")
    url = f"{fresh_broker.registry_url}/subjects/durable-value/versions"
    schema = {"schemaType": "PROTOBUF", "schema": 'syntax = "proto3"; message Order { int64 id = 1; }'}
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(url, json=schema, timeout=30)
    restart_after_fault(fresh_broker)

    latest = requests.get(f"{url}/latest", timeout=30).json()
    again = requests.post(url, json=schema, timeout=30).json()
    assert latest["version"] == 1 and again["id"] == latest["id"]


def test_intake_files_outlive_the_index_entries_that_name_them(fresh_broker: BrokerProcess) -> None:
    """Killed after a retention trim is stored, before the files it released are deleted."""
    fresh_broker.env.update({"ICELOG_RETENTION_CHECK_INTERVAL_MS": "200", "ICELOG_INTAKE__SEGMENT_BYTES": "4096"})
    start_with_fault(fresh_broker, "trim-committed")
    topic = "durable-trim"
    create_topic(fresh_broker, topic, 1)
    producer = Producer({"bootstrap.servers": fresh_broker.bootstrap, "linger.ms": 0})
    now_ms = int(time.time() * 1000)
    values = [b"old-%d" % i + b"." * 300 for i in range(20)] + [b"new-%d" % i for i in range(10)]
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=0, timestamp=now_ms - 2 * HOUR_MS if i < 20 else now_ms)
        assert producer.flush(10) == 0  # one group commit each: the old records span several intake files
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": str(HOUR_MS)})
    for future in admin.alter_configs([resource]).values():
        future.result(timeout=20)
    restart_after_fault(fresh_broker)  # the first trim killed it

    store = SqliteStore(fresh_broker.data_dir / "meta.db")
    try:
        chunks = store.intake_chunks()
        (partition,) = store.partitions(store.get_topic(topic).topic_id)  # type: ignore[union-attr]
    finally:
        store.close()
    files = set(intake_file.list_files(fresh_broker.data_dir / "intake"))
    assert partition.log_start_offset == 20, "the trim survived the kill"
    assert {c.file_id for c in chunks} <= files, "every indexed chunk's file still exists"
    assert all(c.end_offset > partition.log_start_offset for c in chunks)
    assert read_values(fresh_broker.bootstrap, topic, 1, "read_uncommitted") == values[20:]
