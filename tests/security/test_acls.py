"""ACLs through real clients on a PLAINTEXT listener, where every client is User:ANONYMOUS: grants and denials
made with `icelog acl` (another process: the broker picks them up within a second) and with the admin APIs
(confluent-kafka's and kafka-python's), and the exact error each client surfaces when refused."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ResourcePattern, ResourcePatternFilter
from kafka.admin import ACLResourcePatternType as KpPatternType
from kafka.admin import ResourceType as KpResourceType

from icelog.meta.sqlite import SqliteStore
from tests.support.broker import BrokerProcess
from tests.support.clients_util import WAIT_S

ICELOG = str(Path(sys.executable).parent / "icelog")
ME = "User:ANONYMOUS"
PICKUP_S = 1.5  # the broker checks the store's security generation once a second


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("acls") / "data"
    proc = BrokerProcess(
        data, env={"ICELOG_AUTHORIZER_ENABLED": "true", "ICELOG_SUPER_USERS": "User:admin"}
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def no_acls(broker: BrokerProcess) -> Iterator[None]:
    """Every test starts with no binding at all (so, for ANONYMOUS, nothing allowed)."""
    yield
    store = SqliteStore(broker.data_dir / "meta.db")
    try:
        store.delete_acls(store.acls())
    finally:
        store.close()
    time.sleep(PICKUP_S)


def acl(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ICELOG, "acl", *args, "--data-dir", str(broker.data_dir)], capture_output=True,
                          text=True, timeout=60)


def grant(broker: BrokerProcess, *args: str, principal: str = ME, wait: bool = True) -> None:
    """`icelog acl add --allow-principal ...` (from another process), then wait for the broker to notice."""
    done = acl(broker, "add", "--allow-principal", principal, *args)
    assert done.returncode == 0, done.stderr
    if wait:
        time.sleep(PICKUP_S)


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def error_of(future: Any) -> int | None:
    try:
        future.result(WAIT_S)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def make_topic(broker: BrokerProcess, topic: str) -> None:
    """Create a topic as an admin would: ANONYMOUS gets CREATE on it just for this."""
    grant(broker, "--operation", "Create", "--topic", topic)
    client = admin(broker)  # kept: a future outlives no client
    assert error_of(client.create_topics([NewTopic(topic, 1, 1)])[topic]) is None
    done = acl(broker, "remove", "--topic", topic, "--operation", "Create")
    assert done.returncode == 0, done.stderr


def produce_error(producer: Producer, topic: str) -> int | None:
    """The error code of one message's delivery report (None: delivered)."""
    reports: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(WAIT_S)
    assert reports, "no delivery report"
    return None if reports[0] is None else int(reports[0].code())


