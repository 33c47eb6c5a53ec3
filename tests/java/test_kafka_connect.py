"""Kafka Connect (4.1) in distributed mode on icelog: the worker keeps its config, offset and status topics
(compacted) on icelog, runs FileStream source and sink connectors, and after a restart resumes where it was: each line
of the source file reaches the topic and the sink file once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.broker import BrokerProcess, free_port
from tests.support.java import KafkaJava

WAIT_S = 120.0  # bounds each wait; a failing test then shows what did arrive


def rest(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def wait_until(check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:  # the worker's REST listener is not up yet
            pass
        time.sleep(0.5)


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_distributed_worker_runs_file_connectors_and_resumes(kafka_java: KafkaJava, broker: BrokerProcess,
                                                             topic_name: str, tmp_path: Path) -> None:
    port = free_port()
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    prefix = topic_name
    worker = tmp_path / "worker.properties"
    worker.write_text("\n".join([
        f"bootstrap.servers={broker.bootstrap}", f"group.id={prefix}-connect",
        "key.converter=org.apache.kafka.connect.storage.StringConverter",
        "value.converter=org.apache.kafka.connect.storage.StringConverter",
        f"config.storage.topic={prefix}-configs", f"offset.storage.topic={prefix}-offsets",
        f"status.storage.topic={prefix}-status", "config.storage.replication.factor=1",
        "offset.storage.replication.factor=1", "status.storage.replication.factor=1", "offset.storage.partitions=3",
        "status.storage.partitions=1", f"listeners=http://127.0.0.1:{port}", "offset.flush.interval.ms=500", ""]))
    source.write_text("".join(f"first {i}\n" for i in range(50)))
    command = kafka_java.command("org.apache.kafka.connect.cli.ConnectDistributed", str(worker))
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - both workers write to it until they end
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: rest(port, "GET", "/connectors") == [])
        rest(port, "PUT", "/connectors/lines-in/config", {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "file": str(source),
            "topic": f"{prefix}-lines", "tasks.max": "1"})
        rest(port, "PUT", "/connectors/lines-out/config", {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector", "file": str(sink),
            "topics": f"{prefix}-lines", "tasks.max": "1"})
        wait_until(lambda: len(lines_of(sink)) >= 50)
        assert lines_of(sink) == lines_of(source)

        proc.send_signal(signal.SIGTERM)  # a clean stop: offsets flushed, the sink's group offsets committed
        assert proc.wait(timeout=60) in (0, 128 + signal.SIGTERM)  # the JVM exits 143 after its shutdown hooks
        with source.open("a") as more:
            more.write("".join(f"second {i}\n" for i in range(30)))
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        # The connectors come back from the config topic (nobody submits them again) and go on from their offsets.
        wait_until(lambda: len(lines_of(sink)) >= 80)
        status = rest(port, "GET", "/connectors/lines-out/status")
    finally:
        proc.kill()
        proc.wait()
        log.close()
    assert lines_of(sink) == lines_of(source), (tmp_path / "worker.log").read_text()[-3000:]
    assert status["connector"]["state"] == "RUNNING" and status["tasks"][0]["state"] == "RUNNING"

    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in (f"{prefix}-configs", f"{prefix}-offsets", f"{prefix}-status"):
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["cleanup.policy"].value == "compact", topic
