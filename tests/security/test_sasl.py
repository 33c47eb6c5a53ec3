"""SASL on SASL_SSL and SASL_PLAINTEXT listeners with the four real clients: SCRAM-SHA-512, SCRAM-SHA-256 and
PLAIN; wrong passwords, unknown users and requests before login are refused while others keep being served."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslHandshakeRequest

from icelog.wire import codec
from tests.support.clients_util import WAIT_S, create_topic, recv_exactly, request_frame
from tests.support.security import Auth, SecureBroker, add_user, round_trip, start_secure_broker

pytestmark = pytest.mark.slow

USERS = {"alice": "alice-secret", "bob": "b0b's p@ss,word="}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    broker = start_secure_broker(
        tmp_path_factory.mktemp("sasl"), ("SASL_SSL", "SASL_PLAINTEXT", "PLAINTEXT"),
        env={"ICELOG_AUTHORIZER_ENABLED": "false"}, users=USERS,
    )
    yield broker
    broker.broker.stop()


CASES = [(client, mechanism) for client in ("confluent", "kafka-python", "aiokafka", "kcat")
         for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")]


@pytest.mark.parametrize(("client", "mechanism"), CASES)
def test_sasl_ssl_logins_round_trip(secure: SecureBroker, client: str, mechanism: str) -> None:
    topic = f"sasl-{client}-{mechanism}".lower()
    create_topic(secure.bootstrap("PLAINTEXT"), topic)
    auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism=mechanism, user="bob", password=USERS["bob"])
    values = round_trip(client, secure.bootstrap("SASL_SSL"), auth, topic)
    assert len(values) == 20 and all(v.startswith(client.encode()) for v in values)


def test_sasl_plaintext_login(secure: SecureBroker) -> None:
    create_topic(secure.bootstrap("PLAINTEXT"), "sasl-plaintext")
    auth = Auth("SASL_PLAINTEXT", mechanism="SCRAM-SHA-256", user="alice", password=USERS["alice"])
    assert len(round_trip("confluent", secure.bootstrap("SASL_PLAINTEXT"), auth, "sasl-plaintext")) == 20


def _login_error(secure: SecureBroker, user: str, password: str, mechanism: str) -> KafkaError:
    errors: list[KafkaError] = []
    conf = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism=mechanism, user=user, password=password).librdkafka()
    admin = AdminClient({"bootstrap.servers": secure.bootstrap("SASL_SSL"), "error_cb": errors.append, **conf})
    with pytest.raises(Exception):  # noqa: B017 - the list fails; the error callback says why
        admin.list_topics(timeout=5)
    for _ in range(20):  # the error callback runs from poll()
        if errors:
            break
        admin.poll(0.5)
    assert errors, "librdkafka reported no error"
    return errors[0]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_wrong_password_and_unknown_user_are_refused_alike(secure: SecureBroker, mechanism: str) -> None:
    wrong = _login_error(secure, "alice", "not-her-password", mechanism)
    unknown = _login_error(secure, "mallory", "anything", mechanism)
    for error in (wrong, unknown):
        assert error.code() == KafkaError._AUTHENTICATION, error
        assert "invalid credentials" in error.str(), error.str()
    assert "alice-secret" not in secure.broker.log() and "not-her-password" not in secure.broker.log()
    # the broker keeps serving the others
    auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism=mechanism, user="alice", password=USERS["alice"])
    create_topic(secure.bootstrap("PLAINTEXT"), f"after-refusal-{mechanism}".lower())
    assert len(round_trip("confluent", secure.bootstrap("SASL_SSL"), auth, f"after-refusal-{mechanism}".lower())) == 20


def test_no_api_before_login_on_a_sasl_listener(secure: SecureBroker) -> None:
    """A Metadata request before SASL login closes the connection unanswered (as Kafka's authenticator)."""
    with socket.create_connection(("127.0.0.1", secure.ports["SASL_PLAINTEXT"]), timeout=WAIT_S) as sock:
        sock.sendall(request_frame(MetadataRequest(topics=None), 1, 1))
        assert sock.recv(10) == b""
    assert "Metadata request before SASL authentication" in secure.broker.log()


def test_plain_v0_handshake_with_bare_tokens(secure: SecureBroker) -> None:
    """SaslHandshake v0 then a bare PLAIN token (the pre-KIP-152 form), then an ordinary request."""
    with socket.create_connection(("127.0.0.1", secure.ports["SASL_PLAINTEXT"]), timeout=WAIT_S) as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism="PLAIN"), 0, 1))
        size = struct.unpack(">i", recv_exactly(sock, 4))[0]
        response = codec.response_class(ApiKey.SaslHandshake).decode(recv_exactly(sock, size)[4:], version=0)
        assert response.error_code == 0 and "PLAIN" in response.mechanisms
        token = b"\0alice\0" + USERS["alice"].encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert recv_exactly(sock, 4) == b"\0\0\0\0"  # PLAIN's empty server token
        sock.sendall(request_frame(MetadataRequest(topics=None), 1, 2))
        size = struct.unpack(">i", recv_exactly(sock, 4))[0]
        assert struct.unpack(">i", recv_exactly(sock, size)[:4])[0] == 2  # the correlation id: answered


def test_users_added_while_the_broker_runs_can_log_in(secure: SecureBroker) -> None:
    add_user(secure.broker.data_dir, "carol", "carol-pw", "SCRAM-SHA-512")
    create_topic(secure.bootstrap("PLAINTEXT"), "new-user")
    auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism="SCRAM-SHA-512", user="carol", password="carol-pw")
    assert len(round_trip("confluent", secure.bootstrap("SASL_SSL"), auth, "new-user")) == 20


