"""Transactions on three brokers over one PostgreSQL and one SeaweedFS bucket (issue 46): each transactional id has
one coordinator (the broker leading its coordinator shard), which writes the markers of partitions other brokers lead
with WriteTxnMarkers; a partition leader that is not the coordinator verifies transactional batches from the store;
when the coordinator is killed -9 mid-transaction another takes the id over from the store, and the producer
recovers or is fenced as Kafka's would be, read_committed consumers seeing the transaction whole or not at all.
Kafka's clients find the coordinator with FindCoordinator (key type 1), which must name view.txn_coordinator(id).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from icelog.cluster.view import TXN_SHARDS_ID, coordinator_shard, rendezvous
from icelog.faults import FAULT_ENV
from icelog.meta.backends import open_store
from tests.coordinator.test_transactions import (
    INVALID_TXN_STATE,
    _add_partitions_to,
    _end,
    _init,
)
from tests.support.cluster import BrokerCluster, three_brokers
from tests.support.postgres import PostgresCluster
from tests.support.reading import read_committed as read_committed_records
from tests.support.seaweedfs import SeaweedFS
from tests.support.wire_client import RawClient, build_batch

pytestmark = pytest.mark.slow

TOPIC, PARTITIONS = "txn-events", 6
NOT_COORDINATOR = 16


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[SeaweedFS]:
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    yield store
    store.discard()


@pytest.fixture
def cluster(postgres_cluster: PostgresCluster, tmp_path: Path) -> Iterator[tuple[BrokerCluster, str]]:
    with three_brokers(postgres_cluster, tmp_path, {TOPIC: PARTITIONS}) as brokers:
        yield brokers, brokers.meta_url


def coordinator_of(meta_url: str, transactional_id: str, timeout: float = 30.0) -> int:
    """The node holding the transactional id's coordinator shard, as the store has it."""
    store = open_store(meta_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            held = store.leaderships().get((TXN_SHARDS_ID, coordinator_shard(transactional_id)))
            if held is not None and held.holder is not None:
                return held.holder.node_id
            assert time.monotonic() < deadline, f"nobody took the shard of {transactional_id!r}"
            time.sleep(0.2)
    finally:
        store.close()


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})


def produce_all(producer: Producer, tag: str) -> list[bytes]:
    values = [f"{tag}-{p}".encode() for p in range(PARTITIONS)]
    for partition, value in enumerate(values):
        producer.produce(TOPIC, value=value, partition=partition)
    assert producer.flush(60) == 0, f"{tag}: records not acknowledged"
    return values


def read_committed(bootstrap: str, expected: int) -> list[bytes]:
    return read_committed_records(bootstrap, TOPIC, PARTITIONS, expected, timeout=45.0)


def leaders(brokers: BrokerCluster) -> dict[int, int]:
    return brokers.wait_settled((TOPIC,))[TOPIC]


def test_transactions_spanning_brokers_commit_and_abort_whole(cluster: tuple[BrokerCluster, str]) -> None:
    brokers, meta_url = cluster
    led = leaders(brokers)
    coordinator = coordinator_of(meta_url, "tx-a")
    assert len(set(led.values())) >= 2, f"the partitions should live on several brokers: {led}"
    assert any(node != coordinator for node in led.values()), "a partition led elsewhere"

    # The transaction APIs are answered by the coordinator only; a partition leader that is not the coordinator
    # verifies a transactional batch from the store.
    raw_coordinator = coordinator_of(meta_url, "tx-raw")
    other = next(n for n in range(3) if n != raw_coordinator)
    elsewhere = RawClient(brokers.brokers[other].bootstrap)
    assert _init(elsewhere, "tx-raw").error_code == NOT_COORDINATOR
    elsewhere.close()
    client = RawClient(brokers.brokers[raw_coordinator].bootstrap)
    init = _init(client, "tx-raw")
    assert init.error_code == 0
    pid, epoch = init.producer_id, init.producer_epoch
    raw_leader = next(p for p, node in led.items() if node != raw_coordinator)
    leader = RawClient(brokers.brokers[led[raw_leader]].bootstrap)
    batch = build_batch([b"raw-in-txn"], pid, epoch, 0, transactional=True)
    assert _produce_txn(leader, "tx-raw", raw_leader, batch) == INVALID_TXN_STATE, "not added to the transaction"
    assert _add_partitions_to(client, "tx-raw", pid, epoch, TOPIC, raw_leader) == 0
    assert _produce_txn(leader, "tx-raw", raw_leader, batch) == 0
    assert _end(client, "tx-raw", pid, epoch, commit=True) == 0  # its marker goes to the leader as WriteTxnMarkers
    late = build_batch([b"raw-after-the-end"], pid, epoch, 1, transactional=True)
    assert _produce_txn(leader, "tx-raw", raw_leader, late) == INVALID_TXN_STATE, "the transaction is over"
    client.close()
    leader.close()

    producer = transactional_producer(brokers.bootstrap, "tx-a")
    producer.init_transactions(30)
    committed = [b"raw-in-txn"]
    for n in range(4):
        producer.begin_transaction()
        values = produce_all(producer, f"a{n}")
        if n % 2 == 0:
            producer.commit_transaction(30)
            committed += values
        else:
            producer.abort_transaction(30)
    seen = read_committed(brokers.bootstrap, len(committed))
    assert sorted(seen) == sorted(committed), "read_committed sees exactly the committed transactions, once"


