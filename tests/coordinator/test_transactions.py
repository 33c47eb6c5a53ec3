"""Transactions with real clients: commit/abort visibility, timeouts, fencing, exactly-once copy jobs."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient, build_batch

COPY_JOB = Path(__file__).parents[1] / "support" / "copy_job.py"
WAIT_S = 90  # an upper bound for progress, not a performance assertion


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        consumer.close()
    return {tp.partition: offset for tp, offset in ends.items()}


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[bytes]:
    """Every value a consumer with this isolation level sees, up to the end for that level."""
    ends = end_offsets(bootstrap, topic, partitions, isolation)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    from confluent_kafka import TopicPartition as CTP

    consumer.assign([CTP(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    done: set[int] = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + WAIT_S
    while len(done) < partitions and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == -191:  # partition EOF
                done.add(msg.partition())
            continue
        values.append(msg.value())
    consumer.close()
    assert len(done) == partitions, "reached the end of every partition"
    return values


def test_aborted_records_are_invisible_to_read_committed_only(broker: BrokerProcess) -> None:
    bootstrap, topic = broker.bootstrap, "txn-visibility"
    create_topic(bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "visibility"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"commit-%d" % i, partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"abort-%d" % i, partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=b"later-%d" % i, partition=i % 2)
    producer.commit_transaction(30)

    committed = read_values(bootstrap, topic, 2, "read_committed")
    everything = read_values(bootstrap, topic, 2, "read_uncommitted")
    expected = {b"commit-%d" % i for i in range(10)} | {b"later-%d" % i for i in range(4)}
    assert sorted(committed) == sorted(expected)
    assert sorted(everything) == sorted(expected | {b"abort-%d" % i for i in range(10)})


def test_kafka_python_transactions_and_read_committed(broker: BrokerProcess) -> None:
    bootstrap, topic = broker.bootstrap, "txn-kafka-python"
    create_topic(bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-txn")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"kept")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send(topic, b"dropped")
    producer.flush()
    producer.abort_transaction()
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    values = [r.value for r in consumer]
    consumer.close()
    assert values == [b"kept"]


def test_open_transaction_past_its_timeout_is_aborted(broker: BrokerProcess) -> None:
    bootstrap, topic = broker.bootstrap, "txn-timeout"
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "timeout",
            "transaction.timeout.ms": 2000,
            "message.timeout.ms": 2000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"left-open")
    producer.flush(30)
    assert end_offsets(bootstrap, topic, 1, "read_committed") == {0: 0}, "an open transaction holds the LSO"

    wait_for(
        lambda: (
            end_offsets(bootstrap, topic, 1, "read_committed")
            == end_offsets(bootstrap, topic, 1, "read_uncommitted")
        ),
        "the broker to abort the transaction",
    )
    assert read_values(bootstrap, topic, 1, "read_committed") == []
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)  # its epoch was bumped by the abort: fenced


def test_newer_epoch_fences_the_older_producer(broker: BrokerProcess) -> None:
    bootstrap, topic = broker.bootstrap, "txn-fencing"
    create_topic(bootstrap, topic, 1)
    old = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fencing"})
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"zombie")
    old.flush(30)
    new = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fencing"})
    new.init_transactions(30)  # aborts the old producer's open transaction
    new.begin_transaction()
    new.produce(topic, value=b"fresh")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        old.commit_transaction(10)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    assert read_values(bootstrap, topic, 1, "read_committed") == [b"fresh"]


def test_exactly_once_copy_job_killed_midway_outputs_each_record_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap
    source, target, group = "eos-in", "eos-out", "eos-copy"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(400):
        producer.produce(source, value=b"%d" % i, partition=i % 2)
    producer.flush(30)

    def start_job(n: int) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"job-{n}.log", "wb")  # noqa: SIM115 (outlives this function: the child process writes to it)
        return subprocess.Popen(
            [sys.executable, str(COPY_JOB), bootstrap, source, target, group, "eos-copy"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def committed_outputs() -> int:
        return sum(end_offsets(bootstrap, target, 2, "read_committed").values())

    job = start_job(1)
    wait_for(lambda: committed_outputs() >= 120, "the first job to commit some transactions")
    job.send_signal(signal.SIGKILL)  # likely inside an open transaction (see the job's sleep)
    job.wait()
    job = start_job(2)
    try:
        wait_for(lambda: len(read_values(bootstrap, target, 2, "read_committed")) >= 400, "the job to finish")
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            job.kill()
    values = read_values(bootstrap, target, 2, "read_committed")
    counts = collections.Counter(values)
    assert set(counts) == {b"copy-%d" % i for i in range(400)}, "every input record is copied"
    assert [v for v, n in counts.items() if n > 1] == [], "no record is copied twice"


# -- bad input: Kafka's error codes, spoken to over a raw connection --------------------------------
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING = 47, 48, 49
INVALID_TRANSACTION_TIMEOUT, PRODUCER_FENCED = 50, 90


def _init(client: RawClient, txn_id: str, timeout_ms: int = 60000) -> Any:
    request = InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=timeout_ms)
    return client.request(request, 1, InitProducerIdResponse)


def _add_partitions(client: RawClient, txn_id: str, pid: int, epoch: int, topic: str, version: int) -> int:
    request = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
    )
    response = client.request(request, version, AddPartitionsToTxnResponse)
    return int(response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def _end(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 1) -> int:
    request = EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit)
    return int(client.request(request, version, EndTxnResponse).error_code)


def _add_offsets(client: RawClient, txn_id: str, pid: int, epoch: int, group: str) -> int:
    request = AddOffsetsToTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group)
    return int(client.request(request, 1, AddOffsetsToTxnResponse).error_code)


def _txn_offset_commit(client: RawClient, txn_id: str, pid: int, epoch: int, group: str, topic: str) -> int:
    """TxnOffsetCommit v3 of offset 1 of partition 0, as a group without members (generation -1)."""
    Topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    request = TxnOffsetCommitRequest(
        transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
        member_id="", group_instance_id=None, topics=[Topic(name=topic, partitions=[
            Topic.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                                                  committed_metadata="")])])
    response = client.request(request, 3, TxnOffsetCommitResponse)
    return int(response.topics[0].partitions[0].error_code)


def test_a_zombies_txn_offset_commit_is_refused(broker: BrokerProcess) -> None:
    """TxnOffsetCommit is verified against the transaction as Kafka's group coordinator verifies it (KIP-890): the
    group added by AddOffsetsToTxn, the current epoch; a fenced epoch is INVALID_PRODUCER_EPOCH (Kafka converts
    the coordinator's PRODUCER_FENCED so), and what it sent is never committed."""
    bootstrap, topic, group = broker.bootstrap, "txn-offsets-zombie", "zombie-group"
    create_topic(bootstrap, topic, 1)
    client = RawClient(bootstrap)
    first = _init(client, "offsets-zombie")
    pid, epoch = first.producer_id, first.producer_epoch
    assert _txn_offset_commit(client, "offsets-zombie", pid, epoch, group, topic) == INVALID_TXN_STATE, \
        "no AddOffsetsToTxn yet"
    assert _add_offsets(client, "offsets-zombie", pid, epoch, group) == 0
    assert _txn_offset_commit(client, "offsets-zombie", pid + 1, epoch, group, topic) == INVALID_PRODUCER_ID_MAPPING
    second = _init(client, "offsets-zombie")  # a new instance: the open transaction is aborted, the epoch fenced
    assert second.producer_epoch == epoch + 1
    assert _txn_offset_commit(client, "offsets-zombie", pid, epoch, group, topic) == INVALID_PRODUCER_EPOCH
    assert _add_offsets(client, "offsets-zombie", pid, second.producer_epoch, group) == 0
    assert _txn_offset_commit(client, "offsets-zombie", pid, second.producer_epoch, group, topic) == 0
    assert _end(client, "offsets-zombie", pid, second.producer_epoch, commit=False) == 0
    client.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert admin.list_group_offsets(group).get(group, {}) == {}, "neither the zombie's nor the aborted offsets"
    finally:
        admin.close()


def test_transaction_protocol_errors(broker: BrokerProcess) -> None:
    bootstrap, topic = broker.bootstrap, "txn-bad-input"
    create_topic(bootstrap, topic, 1)
    client = RawClient(bootstrap)
    assert _init(client, "bad-timeout", timeout_ms=24 * 3600 * 1000).error_code == INVALID_TRANSACTION_TIMEOUT
    first = _init(client, "bad-input")
    assert first.error_code == 0
    pid, epoch = first.producer_id, first.producer_epoch
    assert _add_partitions(client, "never-initialised", pid, epoch, topic, 1) == INVALID_PRODUCER_ID_MAPPING
    assert _add_partitions(client, "bad-input", pid + 1000, epoch, topic, 1) == INVALID_PRODUCER_ID_MAPPING
    assert _end(client, "bad-input", pid, epoch, commit=True) == INVALID_TXN_STATE, "no transaction is open"
    assert _add_partitions(client, "bad-input", pid, epoch, topic, 1) == 0
    second = _init(client, "bad-input")  # a new producer instance: the old epoch is fenced
    assert (second.producer_id, second.producer_epoch) == (pid, epoch + 1)
    assert _add_partitions(client, "bad-input", pid, epoch, topic, 1) == INVALID_PRODUCER_EPOCH
    assert _add_partitions(client, "bad-input", pid, epoch, topic, 2) == PRODUCER_FENCED
    assert _end(client, "bad-input", pid, epoch, commit=True, version=2) == PRODUCER_FENCED
    stale = client.produce(topic, 0, build_batch([b"zombie"], pid, epoch, 0, transactional=True))
    assert stale[0] == INVALID_PRODUCER_EPOCH, "the fenced epoch cannot write either"
    client.close()


def test_aiokafka_transactions_and_read_committed(broker: BrokerProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    bootstrap, topic = broker.bootstrap, "txn-aiokafka"
    create_topic(bootstrap, topic, 1)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aiokafka-txn")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"kept")
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"dropped")
            await producer.abort_transaction()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            batches = await consumer.getmany(timeout_ms=3000)
            return [r.value for records in batches.values() for r in records]
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [b"kept"]


@pytest.mark.crash
def test_transactions_survive_a_broker_kill(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    bootstrap, topic = fresh_broker.bootstrap, "txn-crash"
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "crash",
            "transaction.timeout.ms": 3000,
            "message.timeout.ms": 3000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"in-flight")
    producer.flush(30)

    fresh_broker.restart()  # SIGKILL with a transaction open

    assert read_values(bootstrap, topic, 1, "read_uncommitted") == [b"committed", b"in-flight"]
    wait_for(
        lambda: (
            end_offsets(bootstrap, topic, 1, "read_committed")
            == end_offsets(bootstrap, topic, 1, "read_uncommitted")
        ),
        "the open transaction to time out",
    )
    assert read_values(bootstrap, topic, 1, "read_committed") == [b"committed"]
    fresh = Producer({"bootstrap.servers": bootstrap, "transactional.id": "crash"})
    fresh.init_transactions(30)
    fresh.begin_transaction()
    fresh.produce(topic, value=b"after")
    fresh.commit_transaction(30)
    assert read_values(bootstrap, topic, 1, "read_committed") == [b"committed", b"after"]


@pytest.mark.crash
def test_restart_finishes_a_commit_that_was_prepared_before_the_crash(fresh_broker: BrokerProcess) -> None:
    """A crash between PrepareCommit and the markers: the restart writes them and commits the offsets."""
    from icelog.meta.sqlite import SqliteStore
    from icelog.meta.store import CommittedOffset

    fresh_broker.start()
    bootstrap, topic = fresh_broker.bootstrap, "txn-prepared"
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "prepared"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"decided")
    producer.flush(30)
    fresh_broker.kill()

    # What EndTxn(commit) records before it writes any marker (the crash came right after).
    store = SqliteStore(fresh_broker.data_dir / "meta.db")
    (record,) = [r for r in store.transactions() if r.transactional_id == "prepared"]
    assert record.state == "Ongoing" and record.partitions == ((topic, 0),)
    # ...with offsets of a group staged by TxnOffsetCommit (its AddOffsetsToTxn added the group first).
    store.save_transaction(replace(record, groups=("prepared-group",)))
    staged = store.stage_txn_offsets("prepared", "prepared-group", record.producer_id, record.producer_epoch,
                                     {("in", 0): CommittedOffset(7)})
    assert staged.staged
    store.save_transaction(replace(record, state="PrepareCommit", groups=("prepared-group",)))
    store.close()

    fresh_broker.start()
    assert read_values(bootstrap, topic, 1, "read_committed") == [b"decided"]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets("prepared-group")["prepared-group"]
    finally:
        admin.close()
    assert {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == "in"} == {0: 7}


