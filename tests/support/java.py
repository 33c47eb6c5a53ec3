"""Apache Kafka's own Java client and tools against icelog: the jars the set-up fetched, drivers compiled once.

`make setup` copies `jars/kafka/pom.xml`'s artifacts (kafka-clients, kafka-tools, Kafka's core, Streams, Connect)
and their dependencies into `.venv/kafka-jars` (`ICELOG_KAFKA_JARS_DIR` names another directory); nothing is
fetched here. The tests' Java drivers (`tests/java/drivers/*.java`) are compiled with javac once per session into
the session's temp directory. Every JVM runs with the JIT's first tier: these JVMs live for seconds, and on a busy
2-core machine C2's compiler threads only slow them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KAFKA_JARS_ENV = "ICELOG_KAFKA_JARS_DIR"
DRIVER_SOURCES = ROOT / "tests" / "java" / "drivers"
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx512m")  # kafka-run-class.sh gives tools 256 MB
KAFKA_VERSION = "4.1.1"  # jars/kafka/pom.xml's kafka.version

# Kafka 4.1's tool classes (kafka-tools, or Kafka's core for kafka-configs.sh), by the script name users know.
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "producer-performance": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-performance": "org.apache.kafka.tools.ConsumerPerformance",
    "end-to-end-latency": "org.apache.kafka.tools.EndToEndLatency",
}


def kafka_jars_dir() -> Path:
    """Where the set-up put Kafka's jars; a missing directory says to run the set-up (never fetched here)."""
    jars = Path(os.environ.get(KAFKA_JARS_ENV) or ROOT / ".venv" / "kafka-jars")
    if not (jars / f"kafka-clients-{KAFKA_VERSION}.jar").exists():
        raise RuntimeError(f"no kafka-clients-{KAFKA_VERSION}.jar in {jars}: run `make setup` "
                           f"(scripts/fetch-jars.sh .venv/kafka-jars jars/kafka/pom.xml)")
    return jars


def _tool(name: str) -> str:
    """A JDK tool (java, javac) from the PATH: ICELOG_TESTS_NO_JVM's refusing `java` comes first there."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"no {name} on the PATH: install a JDK (scripts/setup.sh does)")
    return found


class KafkaJava:
    """Kafka's jars and the compiled drivers: runs a driver or a tool class in a JVM of its own."""

    def __init__(self, classes_dir: Path) -> None:
        self.jars = kafka_jars_dir()
        self.classes = classes_dir
        self.classes.mkdir(parents=True, exist_ok=True)
        sources = sorted(str(path) for path in DRIVER_SOURCES.glob("*.java"))
        done = subprocess.run([_tool("javac"), "-nowarn", "-cp", self.classpath, "-d", str(self.classes), *sources],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed:\n{done.stdout}\n{done.stderr}")

    @property
    def classpath(self) -> str:
        return f"{self.classes}{os.pathsep}{self.jars}/*"

    def command(self, main: str, *args: str) -> list[str]:
        """The command line of a JVM running `main` (a driver or a tool's class) with Kafka's jars."""
        return [_tool("java"), *JVM_OPTIONS, "-cp", self.classpath, main, *args]

    def run(self, main: str, *args: str, timeout: float = 180, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `main` to its end; with `check`, a non-zero exit fails with its output."""
        done = subprocess.run(self.command(main, *args), input=stdin, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{main} {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def tool(self, name: str, *args: str, timeout: float = 180, stdin: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        """One of Kafka's command-line tools, by its script's name (`kafka-topics`), as `java -cp` runs it."""
        return self.run(TOOLS[name], *args, timeout=timeout, stdin=stdin, check=check)

    def checks(self, bootstrap: str, prefix: str, *checks: str, timeout: float = 300) -> dict[str, dict[str, Any]]:
        """ClientChecks' checks in one JVM: each check's JSON answer by its name."""
        done = self.run("ClientChecks", bootstrap, prefix, *checks, timeout=timeout)
        answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return {answer.pop("check"): answer for answer in answers}
