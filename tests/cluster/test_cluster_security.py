"""A secured cluster (issue 46): three brokers whose one listener is SASL_PLAINTEXT, ACLs on. A transaction's
coordinator writes the markers of the partitions other brokers lead with WriteTxnMarkers over that listener, logged
in with `inter_broker_client_properties` (Kafka's brokers log in on inter.broker.listener.name with credentials of
their own); a cluster's broker that would have no credentials there refuses to start and says what to set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.support.broker import BrokerProcess, free_port
from tests.support.cluster import BrokerCluster
from tests.support.metrics import scrape_text, value
from tests.support.postgres import PostgresCluster
from tests.support.seaweedfs import SeaweedFS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster")]

TOPIC, PARTITIONS = "secured", 6
BROKER, APP = ("broker", "broker-secret-4711"), ("app", "app-secret-4712")
MECHANISM = "SCRAM-SHA-256"
SECURED = {"ICELOG_SASL_ENABLED_MECHANISMS": MECHANISM, "ICELOG_SUPER_USERS": f"User:{BROKER[0]}"}
INTER_BROKER = {"ICELOG_INTER_BROKER_CLIENT_PROPERTIES": json.dumps(
    {"sasl.mechanism": MECHANISM, "sasl.username": BROKER[0], "sasl.password": BROKER[1]})}


def login(user: tuple[str, str]) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM, "sasl.username": user[0],
            "sasl.password": user[1]}


def add_user(meta_url: str, data_dir: Path, user: tuple[str, str]) -> None:
    """`icelog user add` against the cluster's metadata store, as an operator runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "icelog", "user", "add", user[0], "--mechanism", MECHANISM, "--password-stdin",
         "--data-dir", str(data_dir)],
        input=user[1].encode() + b"\n", capture_output=True, timeout=60, check=False,
        env={**os.environ, "ICELOG_META_URL": meta_url})
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.fixture(scope="module")
def secured(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    root = tmp_path_factory.mktemp("secured")
    store = SeaweedFS(root / "seaweedfs").start()
    meta_url = postgres_cluster.new_database()
    for user in (BROKER, APP):
        add_user(meta_url, root / "cli", user)
    brokers = BrokerCluster(root, store, meta_url, prefix="secured", env={**SECURED, **INTER_BROKER},
                            protocol="SASL_PLAINTEXT", client=login(BROKER))
    try:
        yield brokers.start()
    finally:
        brokers.stop()
        store.discard()  # (nothing reads it again)


def test_markers_cross_a_sasl_listener_with_the_brokers_own_login(secured: BrokerCluster) -> None:
    admin = AdminClient({"bootstrap.servers": secured.bootstrap, **login(BROKER)})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
    for kind, name in ((ResourceType.TOPIC, TOPIC), (ResourceType.TRANSACTIONAL_ID, "*"), (ResourceType.GROUP, "*")):
        binding = AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{APP[0]}", "*", AclOperation.ALL,
                             AclPermissionType.ALLOW)
        for future in admin.create_acls([binding]).values():
            future.result(30)
    leaders = secured.wait_settled((TOPIC,))[TOPIC]
    assert len(set(leaders.values())) > 1, f"every partition on one broker: {leaders}"

    producer = Producer({"bootstrap.servers": secured.bootstrap, **login(APP), "transactional.id": "secured-tx"})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        for n in range(60):
            producer.produce(TOPIC, f"{'kept' if commit else 'dropped'}-{n}".encode(), partition=n % PARTITIONS)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    consumer = Consumer({"bootstrap.servers": secured.bootstrap, **login(APP), "group.id": "secured-check",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.subscribe([TOPIC])
    seen: list[bytes] = []
    try:
        for _ in range(120):
            seen += [m.value() for m in consumer.consume(100, 0.5) if not m.error()]
            if len(seen) >= 60:
                break
        seen += [m.value() for m in consumer.consume(100, 2) if not m.error()]  # nothing of the aborted one comes
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"kept-{n}".encode() for n in range(60))

    # The markers of the partitions the coordinator does not lead went over the SASL listener, as WriteTxnMarkers.
    sent = sum(value(scrape_text(b.metrics_url), "icelog_requests_total", api="WriteTxnMarkers")
               for b in secured.brokers)
    assert sent >= 2, "no WriteTxnMarkers between the brokers"
    for broker in secured.brokers:
        assert BROKER[1] not in broker.log() and APP[1] not in broker.log(), "a password in a broker's log"


def test_a_cluster_broker_without_inter_broker_credentials_refuses_to_start(
        secured: BrokerCluster, tmp_path: Path) -> None:
    port = free_port()
    alone = BrokerProcess(tmp_path / "broker-9", port=port, env={
        **secured.brokers[0].env, "ICELOG_NODE_ID": "9", "ICELOG_INTER_BROKER_CLIENT_PROPERTIES": "{}",
        "ICELOG_LISTENERS": f"SASL_PLAINTEXT://127.0.0.1:{port}"})
    with pytest.raises(RuntimeError) as refused:
        alone.start()
    assert "inter_broker_client_properties" in str(refused.value)
    assert "inter_broker_listener_name" in str(refused.value)