# -- transactions cannot pin the last stable offset -------------------------------------------------
def _produce_to(client: RawClient, topic: str, partition: int, records: bytes) -> int:
    return client.produce(topic, partition, records)[0]


def _lso_caught_up(bootstrap: str, topic: str, partitions: int) -> bool:
    return end_offsets(bootstrap, topic, partitions, "read_committed") == end_offsets(
        bootstrap, topic, partitions, "read_uncommitted"
    )


def test_transactional_batch_outside_an_open_transaction_is_refused(broker: BrokerProcess) -> None:
    """Kafka >= 3.6 verifies transactional produce: no AddPartitionsToTxn for the partition, INVALID_TXN_STATE."""
    bootstrap, topic = broker.bootstrap, "txn-unverified"
    create_topic(bootstrap, topic, 2)
    client = RawClient(bootstrap)
    init = _init(client, "unverified")
    pid, epoch = init.producer_id, init.producer_epoch

    stray = build_batch([b"never-opened"], pid, epoch, 0, transactional=True)
    assert _produce_to(client, topic, 0, stray) == INVALID_TXN_STATE, "no transaction is open"
    unknown = build_batch([b"unknown-producer"], pid + 500, 0, 0, transactional=True)
    assert _produce_to(client, topic, 0, unknown) == INVALID_TXN_STATE, "a producer id the coordinator never gave"
    assert _add_partitions(client, "unverified", pid, epoch, topic, 1) == 0  # partition 0 only
    assert _produce_to(client, topic, 1, stray) == INVALID_TXN_STATE, "partition 1 is not in the transaction"
    assert _produce_to(client, topic, 0, build_batch([b"in-txn"], pid, epoch, 0, transactional=True)) == 0
    assert _end(client, "unverified", pid, epoch, commit=True) == 0
    late = build_batch([b"after-the-end"], pid, epoch, 1, transactional=True)
    assert _produce_to(client, topic, 0, late) == INVALID_TXN_STATE, "the transaction is over"
    client.close()

    plain = Producer({"bootstrap.servers": bootstrap})
    for partition in (0, 1):
        plain.produce(topic, value=b"plain-%d" % partition, partition=partition)
    assert plain.flush(30) == 0
    assert _lso_caught_up(bootstrap, topic, 2), "nothing refused left a transaction open"
    assert sorted(read_values(bootstrap, topic, 2, "read_committed")) == [b"in-txn", b"plain-0", b"plain-1"]