def test_a_killed_coordinator_is_taken_over_and_a_zombie_is_fenced(cluster: tuple[BrokerCluster, str]) -> None:
    brokers, meta_url = cluster
    leaders(brokers)
    producer = transactional_producer(brokers.bootstrap, "tx-b")
    producer.init_transactions(30)
    producer.begin_transaction()
    committed = produce_all(producer, "b0")
    producer.commit_transaction(30)

    # Mid-transaction (its records acknowledged, no EndTxn yet) the coordinator dies.
    producer.begin_transaction()
    open_values = produce_all(producer, "b1")
    dead = coordinator_of(meta_url, "tx-b")
    brokers.brokers[dead].kill()
    outcome = _commit_or_abort(producer)
    successor = coordinator_of_other_than(meta_url, "tx-b", dead)
    assert successor != dead
    if outcome == "committed":
        committed += open_values
    seen = read_committed(brokers.bootstrap, len(committed))
    assert sorted(seen) == sorted(committed), f"the transaction whole or not at all ({outcome})"

    if outcome != "fenced":
        # A zombie: the old producer has an open transaction when a new one with its id initialises.
        producer.begin_transaction()
        produce_all(producer, "b2")
    zombie = producer
    successor_producer = transactional_producer(brokers.bootstrap, "tx-b")
    successor_producer.init_transactions(30)  # fences the old producer, aborts its open transaction
    if outcome != "fenced":
        with pytest.raises(KafkaException) as fenced:
            zombie.commit_transaction(30)
        assert fenced.value.args[0].fatal() or fenced.value.args[0].txn_requires_abort(), fenced.value
    successor_producer.begin_transaction()
    committed += produce_all(successor_producer, "b3")
    successor_producer.commit_transaction(30)
    seen = read_committed(brokers.bootstrap, len(committed))
    assert sorted(seen) == sorted(committed), "the zombie's open transaction is aborted, the new one committed"


def test_a_commit_prepared_by_a_coordinator_that_died_is_completed_by_the_next(
    postgres_cluster: PostgresCluster, tmp_path: Path,
) -> None:
    """The coordinator dies right after storing PrepareCommit, before any marker: the broker taking its shard
    writes every marker (most to other brokers' partitions), and the producer's EndTxn retry is answered."""
    # Rendezvous hashing is deterministic: the shard's broker among nodes 0-2 is known before they start.
    doomed = rendezvous((TXN_SHARDS_ID, coordinator_shard("tx-c")), range(3))
    assert doomed is not None
    with three_brokers(postgres_cluster, tmp_path, {TOPIC: PARTITIONS},
                       node_env={doomed: {FAULT_ENV: "txn-prepared"}}) as brokers:
        meta_url = brokers.meta_url
        led = leaders(brokers)
        assert coordinator_of(meta_url, "tx-c") == doomed
        assert any(node != doomed for node in led.values())
        producer = transactional_producer(brokers.bootstrap, "tx-c")
        producer.init_transactions(30)
        producer.begin_transaction()
        values = produce_all(producer, "c0")
        outcome = _commit_or_abort(producer)  # the coordinator exits at PrepareCommit
        assert brokers.brokers[doomed].proc is not None and brokers.brokers[doomed].proc.wait(30) == 137
        assert outcome == "committed", "PrepareCommit is stored: the next coordinator commits it"
        seen = read_committed(brokers.bootstrap, len(values))
        assert sorted(seen) == sorted(values), "the prepared transaction committed whole"
        successor = coordinator_of(meta_url, "tx-c")
        assert "completing transaction tx-c left in PrepareCommit" in brokers.brokers[successor].log()


def _commit_or_abort(producer: Producer) -> str:
    """What Kafka's client makes of a commit whose coordinator died: "committed" once EndTxn reaches the new
    coordinator, "aborted" if the client asks to abort (abortable error), "fenced" if fatal."""
    try:
        producer.commit_transaction(60)
        return "committed"
    except KafkaException as exc:
        error = exc.args[0]
        if error.txn_requires_abort():
            producer.abort_transaction(60)
            return "aborted"
        if error.retriable():
            producer.commit_transaction(60)
            return "committed"
        assert error.fatal(), error
        return "fenced"


def coordinator_of_other_than(meta_url: str, transactional_id: str, dead: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        node = coordinator_of(meta_url, transactional_id)
        if node != dead or time.monotonic() > deadline:
            return node
        time.sleep(0.2)


def _produce_txn(client: RawClient, transactional_id: str, partition: int, records: bytes) -> Any:
    """A Produce's error code, the request naming its transactional id (as Kafka's clients do)."""
    request = ProduceRequest(transactional_id=transactional_id, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=records)])])
    response = client.request(request, 8, ProduceResponse)
    return response.responses[0].partition_responses[0].error_code
