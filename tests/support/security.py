"""TLS and SASL for tests: a throwaway CA (trustme), a broker with several listeners, and the four real clients
(confluent-kafka, kafka-python, aiokafka, kcat) configured as their users would for SSL and SASL."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

from tests.support.broker import BrokerProcess, free_port
from tests.support.clients_util import KCAT, WAIT_S


@dataclass(frozen=True)
class Pki:
    """A CA, the broker's certificate (localhost and 127.0.0.1) and client certificates, as PEM files."""

    root: Path
    ca: trustme.CA
    ca_pem: Path
    cert: Path
    key: Path

    def client(self, name: str) -> tuple[Path, Path]:
        """A client certificate whose subject's CN is `name` (and its key)."""
        cert = self.ca.issue_cert(f"{name}@clients.example", common_name=name)
        cert_path, key_path = self.root / f"{name}.pem", self.root / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_path))
        cert.private_key_pem.write_to_path(str(key_path))
        key_path.chmod(0o600)
        return cert_path, key_path


def make_pki(root: Path) -> Pki:
    root.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    ca_pem, cert, key = root / "ca.pem", root / "broker.pem", root / "broker.key"
    ca.cert_pem.write_to_path(str(ca_pem))
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    return Pki(root, ca, ca_pem, cert, key)


def add_user(data_dir: Path, name: str, password: str, *mechanisms: str) -> None:
    """`icelog user add` as an operator runs it (before start, or with the broker up)."""
    args = [a for m in mechanisms for a in ("--mechanism", m)]
    proc = subprocess.run(
        [sys.executable, "-m", "icelog", "user", "add", name, *args, "--password-stdin", "--data-dir", str(data_dir)],
        input=password.encode() + b"\n", capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()


@dataclass
class SecureBroker:
    """A broker with named listeners; `ports[protocol]` is where each listens on 127.0.0.1."""

    broker: BrokerProcess
    pki: Pki
    ports: dict[str, int] = field(default_factory=dict)

    def bootstrap(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"


def start_secure_broker(tmp: Path, protocols: tuple[str, ...], env: dict[str, str] | None = None,
                        users: dict[str, str] | None = None, pki: Pki | None = None,
                        preexec_fn: Callable[[], None] | None = None) -> SecureBroker:
    """A broker serving each protocol on its own port (the first is the one `start` waits for)."""
    pki = pki or make_pki(tmp / "pki")
    ports = {p: free_port() for p in protocols}
    data_dir = tmp / "data"
    for user, password in (users or {}).items():
        add_user(data_dir, user, password)
    settings = {
        "ICELOG_LISTENERS": ",".join(f"{p}://127.0.0.1:{port}" for p, port in ports.items()),
        "ICELOG_SSL_CERTFILE": str(pki.cert),
        "ICELOG_SSL_KEYFILE": str(pki.key),
        "ICELOG_SSL_CAFILE": str(pki.ca_pem),
        **(env or {}),
    }
    broker = BrokerProcess(data_dir, port=ports[protocols[0]], env=settings, preexec_fn=preexec_fn).start(timeout=60)
    return SecureBroker(broker, pki, ports)


@dataclass(frozen=True)
class Auth:
    """How a client connects: the listener's protocol, and SASL credentials or a client certificate."""

    protocol: str
    ca: Path | None = None
    mechanism: str | None = None
    user: str | None = None
    password: str | None = None
    cert: Path | None = None
    key: Path | None = None

    def librdkafka(self) -> dict[str, str]:
        conf = {"security.protocol": self.protocol}
        if self.ca:
            conf["ssl.ca.location"] = str(self.ca)
        if self.cert and self.key:
            conf.update({"ssl.certificate.location": str(self.cert), "ssl.key.location": str(self.key)})
        if self.mechanism:
            conf.update({"sasl.mechanism": self.mechanism, "sasl.username": self.user or "",
                         "sasl.password": self.password or ""})
        return conf

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.protocol.endswith("SSL"):
            return None
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.cert and self.key:
            context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def python(self) -> dict[str, Any]:
        """kafka-python's and aiokafka's settings (the same names)."""
        conf: dict[str, Any] = {"security_protocol": self.protocol}
        context = self.ssl_context()
        if context is not None:
            conf["ssl_context"] = context
        if self.mechanism:
            conf.update({"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                         "sasl_plain_password": self.password})
        return conf


def round_trip(client: str, bootstrap: str, auth: Auth, topic: str, count: int = 20) -> list[bytes]:
    """Produce `count` values with `client` and read them back with the same client; the values read."""
    values = [f"{client}-{i}-{uuid.uuid4().hex[:6]}".encode() for i in range(count)]
    if client == "confluent":
        from confluent_kafka import Consumer, Producer

        producer = Producer({"bootstrap.servers": bootstrap, **auth.librdkafka()})
        for value in values:
            producer.produce(topic, value=value, partition=0)
        assert producer.flush(WAIT_S) == 0, "librdkafka could not deliver every record"
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                             **auth.librdkafka()})
        consumer.subscribe([topic])
        got: list[bytes] = []
        end = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < end:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        consumer.close()
        return got
    if client == "kafka-python":
        from kafka import KafkaConsumer, KafkaProducer

        kp = KafkaProducer(bootstrap_servers=bootstrap, **auth.python())
        for value in values:
            kp.send(topic, value=value, partition=0)
        kp.flush(WAIT_S)
        kp.close()
        kc = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
                           consumer_timeout_ms=int(WAIT_S * 1000), **auth.python())
        got = []
        for msg in kc:
            got.append(msg.value)
            if len(got) >= count:
                break
        kc.close()
        return got
    if client == "aiokafka":
        return asyncio.run(_aiokafka_round_trip(bootstrap, auth, topic, values))
    if client == "kcat":
        conf = [a for k, v in auth.librdkafka().items() for a in ("-X", f"{k}={v}")]
        stdin = b"\n".join(values) + b"\n"
        proc = subprocess.run([KCAT, "-P", "-b", bootstrap, "-t", topic, "-p", "0", *conf], input=stdin,
                              capture_output=True, timeout=WAIT_S, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        proc = subprocess.run([KCAT, "-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                               "-c", str(count), *conf], capture_output=True, timeout=WAIT_S, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.splitlines()
    raise ValueError(client)


async def _aiokafka_round_trip(bootstrap: str, auth: Auth, topic: str, values: list[bytes]) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **auth.python())
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}",
                                auto_offset_reset="earliest", **auth.python())
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(WAIT_S):
            async for msg in consumer:
                assert msg.value is not None
                got.append(msg.value)
                if len(got) >= len(values):
                    break
    finally:
        await consumer.stop()
    return got