@pytest.mark.crash
def test_hanging_transactions_found_at_start_up_are_aborted(fresh_broker: BrokerProcess) -> None:
    """Transactions in the log that no Ongoing transaction owns (a partition its record lacks, a producer
    the coordinator does not know) are aborted by the broker; the one it owns times out as usual."""
    fresh_broker.start()
    bootstrap, topic = fresh_broker.bootstrap, "txn-hanging"
    create_topic(bootstrap, topic, 3)
    client = RawClient(bootstrap)
    owned = _init(client, "hanging", timeout_ms=3000)
    ghost = _init(client, "ghost", timeout_ms=3000)
    for partition in (0, 1):
        assert _add_partitions_to(client, "hanging", owned.producer_id, owned.producer_epoch, topic, partition) == 0
    assert _add_partitions_to(client, "ghost", ghost.producer_id, ghost.producer_epoch, topic, 2) == 0
    for partition, init in ((0, owned), (1, owned), (2, ghost)):
        batch = build_batch([b"open-%d" % partition], init.producer_id, init.producer_epoch, 0, transactional=True)
        assert _produce_to(client, topic, partition, batch) == 0
    client.close()
    plain = Producer({"bootstrap.servers": bootstrap})
    for partition in (0, 1, 2):
        plain.produce(topic, value=b"after-%d" % partition, partition=partition)
    assert plain.flush(30) == 0
    fresh_broker.kill()

    # What the coordinator knows after the crash: "hanging" never added partition 1, and "ghost" belongs
    # to another producer id (so producer `ghost` is unknown to the coordinator).
    from icelog.meta.sqlite import SqliteStore

    store = SqliteStore(fresh_broker.data_dir / "meta.db")
    records = {r.transactional_id: r for r in store.transactions()}
    store.save_transaction(replace(records["hanging"], partitions=((topic, 0),)))
    store.save_transaction(replace(records["ghost"], producer_id=records["ghost"].producer_id + 7, state="Empty",
                                   partitions=()))
    store.close()

    fresh_broker.start()
    wait_for(lambda: _lso_caught_up(bootstrap, topic, 3), "every partition's last stable offset to move on")
    assert sorted(read_values(bootstrap, topic, 3, "read_committed")) == [b"after-0", b"after-1", b"after-2"]
    assert "aborting a hanging transaction" in fresh_broker.log()


