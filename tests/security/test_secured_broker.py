"""A broker set up as a shared network needs it: SASL_SSL for people, SSL with client certificates for a service,
ACLs on by default, an admin who manages users and ACLs online. Who you are decides what you may do, over every
path at once: the SASL principal, the certificate's subject, and the anonymous PLAINTEXT client."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography.hazmat.primitives import serialization

from tests.support.clients_util import WAIT_S
from tests.support.security import Auth, SecureBroker, make_pki, start_secure_broker

pytestmark = pytest.mark.slow

KEY_PASSWORD = "k3y-pa55word-never-logged"
USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    tmp = tmp_path_factory.mktemp("secured")
    pki = make_pki(tmp / "pki")
    # an encrypted key: its password must reach no log line, status line or DescribeConfigs answer
    key = serialization.load_pem_private_key(pki.key.read_bytes(), password=None)
    pki.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(KEY_PASSWORD.encode())))
    broker = start_secure_broker(
        tmp, ("SASL_SSL", "SSL", "PLAINTEXT"), pki=pki, users=USERS,
        env={"ICELOG_SSL_CLIENT_AUTH": "requested", "ICELOG_SUPER_USERS": "User:admin",
             # Kafka's mapping rules: a certificate's CN is the user name (CN=carol,OU=...,O=... -> carol)
             "ICELOG_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]*),.*$/$1/L,DEFAULT",
             "ICELOG_SSL_KEYFILE_PASSWORD": KEY_PASSWORD},
    )
    yield broker
    broker.broker.stop()


def sasl(secure: SecureBroker, user: str, password: str | None = None) -> dict[str, str]:
    auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism="SCRAM-SHA-512", user=user,
                password=password or USERS[user])
    return {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **auth.librdkafka()}


def admin(secure: SecureBroker) -> AdminClient:
    return AdminClient(sasl(secure, "admin"))


def allow(secure: SecureBroker, principal: str, operation: AclOperation, resource: ResourceType, name: str) -> None:
    binding = AclBinding(resource, name, ResourcePatternType.LITERAL, principal, "*", operation,
                         AclPermissionType.ALLOW)
    client = admin(secure)  # held: librdkafka fails the futures of a client that is gone
    for future in client.create_acls([binding], request_timeout=WAIT_S).values():
        future.result()


def produce(conf: dict[str, str], topic: str, value: bytes) -> KafkaError | None:
    """One record; the error its delivery report carries (None: stored)."""
    reports: list[KafkaError | None] = []
    producer = Producer({**conf, "message.timeout.ms": 8000, "enable.idempotence": False})
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    assert len(reports) == 1
    return reports[0]


def read_all(conf: dict[str, str], topic: str, group: str) -> list[bytes] | KafkaError:
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    end = time.monotonic() + 15
    try:
        while time.monotonic() < end:
            msg = consumer.poll(0.5)
            if msg is None:
                if got:
                    return got
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return msg.error()
            got.append(msg.value())
        return got
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def orders(secure: SecureBroker) -> str:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    client = admin(secure)
    client.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT_S)
    return topic


def test_who_may_do_what_by_principal(secure: SecureBroker, orders: str) -> None:
    """alice (SCRAM) is granted write and read, the service carol (a certificate whose CN is carol) read only,
    bob nothing, and the PLAINTEXT client is ANONYMOUS: each gets what its ACLs say, with Kafka's error codes."""
    allow(secure, "User:alice", AclOperation.WRITE, ResourceType.TOPIC, orders)
    allow(secure, "User:alice", AclOperation.READ, ResourceType.TOPIC, orders)
    allow(secure, "User:alice", AclOperation.READ, ResourceType.GROUP, "alice-group")
    allow(secure, "User:carol", AclOperation.READ, ResourceType.TOPIC, orders)
    allow(secure, "User:carol", AclOperation.READ, ResourceType.GROUP, "carol-group")

    assert produce(sasl(secure, "alice"), orders, b"from alice") is None
    assert read_all(sasl(secure, "alice"), orders, "alice-group") == [b"from alice"]

    bob = produce(sasl(secure, "bob"), orders, b"from bob")
    assert bob is not None and bob.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    cert, key = secure.pki.client("carol")
    carol = {"bootstrap.servers": secure.bootstrap("SSL"),
             **Auth("SSL", ca=secure.pki.ca_pem, cert=cert, key=key).librdkafka()}
    assert read_all(carol, orders, "carol-group") == [b"from alice"]
    refused = produce(carol, orders, b"from carol")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    anonymous = {"bootstrap.servers": secure.bootstrap("PLAINTEXT")}
    assert orders not in AdminClient(anonymous).list_topics(timeout=WAIT_S).topics  # not even its name
    refused = produce(anonymous, orders, b"anonymous")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_acl_granted_while_the_client_is_connected(secure: SecureBroker, orders: str) -> None:
    """bob's producer stays connected through a refusal; an ACL created online lets its next record in."""
    producer = Producer({**sasl(secure, "bob"), "message.timeout.ms": 8000, "enable.idempotence": False,
                         "topic.metadata.refresh.interval.ms": 500})
    reports: list[KafkaError | None] = []
    producer.produce(orders, value=b"before", partition=0, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    assert reports[0] is not None and reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    allow(secure, "User:bob", AclOperation.WRITE, ResourceType.TOPIC, orders)
    deadline = time.monotonic() + WAIT_S
    while True:  # librdkafka refuses locally until its next metadata refresh says the topic is writable
        try:
            producer.produce(orders, value=b"after", partition=0, on_delivery=lambda err, msg: reports.append(err))
            break
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and time.monotonic() < deadline
            producer.poll(0.5)
    producer.flush(WAIT_S)
    assert reports[1] is None


def test_password_changed_online(secure: SecureBroker, orders: str) -> None:
    """The admin changes alice's password with AdminClient.alter_user_scram_credentials: the old one stops
    working at the next login, the new one works, and no restart happens."""
    # (its own grant: under xdist the test that grants alice her ACLs may run in another worker)
    allow(secure, "User:alice", AclOperation.DESCRIBE, ResourceType.TOPIC, orders)
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"alice-new-pw"
    )
    client = admin(secure)
    for future in client.alter_user_scram_credentials([upsert], request_timeout=WAIT_S).values():
        future.result()
    errors: list[KafkaError] = []
    old = AdminClient({**sasl(secure, "alice"), "error_cb": errors.append})
    with pytest.raises(Exception):  # noqa: B017 - the error callback says why
        old.list_topics(timeout=5)
    for _ in range(20):
        if errors:
            break
        old.poll(0.5)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION
    new = AdminClient(sasl(secure, "alice", "alice-new-pw"))
    assert orders in new.list_topics(timeout=WAIT_S).topics


def test_secrets_stay_secret(secure: SecureBroker, orders: str) -> None:
    """The key's password and users' passwords appear in no log line, status line or DescribeConfigs answer;
    DescribeConfigs says the key password is set (sensitive) without its value."""
    broker = ConfigResource(ResourceType.BROKER, "0")
    client = admin(secure)
    configs: dict[str, Any] = client.describe_configs([broker])[broker].result(WAIT_S)
    assert configs["ssl.key.password"].is_sensitive and configs["ssl.key.password"].value is None
    assert "SASL_SSL://127.0.0.1" in configs["listeners"].value
    status = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(secure.broker.data_dir)],
                            capture_output=True, text=True, timeout=120, check=False)
    everything = secure.broker.log() + status.stdout + status.stderr + str({k: v.value for k, v in configs.items()})
    for secret in (KEY_PASSWORD, *USERS.values(), "alice-new-pw"):
        assert secret not in everything

