"""Three brokers over one PostgreSQL and one SeaweedFS bucket (issue 46): they find each other, spread the
partitions' leadership, and lose nothing acknowledged when one is killed with -9 (its data dir deleted and started
again empty) or when each is restarted in turn under load. Every client library reads and writes through them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.cluster.view import GROUP_SHARDS_ID, coordinator_shard, rendezvous
from tests.support.clients_util import CLIENTS, comparable, expected_records, sample_records
from tests.support.cluster import BrokerCluster, EpochWatch, ProducerStream, three_brokers
from tests.support.postgres import PostgresCluster
from tests.support.reading import read_partition

# One cluster for the module (its start is most of a test's cost), on one xdist worker; each test uses topics of
# its own and leaves every broker running.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster")]

PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    with three_brokers(postgres_cluster, tmp_path_factory.mktemp("cluster")) as brokers:
        yield brokers


@pytest.fixture(autouse=True)
def whole(cluster: BrokerCluster) -> Iterator[None]:
    """Every broker running after each test (a test that kills one starts it again, or this does)."""
    yield
    for broker in cluster.brokers:
        if broker.proc is None or broker.proc.poll() is not None:
            broker.start()
    cluster.wait_settled()


def create(cluster: BrokerCluster, name: str, partitions: int = PARTITIONS) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)
    return cluster.wait_settled((name,))[name]


def read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, list[bytes]]:
    """Every record of every partition, by offset, checking the offsets are contiguous from 0."""
    return {partition: read_partition(bootstrap, topic, partition)[0] for partition in range(partitions)}


def check_exactly_once(stream: ProducerStream, log: dict[int, list[bytes]]) -> None:
    """Every acknowledged record at its acknowledged offset, none twice, nothing nobody sent."""
    assert not stream.failed, f"records the producer was told failed: {list(stream.failed.values())[:3]}"
    everything = [v for values in log.values() for v in values]
    assert len(everything) == len(set(everything)), "a record written twice"
    for value, (partition, offset) in stream.acked.items():
        assert offset < len(log[partition]) and log[partition][offset] == value, "an acknowledged record lost"
    assert len(everything) == len(stream.acked), "a record nobody was told about"


def icelog_status(cluster: BrokerCluster) -> list[str]:
    """`icelog status` run as a user does, pointed at the cluster's store and bucket."""
    env = {**os.environ, **cluster.brokers[0].env}
    done = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(cluster.root / "status")],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines()


def test_brokers_list_each_other_and_spread_the_leadership(cluster: BrokerCluster) -> None:
    leaders = create(cluster, "spread", 12)
    assert len(set(leaders.values())) >= 2, f"twelve partitions on one broker: {leaders}"
    md = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap}).list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
        n: ("127.0.0.1", b.port) for n, b in enumerate(cluster.brokers)}
    status = icelog_status(cluster)
    assert [line.split()[:2] for line in status if line.split()[:1] in (["0"], ["1"], ["2"])] == [
        ["0", "alive"], ["1", "alive"], ["2", "alive"]], status
    assert sum(1 for line in status if line.startswith("spread ")) == 12
    # A broker that stops heartbeating leaves within the session timeout; its partitions move to the others.
    victim = max(set(leaders.values()), key=list(leaders.values()).count)
    cluster.brokers[victim].kill()
    moved = cluster.wait_settled(("spread",), timeout=30)["spread"]
    assert [str(victim), "silent"] in [line.split()[:2] for line in icelog_status(cluster)]
    assert victim not in moved.values() and set(moved.values()) <= {0, 1, 2} - {victim}
    assert {p: n for p, n in moved.items() if leaders[p] != victim} == {
        p: n for p, n in leaders.items() if n != victim}, "only the dead broker's partitions moved"


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_every_client_reads_and_writes_through_three_brokers(cluster: BrokerCluster, client_name: str) -> None:
    client = CLIENTS[client_name]
    topic = f"clients-{client_name}"
    create(cluster, topic, 3)
    records = sample_records(30, 3, kcat_producer=client_name == "kcat", seed=5)
    client.produce(cluster.bootstrap, topic, records, codec="lz4", acks="all")
    got = client.consume(cluster.bootstrap, topic, [0, 1, 2], "earliest", len(records))
    assert comparable(got, timestamps=client.sets_timestamps) == comparable(
        expected_records(records), timestamps=client.sets_timestamps)