def _add_partitions_to(client: RawClient, txn_id: str, pid: int, epoch: int, topic: str, partition: int) -> int:
    request = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[partition])],
    )
    response = client.request(request, 1, AddPartitionsToTxnResponse)
    return int(response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def test_a_hanging_transaction_of_an_unknown_producer_is_aborted_after_the_timeout(tmp_path: Path) -> None:
    """While running: an open transaction no coordinator state owns (written without verification, as
    older brokers accepted) is aborted by the broker once transaction.max.timeout.ms has passed."""
    import asyncio

    from icelog.config import IntakeSettings, Settings
    from icelog.coordinator.groups import GroupCoordinator
    from icelog.coordinator.transactions import TransactionCoordinator
    from icelog.log.manager import LogManager
    from icelog.meta.sqlite import SqliteStore

    async def main() -> None:
        settings = Settings(data_dir=tmp_path, intake=IntakeSettings(fsync=False))
        logs = LogManager(settings, SqliteStore(tmp_path / "meta.db"))
        logs.open()
        logs.start()
        groups = GroupCoordinator(logs.store)
        txns = TransactionCoordinator(logs.store, logs, groups, max_timeout_ms=300)
        try:
            state = logs.create_topic("hanging-runtime", 1, {})
            assert state is not None
            part = state.partitions[0]
            verifier, logs.txn_verifier = logs.txn_verifier, None  # an unverified write
            _, done = logs.append(state, part, build_batch([b"stuck"], 4242, 0, 0, transactional=True))
            await done
            logs.txn_verifier = verifier
            _, done = logs.append(state, part, build_batch([b"after"]))
            await done
            assert part.last_stable_offset == 0 < part.high_watermark
            groups.start()
            txns.start()
            deadline = time.monotonic() + WAIT_S
            # The abort moves the LSO once the marker is indexed, the high watermark once it is durable: wait for both.
            while (part.last_stable_offset, part.high_watermark) != (3, 3) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert part.last_stable_offset == part.high_watermark == 3, "the abort marker moved the LSO on"
            assert [(r.producer_id, r.first_offset) for r in part.aborted_ranges(0, 3)] == [(4242, 0)]
        finally:
            await txns.stop()
            await groups.stop()
            await logs.close()

    asyncio.run(main())
