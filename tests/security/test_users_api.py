"""AlterUserScramCredentials / DescribeUserScramCredentials through confluent-kafka's AdminClient, with the
cluster ALTER / DESCRIBE Kafka asks for (ACLs on: User:ANONYMOUS on PLAINTEXT)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin import DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse

from icelog.meta.sqlite import SqliteStore
from icelog.security.credentials import check_plain
from tests.support.broker import BrokerProcess
from tests.support.clients_util import WAIT_S, _request

ICELOG = str(Path(sys.executable).parent / "icelog")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("users") / "data", env={"ICELOG_AUTHORIZER_ENABLED": "true"}).start()
    yield proc
    proc.stop()


def code(future: object) -> int | None:
    try:
        future.result(WAIT_S)  # type: ignore[attr-defined]
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def test_alter_and_describe_users(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upsert = UserScramCredentialUpsertion("alice", sha512, b"s3cret-pw", b"0123456789abcdef")
    assert code(admin.alter_user_scram_credentials([upsert])["alice"]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # confluent-kafka 2.16 crashes (munmap_chunk) on a refused DescribeUserScramCredentials: asked on the wire
    refused = _request(broker.bootstrap, DescribeUserScramCredentialsRequest(
        version=0, users=[DescribeUserScramCredentialsRequest.UserName(name="alice")]
    ), DescribeUserScramCredentialsResponse, 0)
    assert refused.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert [r.error_code for r in refused.results] == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]

    done = subprocess.run([ICELOG, "acl", "add", "--allow-principal", "User:ANONYMOUS", "--operation", "Alter",
                           "--operation", "Describe", "--cluster", "--data-dir", str(broker.data_dir)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    time.sleep(1.5)
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    results = admin.alter_user_scram_credentials([
        upsert,
        UserScramCredentialUpsertion("alice", sha256, b"other-pw"),
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw"),
        UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256),
    ])
    assert code(results["alice"]) is None
    assert code(results["bob"]) == KafkaError.UNACCEPTABLE_CREDENTIAL  # too few iterations
    assert code(results["carol"]) == KafkaError.RESOURCE_NOT_FOUND
    described = admin.describe_user_scram_credentials(["alice", "bob"])
    infos = described["alice"].result(WAIT_S).scram_credential_infos
    assert sorted((i.mechanism, i.iterations) for i in infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 8192)
    ]
    assert code(described["bob"]) == KafkaError.RESOURCE_NOT_FOUND
    store = SqliteStore(broker.data_dir / "meta.db")  # the stored keys check the password the client salted
    try:
        assert check_plain(store, "alice", "s3cret-pw") and not check_plain(store, "alice", "wrong")
    finally:
        store.close()
    deleted = admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_512)])
    assert code(deleted["alice"]) is None
    infos = admin.describe_user_scram_credentials(["alice"])["alice"].result(WAIT_S).scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 4096)]
