"""A real Apache Kafka 4.1 broker for the tests: KRaft, one node that is both broker and controller, run from the
jars jars/kafka/pom.xml fetches into `.venv/kafka-jars` at set-up (kafka_2.13 and its runtime dependencies:
kafka-server, kafka-raft, kafka-metadata, kafka-storage, the coordinators, scala-library). Nothing is downloaded
here.

Start: a generated `server.properties` (free ports for the PLAINTEXT listener and the controller, log.dirs in the
test's tmp dir, replication factors of the internal topics 1), the storage formatted by `kafka.tools.StorageTool
format --standalone` (what `kafka-storage.sh format` runs), then `java -Xmx512m -cp <jars> kafka.Kafka
server.properties`; ready when a Metadata request answers. Kafka logs through SLF4J with no binding in
`.venv/kafka-jars`, so its log (kafka.log in `root`) holds only what the JVM itself prints. `stop` is SIGTERM (a
controlled shutdown), `kill` is SIGKILL, `restart` starts the same node again on the same ports and log dirs.

The object has the `bootstrap` attribute tests/support/broker.BrokerProcess has, so helpers written for an icelog
source (tests/support/archive.produce, tests/support/sink.Lake) take it unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.support.broker import free_port
from tests.support.java import kafka_jars_dir
from tests.support.security import Pki


def java_command() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


class KafkaBroker:
    """One Apache Kafka node (KRaft, combined broker+controller) in `root`."""

    # Quick to start, small (tests): C1 only, the serial collector. A benchmark passes Kafka's own
    # (kafka-server-start.sh's) options instead: SERVER_JVM.
    TEST_JVM = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
    SERVER_JVM = ("-Xmx1G", "-Xms1G", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                  "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent")

    def __init__(self, root: Path, extra: dict[str, str] | None = None, jvm: tuple[str, ...] = TEST_JVM,
                 pki: Pki | None = None, scram_users: dict[str, str] | None = None) -> None:
        """`pki` adds a SASL_SSL listener (its broker certificate as a PEM keystore) whose SCRAM-SHA-512 users are
        `scram_users` (name: password), written into the metadata log by the storage format (`--add-scram`)."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.pki = pki
        self.scram_users = scram_users or {}
        self.sasl_ssl_port = free_port() if pki else None
        self.controller_port = free_port()
        self.extra = extra or {}
        self.jvm = jvm
        self.properties = root / "server.properties"
        self.logs = root / "logs"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cluster_id = _kafka_uuid()
        self._write_properties()
        self._format()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        assert self.sasl_ssl_port, "no SASL_SSL listener"
        return f"localhost:{self.sasl_ssl_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def classpath(self) -> str:
        return str(kafka_jars_dir() / "*")

    def _write_properties(self) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        if self.pki:
            keystore = self.root / "keystore.pem"  # Kafka's PEM keystore: the private key, then the chain
            keystore.write_text(_pkcs8(self.pki.key) + self.pki.cert.read_text())
            props["listeners"] += f",SASL_SSL://127.0.0.1:{self.sasl_ssl_port}"
            props["advertised.listeners"] += f",SASL_SSL://localhost:{self.sasl_ssl_port}"
            props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
            props.update({
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.pki.ca_pem),
            })
        props.update(self.extra)
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java(self, main: str, *args: str) -> list[str]:
        return [java_command(), *self.jvm, "-Djava.awt.headless=true", f"-Dkafka.logs.dir={self.logs}",
                "-cp", self.classpath(), main, *args]

    def _format(self) -> None:
        done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c",
                                         str(self.properties), "--standalone", "--ignore-formatted",
                                         *[arg for name, password in self.scram_users.items() for arg in (
                                             "--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")]),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        self.logs.mkdir(exist_ok=True)
        out = open(self.root / "kafka.log", "ab")  # noqa: SIM115 (the broker's lifetime)
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(self.properties)), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            if self._answers():
                return self
            time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"Kafka did not answer Metadata in {timeout}s:\n{self.log()[-4000:]}")

    def _answers(self) -> bool:
        import socket

        from confluent_kafka.admin import AdminClient

        try:  # the listener first: librdkafka would log every refused connection
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            md = admin.list_topics(timeout=1)
        except Exception:
            return False
        return bool(md.brokers)

    def log(self) -> str:
        path = self.root / "kafka.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> KafkaBroker:
        self.stop()
        return self.start()

    def rss_bytes(self) -> int:
        """The broker's resident memory (VmRSS of /proc/PID/status)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kafka_uuid() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what `kafka-storage random-uuid`
    prints). Like Kafka's Uuid.randomUuid, never one that starts with '-': the storage tool's argument parser
    would take it for an option (a bench run failed on one)."""
    import base64

    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


def _pkcs8(key: Path) -> str:
    """The key as unencrypted PKCS#8 (BEGIN PRIVATE KEY): Kafka's PEM keystore reads no other form (trustme writes
    SEC1, BEGIN EC PRIVATE KEY)."""
    from cryptography.hazmat.primitives import serialization

    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    return loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
