"""The schema registry asks who you are: HTTPS with the broker's certificate and HTTP basic auth with icelog's
users whenever a Kafka listener authenticates, through Confluent's SchemaRegistryClient against a real broker."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import trustme
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.support.broker import BrokerProcess, free_port

AVRO = json.dumps({"type": "record", "name": "Order", "namespace": "auth.test",
                   "fields": [{"name": "id", "type": "string"}]})


def add_user(data_dir: Path, name: str, password: str) -> None:
    done = subprocess.run([sys.executable, "-m", "icelog", "user", "add", name, "--password-stdin",
                           "--data-dir", str(data_dir)], input=password + "\n", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def write_tls_files(directory: Path, key_mode: int = 0o600) -> dict[str, str]:
    """A test CA's certificate for localhost/127.0.0.1: the broker's cert chain and key, and the CA for clients."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in ("ca.pem", "broker.pem", "broker.key")}
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(paths["broker.pem"]), append=True)
    cert.private_key_pem.write_to_path(str(paths["broker.key"]))
    os.chmod(paths["broker.key"], key_mode)
    return {name: str(path) for name, path in paths.items()}


def secure_env(tls: dict[str, str], port: int) -> dict[str, str]:
    return {"ICELOG_LISTENERS": f"SASL_SSL://127.0.0.1:{port}", "ICELOG_SSL_CERTFILE": tls["broker.pem"],
            "ICELOG_SSL_KEYFILE": tls["broker.key"]}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory, tls: dict[str, str]) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("registry-auth") / "data"
    add_user(data, "alice", "secret")  # before the broker ever ran: the first user
    # ACLs are on (a SASL listener): alice may read and write topic orders, so subject orders-value
    granted = subprocess.run(
        [sys.executable, "-m", "icelog", "acl", "add", "--allow-principal", "User:alice", "--operation", "Read",
         "--operation", "Write", "--topic", "orders", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert granted.returncode == 0, granted.stderr
    port = free_port()
    proc = BrokerProcess(data, port=port, env=secure_env(tls, port)).start()
    yield proc
    proc.stop()


def https_url(broker: BrokerProcess) -> str:
    return f"https://127.0.0.1:{broker.registry_port}"


def client(broker: BrokerProcess, tls: dict[str, str], user_info: str | None) -> SchemaRegistryClient:
    conf = {"url": https_url(broker), "ssl.ca.location": tls["ca.pem"]}
    if user_info is not None:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def test_a_user_registers_and_reads_over_https(secure_broker: BrokerProcess, tls: dict[str, str]) -> None:
    alice = client(secure_broker, tls, "alice:secret")
    schema_id = alice.register_schema("orders-value", Schema(AVRO, "AVRO"))
    latest = alice.get_latest_version("orders-value")
    assert latest.schema_id == schema_id and json.loads(latest.schema.schema_str)["name"] == "Order"
    assert json.loads(alice.get_schema(schema_id).schema_str)["name"] == "Order"
    assert "orders-value" in alice.get_subjects()


def test_subjects_follow_their_topics_acls(secure_broker: BrokerProcess, tls: dict[str, str]) -> None:
    """carol logs in but has no ACL on topic payments: registering its value schema is 403 (40301), and the
    subject list she sees leaves out what she may not read."""
    add_user(secure_broker.data_dir, "carol", "carol-pw")
    carol = client(secure_broker, tls, "carol:carol-pw")
    with pytest.raises(SchemaRegistryError) as refused:
        carol.register_schema("payments-value", Schema(AVRO, "AVRO"))
    assert refused.value.http_status_code == 403 and refused.value.error_code == 40301
    client(secure_broker, tls, "alice:secret").register_schema("orders-value", Schema(AVRO, "AVRO"))
    assert "orders-value" not in carol.get_subjects()


@pytest.mark.parametrize("user_info", [None, "alice:wrong", "mallory:secret"])
def test_without_valid_credentials_is_401(secure_broker: BrokerProcess, tls: dict[str, str],
                                          user_info: str | None) -> None:
    anonymous = client(secure_broker, tls, user_info)
    with pytest.raises(SchemaRegistryError) as write:
        anonymous.register_schema("anon-value", Schema(AVRO, "AVRO"))
    with pytest.raises(SchemaRegistryError) as read:
        anonymous.get_subjects()
    for refused in (write.value, read.value):
        assert refused.http_status_code == 401 and refused.error_code == 40101
    reply = requests.get(f"{https_url(secure_broker)}/subjects", verify=tls["ca.pem"], timeout=10)
    assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == 'Basic realm="icelog"'
    assert reply.json()["error_code"] == 40101


def test_plain_http_is_not_served(secure_broker: BrokerProcess) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{secure_broker.registry_port}/subjects", timeout=10)


def test_a_user_added_while_running_logs_in_without_restart(secure_broker: BrokerProcess,
                                                            tls: dict[str, str]) -> None:
    bob = client(secure_broker, tls, "bob:b0b-pass")
    with pytest.raises(SchemaRegistryError):
        bob.get_subjects()
    add_user(secure_broker.data_dir, "bob", "b0b-pass")
    assert isinstance(client(secure_broker, tls, "bob:b0b-pass").get_subjects(), list)


def test_no_secret_in_the_broker_log(secure_broker: BrokerProcess, tls: dict[str, str]) -> None:
    with pytest.raises(SchemaRegistryError):
        client(secure_broker, tls, "alice:wrong-pw-in-log").get_subjects()
    log = secure_broker.log()
    for secret in ("secret", "wrong-pw-in-log", "b0b-pass", "Authorization", "YWxpY2U6"):  # YWxpY2U6: b64 "alice:"
        assert secret not in log


def test_a_key_file_others_may_read_stops_start_up(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path / "tls", key_mode=0o644)
    port = free_port()
    proc = BrokerProcess(tmp_path / "data", port=port, env=secure_env(tls, port))
    with pytest.raises(RuntimeError) as refused:
        proc.start()
    assert f"chmod 600 {tls['broker.key']}" in str(refused.value)
    assert stat.S_IMODE(os.stat(tls["broker.key"]).st_mode) == 0o644  # reported, not changed behind the user's back