def test_a_broker_killed_and_started_again_empty_loses_nothing_and_duplicates_nothing(
    cluster: BrokerCluster,
) -> None:
    leaders = create(cluster, "events")
    victim = max(set(leaders.values()), key=list(leaders.values()).count)
    with EpochWatch(cluster, "events") as watch, ProducerStream(cluster.bootstrap, "events", PARTITIONS) as stream:
        while stream.acked_count() < 2000:
            time.sleep(0.1)
        cluster.brokers[victim].kill()
        shutil.rmtree(cluster.brokers[victim].data_dir)  # its disk held nothing it needs
        killed_at = stream.acked_count()
        deadline = time.monotonic() + 60
        while stream.acked_count() < killed_at + 2000:  # acks resume on the survivors
            assert time.monotonic() < deadline, "acks did not resume after the kill"
            time.sleep(0.1)
        cluster.brokers[victim].start()
        cluster.wait_settled(("events",))
        restarted_at = stream.acked_count()
        while stream.acked_count() < restarted_at + 2000:
            assert time.monotonic() < deadline + 60, "acks stopped after the restart"
            time.sleep(0.1)
    check_exactly_once(stream, read_all(cluster.bootstrap, "events"))
    assert watch.answers > 50 and not watch.conflicts(), f"one leader epoch, two leaders: {watch.conflicts()}"


def test_a_rolling_restart_under_load_loses_nothing_and_duplicates_nothing(cluster: BrokerCluster) -> None:
    create(cluster, "rolling")
    with EpochWatch(cluster, "rolling") as watch, ProducerStream(cluster.bootstrap, "rolling", PARTITIONS) as stream:
        for broker in cluster.brokers:
            before = stream.acked_count()
            broker.stop()  # SIGTERM: it releases its partitions at once
            broker.start()
            cluster.wait_settled(("rolling",))
            deadline = time.monotonic() + 60
            while stream.acked_count() < before + 1000:
                assert time.monotonic() < deadline, "acks did not resume after a restart"
                time.sleep(0.1)
    check_exactly_once(stream, read_all(cluster.bootstrap, "rolling"))
    assert watch.answers > 50 and not watch.conflicts(), f"one leader epoch, two leaders: {watch.conflicts()}"


def test_kafkajs_idempotence_transactions_and_groups_through_three_brokers(cluster: BrokerCluster) -> None:
    """KafkaJS (tests/js/checks.js) with the three brokers as its bootstrap list: its transaction's coordinator,
    its groups' coordinators and the partitions' leaders are spread over different brokers."""
    node = shutil.which("node")
    sources = Path(__file__).resolve().parents[1] / "js"
    if node is None or not (sources / "node_modules" / "kafkajs").is_dir():
        pytest.fail("KafkaJS needs Node.js and `make setup` (npm ci in tests/js)", pytrace=False)
    create(cluster, "kjs-js", 3)
    create(cluster, "kjs-js-txn", 1)
    done = subprocess.run([node, str(sources / "checks.js"), cluster.bootstrap, "kjs"], capture_output=True,
                          text=True, timeout=300, cwd=sources)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in answer, f"{answer['error']}\n{done.stderr[-3000:]}"
    assert answer["group"] == sorted(f"v{i}" for i in range(40))
    assert answer["txn_read_committed"] == ["commit0", "commit1", "commit2"]


def test_deleting_a_topic_drops_every_groups_offsets_of_it_on_every_broker(cluster: BrokerCluster) -> None:
    """DeleteTopics goes to the controller (node 0); the group's coordinator is another broker, which must forget
    the group's offsets of the topic too, so that a topic created again under the name starts with none (Kafka)."""
    group = next(g for g in (f"deleted-{n}" for n in range(100))
                 if rendezvous((GROUP_SHARDS_ID, coordinator_shard(g)), range(3)) != 0)
    create(cluster, "doomed", 2)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition("doomed", p, 5) for p in range(2)], asynchronous=False)
        assert [tp.offset for tp in consumer.committed([TopicPartition("doomed", p) for p in range(2)], 30)] == [5, 5]
        admin = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap})
        admin.delete_topics(["doomed"])["doomed"].result(30)
        time.sleep(2)  # every broker's review has seen the topic go (heartbeat 0.5 s)
        create(cluster, "doomed", 2)
        committed = consumer.committed([TopicPartition("doomed", p) for p in range(2)], 30)
        assert [tp.offset for tp in committed] == [OFFSET_INVALID] * 2, "offsets of the deleted topic came back"
    finally:
        consumer.close()