def test_producer_refused_then_allowed_while_connected_and_deny_wins(broker: BrokerProcess) -> None:
    topic = name()
    make_topic(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "topic.metadata.refresh.interval.ms": 500,
                         "message.timeout.ms": 5000})
    assert produce_error(producer, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(broker, "--operation", "Write", "--topic", topic)  # the same producer, still connected
    assert produce_error(producer, topic) is None
    # a DENY of WRITE overrides ALLOW ALL for everyone
    grant(broker, "--operation", "All", "--topic", topic, principal="User:*", wait=False)
    done = acl(broker, "add", "--deny-principal", ME, "--operation", "Write", "--topic", topic)
    assert done.returncode == 0, done.stderr
    time.sleep(PICKUP_S)
    assert produce_error(producer, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_metadata_lists_only_describable_topics(broker: BrokerProcess) -> None:
    seen, hidden = name(), name()
    make_topic(broker, seen)
    make_topic(broker, hidden)
    grant(broker, "--operation", "Describe", "--topic", seen)
    topics = admin(broker).list_topics(timeout=WAIT_S).topics
    assert seen in topics and hidden not in topics
    # asked for by name: TOPIC_AUTHORIZATION_FAILED
    named = admin(broker).list_topics(topic=hidden, timeout=WAIT_S).topics[hidden]
    assert named.error is not None and named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_consumer_in_a_group_needs_group_and_topic_read(broker: BrokerProcess) -> None:
    topic, group = name(), name()
    make_topic(broker, topic)
    grant(broker, "--operation", "Write", "--topic", topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    assert produce_error(producer, topic) is None

    def first_error_or_message() -> int | None:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        try:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                return int(msg.error().code()) if msg.error() else None
            raise AssertionError("neither a record nor an error")
        finally:
            consumer.close()

    grant(broker, "--operation", "Read", "--topic", topic)
    assert first_error_or_message() == KafkaError.GROUP_AUTHORIZATION_FAILED
    grant(broker, "--operation", "Read", "--group", group)
    assert first_error_or_message() is None
    done = acl(broker, "remove", "--topic", topic, "--operation", "Read")
    assert done.returncode == 0 and "removed" in done.stdout
    done = acl(broker, "remove", "--topic", topic, "--operation", "Write")
    time.sleep(PICKUP_S)
    assert first_error_or_message() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_topic_admin_and_configs_are_refused(broker: BrokerProcess) -> None:
    topic = name()
    make_topic(broker, topic)
    client = admin(broker)
    other = name()
    assert error_of(client.create_topics([NewTopic(other, 1, 1)])[other]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(client.delete_topics([topic])[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    configs = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    assert error_of(next(iter(configs.values()))) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    configs = client.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    assert error_of(next(iter(configs.values()))) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    grant(broker, "--operation", "DescribeConfigs", "--cluster")
    grant(broker, "--operation", "AlterConfigs", "--operation", "Delete", "--topic", topic)
    configs = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    assert error_of(next(iter(configs.values()))) is None  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    configs = client.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    assert error_of(next(iter(configs.values()))) is None
    assert error_of(client.delete_topics([topic])[topic]) is None
    grant(broker, "--operation", "Create", "--cluster")
    assert error_of(client.create_topics([NewTopic(other, 1, 1)])[other]) is None


def test_transactional_producer_needs_its_transactional_id(broker: BrokerProcess) -> None:
    topic = name()
    make_topic(broker, topic)
    grant(broker, "--operation", "Write", "--topic", topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-" + topic})
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    grant(broker, "--operation", "Write", "--transactional-id", "txn-" + topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-" + topic})
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce(topic, b"v")
    producer.commit_transaction(WAIT_S)


def test_confluent_admin_manages_acls(broker: BrokerProcess) -> None:
    client = admin(broker)
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    # no ALTER on the cluster: refused
    assert error_of(client.create_acls([binding])[binding]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (librdkafka 2.16 answers DescribeAcls' top-level error as an empty list: kafka-python's test checks it)
    grant(broker, "--operation", "Alter", "--operation", "Describe", "--cluster")
    prefixed = AclBinding(ResourceType.TOPIC, "pay.", ResourcePatternType.PREFIXED, "User:*", "*",
                          AclOperation.WRITE, AclPermissionType.DENY)
    bad = AclBinding(ResourceType.GROUP, "g", ResourcePatternType.LITERAL, "User:alice", "*",
                     AclOperation.WRITE, AclPermissionType.ALLOW)
    created = client.create_acls([binding, prefixed, bad])
    assert error_of(created[binding]) is None and error_of(created[prefixed]) is None
    assert error_of(created[bad]) == KafkaError.INVALID_REQUEST
    match = AclBindingFilter(ResourceType.TOPIC, "pay.eu", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert client.describe_acls(match).result(WAIT_S) == [prefixed]
    assert set(client.describe_acls(everything).result(WAIT_S)) >= {binding, prefixed}
    deleted = client.delete_acls([match])[match].result(WAIT_S)
    assert deleted == [prefixed]
    assert prefixed not in client.describe_acls(everything).result(WAIT_S)
    listed = acl(broker, "list", "--topic", "orders")
    assert "User:alice" in listed.stdout and "READ" in listed.stdout


def test_kafka_python_admin_manages_acls(broker: BrokerProcess) -> None:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        wanted = ACL("User:bob", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                     ResourcePattern(KpResourceType.TOPIC, "logs", KpPatternType.LITERAL))
        created = client.create_acls([wanted])
        assert created["failed"] == [kafka_errors.ClusterAuthorizationFailedError]
        with pytest.raises(kafka_errors.ClusterAuthorizationFailedError):
            client.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                           ResourcePatternFilter(KpResourceType.ANY, None, KpPatternType.ANY)))
        grant(broker, "--operation", "All", "--cluster")
        created = client.create_acls([wanted])
        assert created["succeeded"] == [wanted] and not created["failed"]
        found, error = client.describe_acls(
            ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                      ResourcePatternFilter(KpResourceType.TOPIC, "logs", KpPatternType.LITERAL))
        )
        assert error.errno == 0 and found == [wanted]
        deleted = client.delete_acls([ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                ResourcePatternFilter(KpResourceType.TOPIC, "logs",
                                                                      KpPatternType.ANY))])
        assert deleted[0][1] == [wanted] and deleted[0][2] is kafka_errors.NoError
    finally:
        client.close()


def test_cli_refuses_bad_input_with_the_fix(broker: BrokerProcess) -> None:
    done = acl(broker, "add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t")
    assert done.returncode == 2 and "User:NAME" in done.stderr
    done = acl(broker, "add", "--allow-principal", "User:a", "--operation", "Read", "--topic", "*",
               "--resource-pattern-type", "prefixed")
    assert done.returncode == 2 and "LITERAL '*'" in done.stderr
    done = acl(broker, "add", "--allow-principal", "User:a", "--operation", "Frob", "--topic", "t")
    assert done.returncode == 2 and "IdempotentWrite" in done.stderr
    done = acl(broker, "remove")
    assert done.returncode == 2 and "--topic" in done.stderr


def test_acl_apis_without_an_authorizer_answer_security_disabled(tmp_path: Path) -> None:
    plain = BrokerProcess(tmp_path / "plain").start()  # PLAINTEXT only: no authorizer by default
    client = KafkaAdminClient(bootstrap_servers=plain.bootstrap, request_timeout_ms=15000)
    try:
        with pytest.raises(kafka_errors.SecurityDisabledError, match="No Authorizer is configured"):
            client.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                           ResourcePatternFilter(KpResourceType.ANY, None, KpPatternType.ANY)))
    finally:
        client.close()
        plain.stop()


def test_delete_records_needs_delete_on_the_topic(broker: BrokerProcess) -> None:
    from kafka.protocol.api_key import ApiKey

    from icelog.wire import codec
    from tests.support.wire_client import RawClient

    topic = name()
    make_topic(broker, topic)
    cls = codec.REQUEST_CLASSES[ApiKey.DeleteRecords]

    def delete_error() -> int:
        client = RawClient(broker.bootstrap)
        try:
            answer: Any = client.request(cls(timeout_ms=5000, topics=[cls.DeleteRecordsTopic(
                name=topic, partitions=[cls.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=0)])]),
                2, codec.RESPONSE_CLASSES[ApiKey.DeleteRecords])
        finally:
            client.close()
        return int(answer.topics[0].partitions[0].error_code)

    assert delete_error() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(broker, "--operation", "Delete", "--topic", topic)
    assert delete_error() == 0
