"""Kafka listeners as Kafka configures them: several at once, TLS with and without client certificates, and
Metadata answering each client with its own listener's address. Real clients over real TLS (a trustme CA)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.support.broker import BrokerProcess, free_port
from tests.support.clients_util import WAIT_S, create_topic
from tests.support.security import Auth, make_pki, round_trip, start_secure_broker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka", "kcat"])
def test_ssl_listener_with_client_certificates(tmp_path: Path, client: str) -> None:
    """mTLS (ssl_client_auth=required): each client presents a certificate from the CA and round-trips records."""
    secure = start_secure_broker(tmp_path, ("SSL", "PLAINTEXT"), env={"ICELOG_SSL_CLIENT_AUTH": "required",
                                                                      "ICELOG_AUTHORIZER_ENABLED": "false"})
    try:
        cert, key = secure.pki.client("alice")
        auth = Auth("SSL", ca=secure.pki.ca_pem, cert=cert, key=key)
        topic = f"mtls-{client}"
        create_topic(secure.bootstrap("PLAINTEXT"), topic)
        values = round_trip(client, secure.bootstrap("SSL"), auth, topic)
        assert len(values) == 20 and all(v.startswith(client.encode()) for v in values)
    finally:
        secure.broker.stop()


def test_tls_refusals_leave_the_broker_serving(tmp_path: Path) -> None:
    """A client without a certificate on an mTLS listener, and a plaintext client on a TLS port, are refused
    (the TLS handshake fails); the broker logs no traceback and keeps serving a good client."""
    secure = start_secure_broker(tmp_path, ("SSL", "PLAINTEXT"), env={"ICELOG_SSL_CLIENT_AUTH": "required",
                                                                      "ICELOG_AUTHORIZER_ENABLED": "false"})
    try:
        for conf in (Auth("SSL", ca=secure.pki.ca_pem).librdkafka(), {}):  # no certificate; no TLS at all
            reports: list[object] = []
            producer = Producer({"bootstrap.servers": secure.bootstrap("SSL"), "message.timeout.ms": 3000, **conf})
            producer.produce("refused", value=b"x", on_delivery=lambda err, msg, out=reports: out.append(err))
            producer.flush(10)
            assert len(reports) == 1 and reports[0] is not None, "a refused client must not deliver"
        with socket.create_connection(("127.0.0.1", secure.ports["SSL"])) as sock:  # bytes that are not TLS
            sock.sendall(b"\x00\x00\x00\x10" + b"\x00" * 16)
            sock.settimeout(WAIT_S)
            answer = sock.recv(100)
            assert not answer.startswith(b"\x00\x00"), "a plaintext request must not get a Kafka answer"
        cert, key = secure.pki.client("bob")
        create_topic(secure.bootstrap("PLAINTEXT"), "after-refusals")
        values = round_trip("confluent", secure.bootstrap("SSL"), Auth("SSL", ca=secure.pki.ca_pem, cert=cert, key=key),
                            "after-refusals")
        assert len(values) == 20
        log = secure.broker.log()
        assert "Traceback" not in log, log
    finally:
        secure.broker.stop()


def test_metadata_names_the_listener_the_client_came_in_on(tmp_path: Path) -> None:
    """advertised_listeners: a client on each listener is told that listener's advertised address."""
    pki = make_pki(tmp_path / "pki")
    plain, tls = free_port(), free_port()
    env = {
        "ICELOG_LISTENERS": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "ICELOG_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{plain},SSL://localhost:{tls}",
        "ICELOG_SSL_CERTFILE": str(pki.cert), "ICELOG_SSL_KEYFILE": str(pki.key),
    }
    broker = BrokerProcess(tmp_path / "data", port=plain, env=env).start()
    try:
        seen = {}
        for name, conf in (("PLAINTEXT", {"bootstrap.servers": f"127.0.0.1:{plain}"}),
                           ("SSL", {"bootstrap.servers": f"localhost:{tls}",
                                    **Auth("SSL", ca=pki.ca_pem).librdkafka()})):
            metadata = AdminClient(conf).list_topics(timeout=WAIT_S)
            seen[name] = [(b.host, b.port) for b in metadata.brokers.values()]
        assert seen == {"PLAINTEXT": [("127.0.0.1", plain)], "SSL": [("localhost", tls)]}
    finally:
        broker.stop()


def test_listener_settings_are_checked_at_start(tmp_path: Path) -> None:
    """Bad listener settings stop start-up with a message that says what to fix; a key others can read too."""
    pki = make_pki(tmp_path / "pki")
    cases = [
        ({"ICELOG_LISTENERS": "SASL_SSL://127.0.0.1:1"}, "needs ssl_certfile and ssl_keyfile"),
        ({"ICELOG_LISTENERS": "HTTP://127.0.0.1:1"}, "is neither a security protocol"),
        ({"ICELOG_LISTENERS": "SSL://127.0.0.1:1", "ICELOG_SSL_CERTFILE": str(pki.cert),
          "ICELOG_SSL_KEYFILE": str(pki.key), "ICELOG_SASL_ENABLED_MECHANISMS": "GSSAPI"}, "GSSAPI not supported"),
    ]
    readable = tmp_path / "readable.key"
    readable.write_bytes(pki.key.read_bytes())
    readable.chmod(0o644)
    cases.append(({"ICELOG_LISTENERS": f"SSL://127.0.0.1:{free_port()}", "ICELOG_SSL_CERTFILE": str(pki.cert),
                   "ICELOG_SSL_KEYFILE": str(readable)}, f"chmod 600 {readable}"))
    for i, (env, message) in enumerate(cases):
        broker = BrokerProcess(tmp_path / f"d{i}", env=env)
        with pytest.raises(RuntimeError) as failure:
            broker.start()
        assert message in str(failure.value)
        assert "Traceback" not in str(failure.value)


def test_non_loopback_listener_without_authentication_warns(tmp_path: Path) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", port=port, env={"ICELOG_LISTENERS": f"PLAINTEXT://0.0.0.0:{port}"})
    broker.start()
    try:
        deadline = time.monotonic() + 10
        while "AUTHENTICATES NOBODY" not in broker.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "AUTHENTICATES NOBODY" in broker.log()
    finally:
        broker.stop()

