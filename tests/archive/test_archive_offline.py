"""`icelog archive --once` with the broker stopped (cron-style): the embedded registry's schemas come from the
metadata store, so raw topics and Protobuf topics both archive without any process listening.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory

from icelog.schema.protobuf_schema import build_pool, compile_schema
from tests.support.archive import ARCHIVE_ENV, create_topic
from tests.support.broker import BrokerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.spark]  # `icelog archive` runs Spark in a child process

PROTO = """
syntax = "proto3";
package off;
message Header { string source = 1; }
message Click { string page = 1; int64 at = 2; Header header = 3; }
"""


def test_archive_once_with_the_broker_stopped(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env=ARCHIVE_ENV).start()
    try:
        create_topic(broker, "off-raw", 2)
        create_topic(broker, "off-clicks", 1)
        registry = SchemaRegistryClient({"url": broker.registry_url})
        click = message_factory.GetMessageClass(
            build_pool(compile_schema(PROTO, {})).FindMessageTypeByName("off.Click")
        )
        serialize = ProtobufSerializer(click, registry, {"use.deprecated.format": False})
        ctx = SerializationContext("off-clicks", MessageField.VALUE)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(20):
            producer.produce("off-raw", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
            message = click(page=f"/p{i}", at=i)
            message.header.source = "web"
            producer.produce("off-clicks", value=serialize(message, ctx))
        assert producer.flush(30) == 0
    finally:
        broker.stop()

    # Nothing listens anywhere now: not the broker, not the embedded registry (its port is the default's).
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{free_port()}"}
    # A typo in a cron line, or --topic without --once, is refused (exit 2) instead of archiving nothing.
    typo_dir = broker.data_dir.parent / "icelog-dta"
    for extra, data_dir, said in ((["--once", "--topic", "off-clickz"], broker.data_dir, "no topic off-clickz"),
                                  (["--topic", "off-raw"], broker.data_dir, "--topic needs --once"),
                                  (["--once"], typo_dir, f"no icelog data in {typo_dir}")):
        command = [sys.executable, "-m", "icelog", "archive", *extra, "--data-dir", str(data_dir)]
        refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and said in refused.stderr, refused.stdout + refused.stderr
    # The other commands that read the data directory refuse the typo the same way (`sql` created an empty catalog
    # there and answered "table not found").
    for command in (["sql", "SELECT count(*) FROM icelog.`off-raw`"], ["status"], ["maintain", "--dry-run"]):
        refused = subprocess.run([sys.executable, "-m", "icelog", *command, "--data-dir", str(typo_dir)],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and f"no icelog data in {typo_dir}" in refused.stderr, refused.stderr
    assert not typo_dir.exists()  # and no empty metadata store or catalog is left there
    done = subprocess.run(
        [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(broker.data_dir)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # The continuous archiver, stopped with Ctrl-C once Spark runs: it ends its loop and exits cleanly (PySpark's
    # own SIGINT handler, which cancels every job and raises KeyboardInterrupt, must not replace the archiver's).
    running = subprocess.Popen([sys.executable, "-m", "icelog", "archive", "--data-dir", str(broker.data_dir)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert running.stderr is not None
    lines = []
    for line in running.stderr:  # the archiver's log
        lines.append(line)
        if "Spark started" in line:
            break
    running.send_signal(signal.SIGINT)
    _out, rest = running.communicate(timeout=120)
    assert running.returncode == 0 and "KeyboardInterrupt" not in rest, "".join(lines) + rest

    raw = scan(broker.data_dir, "off-raw")
    assert sorted(bytes(r["value"]["__raw__"]) for r in raw) == sorted(f"v{i}".encode() for i in range(20))
    clicks = sorted(scan(broker.data_dir, "off-clicks"), key=lambda r: r["kafka"]["offset"])
    assert [(r["value"]["page"], r["value"]["at"], r["value"]["header"]) for r in clicks] == [
        (f"/p{i}", i, {"source": "web"}) for i in range(20)
    ]


def scan(data_dir: Path, topic: str) -> list[dict[str, Any]]:
    """The table's rows, read with pyiceberg (no Spark, no broker)."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{data_dir / 'catalog.db'}",
                         warehouse=(data_dir.resolve() / "warehouse").as_uri())
    return catalog.load_table(("icelog", topic)).scan().to_arrow().to_pylist()  # type: ignore[no-any-return]
