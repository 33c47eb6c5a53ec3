"""sendOffsetsToTransaction on three brokers over one PostgreSQL and one SeaweedFS bucket (issue 46), the group's
coordinator and the transactional id's coordinator being different brokers (ids chosen so): a confluent-kafka
consume-transform-produce loop (tests/support/eos_steps.py, a child process the test drives step by step) commits its
offsets with each transaction; an aborted transaction leaves the committed offsets as they were; and the group
coordinator's broker killed -9 between TxnOffsetCommit and EndTxn loses nothing: the broker taking the group's shard
loads the pending offsets from the store, the transaction coordinator's marker for (__consumer_offsets, shard)
reaches it, and the offsets land once; the broker then comes back, takes the shard back, and the loop drains the
rest. Read back with OffsetFetch; the output, read_committed, has each input once.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from icelog.cluster.view import GROUP_SHARDS_ID, TXN_SHARDS_ID, coordinator_shard, rendezvous
from icelog.errors import ErrorCode
from icelog.meta.backends import open_store
from icelog.wire import codec
from tests.support.cluster import BrokerCluster, three_brokers
from tests.support.postgres import PostgresCluster
from tests.support.reading import read_committed as read_committed_records
from tests.support.wire_client import RawClient

pytestmark = pytest.mark.slow

SOURCE, TARGET, PARTITIONS, RECORDS = "eos-in", "eos-out", 3, 90
STEPS = Path(__file__).resolve().parents[1] / "support" / "eos_steps.py"
OffsetFetch = 9  # (ApiKey)


def ids_on_two_brokers() -> tuple[str, str, int, int]:
    """A group id and a transactional id whose coordinator shards rendezvous hashing puts on different brokers of
    nodes 0-2 (all alive): (group, transactional id, the group's node, the id's node)."""
    for n in range(1000):
        group, txn_id = f"eos-group-{n}", f"eos-txn-{n}"
        group_node = rendezvous((GROUP_SHARDS_ID, coordinator_shard(group)), range(3))
        txn_node = rendezvous((TXN_SHARDS_ID, coordinator_shard(txn_id)), range(3))
        if group_node != txn_node and group_node is not None and txn_node is not None:
            return group, txn_id, group_node, txn_node
    raise AssertionError("no such ids")


@pytest.fixture
def cluster(postgres_cluster: PostgresCluster, tmp_path: Path) -> Iterator[tuple[BrokerCluster, str]]:
    with three_brokers(postgres_cluster, tmp_path, {SOURCE: PARTITIONS, TARGET: PARTITIONS}) as brokers:
        yield brokers, brokers.meta_url


class Steps:
    """The child process's loop, one command and its JSON answer at a time."""

    def __init__(self, bootstrap: str, group: str, txn_id: str, log: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(STEPS), bootstrap, SOURCE, TARGET, group, txn_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"), text=True)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the loop died at {command!r} (see its log)"
        answer: dict[str, Any] = json.loads(line)
        assert "error" not in answer, (command, answer)
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def holder(meta_url: str, key: tuple[Any, int], other_than: int | None = None, timeout: float = 40.0) -> int:
    """The node holding a coordinator shard, as the store has it (waiting for one other than `other_than`)."""
    store = open_store(meta_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            held = store.leaderships().get(key)
            if held is not None and held.holder is not None and held.holder.node_id != other_than:
                return held.holder.node_id
            assert time.monotonic() < deadline, f"nobody took {key}"
            time.sleep(0.2)
    finally:
        store.close()


def offset_fetch(brokers: BrokerCluster, node: int, group: str, require_stable: bool) -> dict[int, tuple[int, int]]:
    """OffsetFetch v7 of the source's partitions asked of broker `node`: {partition: (committed offset, error)}."""
    request_class = codec.REQUEST_CLASSES[OffsetFetch]
    topics = [request_class.OffsetFetchRequestTopic(name=SOURCE, partition_indexes=list(range(PARTITIONS)))]
    deadline = time.monotonic() + 20
    while True:
        client = RawClient(brokers.brokers[node].bootstrap)
        try:
            response = client.request(request_class(group_id=group, topics=topics, require_stable=require_stable), 7,
                                      codec.RESPONSE_CLASSES[OffsetFetch])
        finally:
            client.close()
        if response.error_code != ErrorCode.NOT_COORDINATOR or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # (the shard claimed in the store, its offsets still loading)
    assert response.error_code == 0, response
    return {p.partition_index: (p.committed_offset, p.error_code) for t in response.topics for p in t.partitions}


def committed(brokers: BrokerCluster, node: int, group: str) -> dict[int, int]:
    fetched = offset_fetch(brokers, node, group, require_stable=True)
    assert all(error == 0 for _, error in fetched.values()), f"nothing pending now: {fetched}"
    return {p: offset for p, (offset, _) in fetched.items() if offset >= 0}


def read_output(bootstrap: str, expected: int) -> list[bytes]:
    return read_committed_records(bootstrap, TARGET, PARTITIONS, expected, timeout=60.0)


@pytest.mark.timeout(400)
def test_offsets_sent_to_transactions_land_once_across_brokers_and_a_group_coordinator_kill(
    cluster: tuple[BrokerCluster, str], tmp_path: Path,
) -> None:
    brokers, meta_url = cluster
    group, txn_id, group_node, txn_node = ids_on_two_brokers()
    group_key, txn_key = (GROUP_SHARDS_ID, coordinator_shard(group)), (TXN_SHARDS_ID, coordinator_shard(txn_id))
    assert holder(meta_url, group_key) == group_node and holder(meta_url, txn_key) == txn_node
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(SOURCE, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    inputs = {b"copy-%d" % i for i in range(RECORDS)}

    steps = Steps(brokers.bootstrap, group, txn_id, tmp_path / "eos-steps.log")
    try:
        # A committed transaction commits its offsets at the group's coordinator, another broker.
        first = steps.ask("step commit")
        assert first["outcome"] == "committed" and first["records"] > 0
        after_first = {int(p): o for p, o in first["positions"].items() if o >= 0}
        assert committed(brokers, group_node, group) == after_first

        # An aborted one leaves them as they were.
        aborted = steps.ask("step abort")
        assert aborted["outcome"] == "aborted" and aborted["records"] > 0
        assert committed(brokers, group_node, group) == after_first, "the abort committed nothing"

        # Offsets sent (TxnOffsetCommit answered: pending, durably), then the group coordinator dies before EndTxn.
        held = steps.ask("step hold")
        sent = {int(p): o for p, o in held["positions"].items() if o >= 0}
        assert held["records"] > 0 and sent
        pending = offset_fetch(brokers, group_node, group, require_stable=True)
        assert {p for p, (_, e) in pending.items() if e == ErrorCode.UNSTABLE_OFFSET_COMMIT} == set(sent), pending
        brokers.brokers[group_node].kill()
        ended = steps.ask("end commit")
        assert ended["outcome"] == "committed"
        successor = holder(meta_url, group_key, other_than=group_node)
        expected = {**after_first, **sent}  # (librdkafka sends the positions it has: a partition may have none)
        assert committed(brokers, successor, group) == expected, "the pending offsets landed at the new coordinator"
        assert ", 1 with transactional offsets pending" in brokers.brokers[successor].log(), "loaded with the shard"

        # The killed broker comes back (and takes the group's shard back: a second move, from the store), then the
        # rest is drained. (Without it librdkafka 2.16's producer waits on the dead broker for its next
        # TxnOffsetCommit: it kept the group coordinator it had cached and sent nothing for minutes.)
        brokers.brokers[group_node].start()
        brokers.wait_settled((SOURCE, TARGET))
        steps.ask(f"drain {RECORDS}")
        final = holder(meta_url, group_key)
        assert committed(brokers, final, group) == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    finally:
        steps.close()
    survivors = ",".join(brokers.brokers[n].bootstrap for n in range(3) if n != group_node)
    counts = collections.Counter(read_output(survivors, RECORDS))
    assert set(counts) == inputs, f"missing: {sorted(inputs - set(counts))[:5]}"
    assert [v for v, n in counts.items() if n > 1] == [], "no input copied twice"
