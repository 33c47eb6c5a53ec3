"""Kafka's own Java client on three icelog brokers (issue 46): VerifiableProducer (acks=all, idempotent, the Java
client's defaults) runs while the broker leading the most partitions is killed with -9, its data dir deleted and
started again; VerifiableConsumer then reads, in a consumer group, every record the producer was told was
acknowledged. VerifiableProducer runs with retries=0 (Kafka's system tests' tool), so what was in flight to the
killed broker fails with a retriable error, which is all it may see."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cluster.test_cluster import cluster, create  # noqa: F401 (the fixture: three brokers)
from tests.java.test_kafka_tools import verifiable_consumer_reads, verifiable_producer_with_a_kill
from tests.support.cluster import BrokerCluster
from tests.support.java import KafkaJava

pytestmark = pytest.mark.slow

RETRIABLE = {"NetworkException", "NotLeaderOrFollowerException", "TimeoutException", "DisconnectException",
             "NotEnoughReplicasException", "LeaderNotAvailableException"}


def test_java_client_through_a_broker_killed_and_started_again_empty(
        kafka_java: KafkaJava, cluster: BrokerCluster, tmp_path: Path) -> None:  # noqa: F811
    leaders = create(cluster, "java-events")
    victim = max(set(leaders.values()), key=list(leaders.values()).count)

    def kill() -> None:
        cluster.brokers[victim].kill()
        shutil.rmtree(cluster.brokers[victim].data_dir)
        cluster.brokers[victim].start()

    # 10000 records at 500 a second: 20 s, so acks can resume after a failover slowed by a loaded machine. The
    # records have no key: the Java client's default (sticky, adaptive) partitioner may leave a partition without a
    # record for the whole run (seen: one of six got none), so they go round-robin over the partitions that have a
    # leader, and every partition is sent records again once it has one.
    config = tmp_path / "producer.properties"
    config.write_text("partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner\n")
    acked, events, back_ms = verifiable_producer_with_a_kill(kafka_java, cluster.bootstrap, "java-events", kill, 10000,
                                                             config)
    # VerifiableProducer sets retries=0 (as Kafka's system tests run it), so what was in flight to the killed broker
    # fails; each such failure must be one a Java application retries (Kafka's RetriableException kinds).
    failed = {str(e["exception"]).rsplit(".", 1)[-1] for e in events if e["name"] == "producer_send_error"}
    assert failed <= RETRIABLE, f"the Java producer was told of failures no client retries: {failed - RETRIABLE}"
    summary = [e for e in events if e["name"] == "tool_data"][-1]
    assert summary["acked"] == len(acked)
    # The producer goes on: records sent after the killed broker was back are acknowledged on every partition
    # (how many failed meanwhile is the failover's speed: failover_bench.py measures it, no test times it).
    resumed = {e["partition"] for e in events if e["name"] == "producer_send_success"
               and int(str(e["timestamp"])) > back_ms}
    last_ack = {p: max((int(str(e["timestamp"])) for e in events if e["name"] == "producer_send_success"
                        and e["partition"] == p), default=None) for p in set(leaders) - resumed}
    errors_after = sorted({(str(e["exception"]).rsplit(".", 1)[-1], str(e.get("message", ""))[:120]) for e in events
                           if e["name"] == "producer_send_error" and int(str(e["timestamp"])) > back_ms})
    assert resumed == set(leaders), (f"acks resumed on partitions {sorted(resumed)} of {sorted(leaders)} (back at "
                                     f"{back_ms}; the others' last acks: {last_ack}; errors since: {errors_after})")

    seen = verifiable_consumer_reads(kafka_java, cluster.bootstrap, "java-events", "java-events-g", "classic", acked)
    assert not acked - seen, f"{len(acked - seen)} acked records never read, e.g. {sorted(acked - seen)[:5]}"
