"""Helpers of the sink tests (tests/sink/): the sink's lake (a data dir and its icelog.yaml), run as a user runs
`icelog sink`, and what the source cluster says about the sink's consumer group.

A second icelog broker with archiving off stands in for the external cluster; the lake's catalog is SQLite in its
data dir unless `env` names another (ICELOG_ARCHIVE__CATALOG_URI, as tests/sink/test_sink_lake.py does with
PostgreSQL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tests.support.broker import BrokerProcess

SINK = "prod"
GROUP = "icelog-sink-prod"


class Lake:
    """The sink's side: a data dir with the metadata store, the catalog and the warehouse, and its config."""

    def __init__(self, root: Path, source: BrokerProcess, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.data_dir = root / "lake"
        self.source = source
        self.config = root / "icelog.yaml"
        self.topics = ["orders", "users", "payments"]
        self.env = env or {}
        self.write_config()

    def write_config(self, **extra: Any) -> None:
        sink = {"bootstrap_servers": self.source.bootstrap, "topics": self.topics, **extra}
        self.config.write_text(yaml.safe_dump({"sinks": {SINK: sink}}))

    def environ(self, fault: str | None = None) -> dict[str, str]:
        env = {**os.environ, "ICELOG_ARCHIVE__ENABLED": "false", **self.env}
        env.pop("ICELOG_TEST_FAULT", None)
        if fault:
            env["ICELOG_TEST_FAULT"] = fault
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "icelog", "--config", str(self.config), *args, "--data-dir", str(self.data_dir)]

    def run(self, *args: str, fault: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), env=self.environ(fault), capture_output=True, text=True,
                              timeout=timeout)

    def sink_once(self, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("sink", "--once", fault=fault)

    def sql(self, query: str) -> list[dict[str, Any]]:
        """`icelog sql --format json`, as a user runs it: Spark SQL over the lake's catalog; the rows."""
        done = self.run("sql", query, "--format", "json", timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def catalog(self) -> Any:
        """pyiceberg onto the lake's catalog (SQLite in the data dir, or the JDBC catalog `env` names)."""
        from pyiceberg.catalog.sql import SqlCatalog

        from icelog.config import load_settings
        from icelog.lake.catalog import postgres_catalog_url

        warehouse = (self.data_dir / "warehouse").resolve().as_uri()
        if "ICELOG_ARCHIVE__CATALOG_URI" not in self.env:
            return SqlCatalog("lake", uri=f"sqlite:///{self.data_dir / 'catalog.db'}", warehouse=warehouse)
        settings = load_settings(data_dir=str(self.data_dir), archive={
            "catalog_uri": self.env["ICELOG_ARCHIVE__CATALOG_URI"],
            "catalog_properties": json.loads(self.env.get("ICELOG_ARCHIVE__CATALOG_PROPERTIES", "{}")),
        })
        url = postgres_catalog_url(settings)
        assert url is not None
        return SqlCatalog(settings.archive.catalog_name, uri=url, warehouse=settings.warehouse)

    def table(self, topic: str) -> Any:
        return self.catalog().load_table((SINK, topic))

    def rows(self, topic: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.table(topic).scan().to_arrow().to_pylist()
        return rows


def record_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Raw-layout rows as tests/support/archive.produce returns what it produced."""
    return sorted(
        (r["kafka"]["partition"], r["kafka"]["offset"], r["key"] and r["key"]["__raw__"],
         r["value"] and r["value"]["__raw__"], tuple((h["key"], h["value"]) for h in r["headers"]),
         int(r["kafka"]["event_timestamp"].timestamp() * 1_000_000))
        for r in rows
    )


_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.COORDINATOR_NOT_AVAILABLE}


def group_offsets(source: BrokerProcess, topic: str, partitions: int, group: str = GROUP) -> dict[int, int]:
    """The offsets the sink's group has committed on the source (negative: none)."""
    consumer = Consumer({"bootstrap.servers": source.bootstrap, "group.id": group})
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
                return {tp.partition: tp.offset for tp in got}
            except KafkaException as exc:
                # Kafka answers NOT_COORDINATOR (or _LOAD_IN_PROGRESS) while it loads the offsets topic's partition;
                # librdkafka hands that to committed() rather than retrying, so an application retries.
                if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def end_offsets(source: BrokerProcess, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": source.bootstrap, "group.id": "probe"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def sink_status_lines(stdout: str, sink: str = SINK) -> list[list[str]]:
    """`icelog status`'s rows of a sink's partitions, split in cells (SINK TOPIC PARTITION … LAG-RECORDS …)."""
    return [line.split() for line in stdout.splitlines() if line.startswith(sink + " ")]
