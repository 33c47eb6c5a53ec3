"""SourceCluster against a real broker over TCP (and over SASL_SSL with SCRAM): topics, offsets (an open transaction
holds the last stable offset back), topic configs, standalone group commits that Kafka's clients then see, and
the errors a wrong topic or partition gives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.client import cluster as cluster_module
from icelog.client.cluster import VERSIONS, PartitionOffsets, SourceCluster
from icelog.client.connection import BrokerRequestError
from icelog.client.fetch import CommittedFilter
from icelog.client.properties import parse
from icelog.errors import ErrorCode
from icelog.log.producers import iter_stored_headers
from tests.support.broker import BrokerProcess
from tests.support.security import start_secure_broker

USER, PASSWORD = "sink", "s3cret-sink"


@pytest.fixture
def cluster(broker: BrokerProcess) -> Iterator[SourceCluster]:
    with SourceCluster([broker.bootstrap], parse({})) as client:
        yield client


def _create(conf: dict[str, str], name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient(conf)  # held: a collected client fails its futures
    admin.create_topics([NewTopic(name, partitions, config=configs or {})])[name].result(30)


def _produce(conf: dict[str, str], topic: str, counts: dict[int, int]) -> None:
    producer = Producer({**conf, "linger.ms": 0})
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def test_topics_lists_partition_counts_without_internal_topics(broker: BrokerProcess, cluster: SourceCluster,
                                                               topic_name: str) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    _create(conf, topic_name + "-a", 3)
    _create(conf, topic_name + "-b", 1)
    group_consumer = Consumer({**conf, "group.id": topic_name, "enable.auto.commit": False})
    group_consumer.commit(offsets=[TopicPartition(topic_name + "-a", 0, 1)], asynchronous=False)
    group_consumer.close()  # __consumer_offsets now holds something, wherever the broker keeps it

    topics = cluster.topics()
    assert topics[topic_name + "-a"] == 3
    assert topics[topic_name + "-b"] == 1
    assert not [name for name in topics if name.startswith("__")]
    assert cluster.topic_id(topic_name + "-a") is not None  # icelog's Metadata gives topic ids


def test_offsets_give_log_start_high_watermark_and_last_stable(broker: BrokerProcess, cluster: SourceCluster,
                                                               topic_name: str) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    _create(conf, topic_name, 2)
    _produce(conf, topic_name, {0: 5, 1: 3})
    assert cluster.offsets(topic_name, [0, 1]) == {0: PartitionOffsets(0, 5, 5), 1: PartitionOffsets(0, 3, 3)}

    transactional = Producer({**conf, "transactional.id": topic_name, "linger.ms": 0})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(4):
        transactional.produce(topic_name, value=f"open{i}".encode(), partition=0)
    assert transactional.flush(30) == 0
    _produce(conf, topic_name, {0: 2})  # plain records after the open transaction's

    offsets = cluster.offsets(topic_name, [0, 1])
    assert offsets[0] == PartitionOffsets(log_start=0, high_watermark=11, last_stable=5)
    assert offsets[1] == PartitionOffsets(0, 3, 3)
    assert cluster.stable_offsets(topic_name, [0]) == {0: 5}

    # read_committed stops at the last stable offset; read_uncommitted reads to the high watermark.
    assert _last_offset(cluster.fetch(topic_name, 0, 0, committed=True).records) == 4
    assert _last_offset(cluster.fetch(topic_name, 0, 0).records) == 10

    transactional.abort_transaction(30)
    deadline = time.monotonic() + 10
    while cluster.offsets(topic_name, [0])[0].last_stable < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    # The abort marker is offset 11; the aborted records are named by a read_committed Fetch and filtered out.
    assert cluster.offsets(topic_name, [0])[0] == PartitionOffsets(0, 12, 12)
    fetched = cluster.fetch(topic_name, 0, 0, committed=True)
    assert fetched.aborted
    keep = CommittedFilter(fetched.aborted)
    # Offsets, not batches: under load a client may split the same records into more batches.
    kept = [offset for b in iter_stored_headers(fetched.records)
            if keep.keeps(b.producer_id, b.last_offset, b.is_transactional, b.is_control) and not b.is_control
            for offset in range(b.base_offset, b.last_offset + 1)]
    assert kept == [0, 1, 2, 3, 4, 9, 10]  # the plain records either side; the aborted transaction's (5-8) left out


def test_topic_configs_show_a_compacted_topic(broker: BrokerProcess, cluster: SourceCluster, topic_name: str) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    _create(conf, topic_name, 1, {"cleanup.policy": "compact"})
    _create(conf, topic_name + "-plain", 1)
    configs = cluster.topic_configs([topic_name, topic_name + "-plain"])
    assert configs[topic_name]["cleanup.policy"] == "compact"
    assert configs[topic_name + "-plain"]["cleanup.policy"] == "delete"


def test_committed_offsets_round_trip_and_kafka_clients_see_them(broker: BrokerProcess, cluster: SourceCluster,
                                                                 topic_name: str) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    _create(conf, topic_name, 3)
    _produce(conf, topic_name, {0: 10, 1: 10, 2: 10})
    group = f"{topic_name}-sink"
    assert cluster.committed_offsets(group, topic_name, [0, 1, 2]) == {0: -1, 1: -1, 2: -1}

    cluster.commit_offsets(group, topic_name, {0: 7, 2: 3}, metadata="icelog-sink")
    assert cluster.committed_offsets(group, topic_name, [0, 1, 2]) == {0: 7, 1: -1, 2: 3}
    cluster.commit_offsets(group, topic_name, {0: 9})
    assert cluster.committed_offsets(group, topic_name, [0, 2]) == {0: 9, 2: 3}

    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        seen = consumer.committed([TopicPartition(topic_name, p) for p in (0, 2)], timeout=30)
        assert {(tp.partition, tp.offset) for tp in seen} == {(0, 9), (2, 3)}
    finally:
        consumer.close()
    admin = AdminClient(conf)
    listed = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic_name, p) for p in (0, 2)])])[group].result(30)
    assert {(tp.partition, tp.offset) for tp in listed.topic_partitions} == {(0, 9), (2, 3)}


def test_a_wrong_topic_or_partition_is_named(broker: BrokerProcess, cluster: SourceCluster, topic_name: str) -> None:
    _create({"bootstrap.servers": broker.bootstrap}, topic_name, 2)
    missing = topic_name + "-missing"
    calls = [
        lambda: cluster.offsets(missing, [0]),
        lambda: cluster.fetch(missing, 0, 0),
        lambda: cluster.topic_configs([missing]),
        lambda: cluster.commit_offsets("g", missing, {0: 1}),
        lambda: cluster.committed_offsets("g", missing, [0]),
        lambda: cluster.topic_id(missing),
    ]
    for call in calls:
        with pytest.raises(BrokerRequestError, match=missing) as info:
            call()
        assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    for call in [lambda: cluster.offsets(topic_name, [0, 5]), lambda: cluster.fetch(topic_name, 5, 0),
                 lambda: cluster.commit_offsets("g", topic_name, {5: 1})]:
        with pytest.raises(BrokerRequestError, match=f"{topic_name}.*5") as info:
            call()
        assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert cluster.offsets(topic_name, [1]) == {1: PartitionOffsets(0, 0, 0)}  # the client still works


@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_every_version_range_end_works(broker: BrokerProcess, topic_name: str, monkeypatch: pytest.MonkeyPatch,
                                       end: str) -> None:
    """The same answers at the lowest versions the client speaks (what Kafka 2.0 serves) as at the highest."""
    monkeypatch.setattr(cluster_module, "VERSIONS",
                        {k: (lo, lo) if end == "oldest" else (hi, hi) for k, (lo, hi) in VERSIONS.items()})
    conf = {"bootstrap.servers": broker.bootstrap}
    _create(conf, topic_name, 2, {"cleanup.policy": "compact"})
    _produce(conf, topic_name, {0: 4, 1: 6})
    with SourceCluster([broker.bootstrap], parse({})) as cluster:
        assert cluster.topics()[topic_name] == 2
        assert cluster.offsets(topic_name, [0, 1]) == {0: PartitionOffsets(0, 4, 4), 1: PartitionOffsets(0, 6, 6)}
        assert cluster.topic_configs([topic_name])[topic_name]["cleanup.policy"] == "compact"
        cluster.commit_offsets(topic_name, topic_name, {0: 4, 1: 2})
        assert cluster.committed_offsets(topic_name, topic_name, [0, 1]) == {0: 4, 1: 2}
        assert _last_offset(cluster.fetch(topic_name, 1, 0, committed=True).records) == 5
        assert (cluster.topic_id(topic_name) is None) == (end == "oldest")  # ids come with Metadata v10
        with pytest.raises(BrokerRequestError, match=topic_name + "-missing"):
            cluster.offsets(topic_name + "-missing", [0])
    assert topic_name + "-missing" not in _topics(conf)  # asking did not create it


def _topics(conf: dict[str, str]) -> set[str]:
    admin = AdminClient(conf)
    return set(admin.list_topics(timeout=30).topics)


def test_a_restarted_broker_is_reached_again(fresh_broker: BrokerProcess, topic_name: str) -> None:
    """A broken connection: the client reconnects and retries once, so a restart between calls goes unseen."""
    fresh_broker.start()
    conf = {"bootstrap.servers": fresh_broker.bootstrap}
    _create(conf, topic_name, 1)
    _produce(conf, topic_name, {0: 3})
    with SourceCluster([fresh_broker.bootstrap], parse({})) as cluster:
        assert cluster.offsets(topic_name, [0])[0].high_watermark == 3
        fresh_broker.restart()
        assert cluster.offsets(topic_name, [0])[0].high_watermark == 3
        cluster.commit_offsets("g", topic_name, {0: 2})
        fresh_broker.restart()
        assert cluster.committed_offsets("g", topic_name, [0]) == {0: 2}


def test_over_sasl_ssl_with_scram(tmp_path: Path) -> None:
    secure = start_secure_broker(tmp_path, ("SASL_SSL",), env={"ICELOG_SUPER_USERS": f"User:{USER}"},
                                 users={USER: PASSWORD})
    try:
        client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                  "sasl.password": PASSWORD, "ssl.ca.location": str(secure.pki.ca_pem)}
        conf = {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **client}
        topic = "secure-source"
        _create(conf, topic, 2, {"cleanup.policy": "compact"})
        _produce(conf, topic, {0: 4, 1: 6})
        with SourceCluster([secure.bootstrap("SASL_SSL")], parse(client)) as cluster:
            assert cluster.topics() == {topic: 2}
            assert cluster.offsets(topic, [0, 1]) == {0: PartitionOffsets(0, 4, 4), 1: PartitionOffsets(0, 6, 6)}
            assert cluster.topic_configs([topic])[topic]["cleanup.policy"] == "compact"
            cluster.commit_offsets("secure-sink", topic, {0: 4, 1: 2})
            assert cluster.committed_offsets("secure-sink", topic, [0, 1]) == {0: 4, 1: 2}
            assert _last_offset(cluster.fetch(topic, 1, 0).records) == 5
    finally:
        secure.broker.stop()


def _last_offset(records: bytes) -> int:
    batches = list(iter_stored_headers(records))
    return batches[-1].last_offset if batches else -1
