"""/metrics, /healthz and /readyz of a real broker while confluent-kafka produces and consumes; the dashboard.

(The archive's metrics, lag returning to 0 and freshness, with a real archiver: tests/archive/test_metrics_archive.py.)
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tests.support.archive import create_topic
from tests.support.broker import BrokerProcess, free_port
from tests.support.metrics import exported_names, promtool_check, scrape_text, value

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "icelog.json"


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_metrics_move_while_clients_produce_and_consume(broker: BrokerProcess) -> None:
    before = scrape_text(broker.metrics_url)
    create_topic(broker, "metrics-clients", partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(500):
        producer.produce("metrics-clients", value=b"x" * 100, key=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "metrics-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["metrics-clients"])
    got = 0
    while got < 300:
        got += sum(1 for m in consumer.consume(100, 1.0) if m.error() is None)
    consumer.commit(asynchronous=False)
    # While the consumer's connection is open
    during = scrape_text(broker.metrics_url)
    consumer.close()
    assert value(during, "icelog_connections") >= 1

    def moved(name: str, **labels: Any) -> float:
        return value(during, name, **labels) - value(before, name, **labels)

    assert moved("icelog_requests_total", api="Produce") >= 1
    assert moved("icelog_request_duration_seconds_count", api="Produce") >= 1
    assert moved("icelog_requests_total", api="Fetch") >= 1
    assert moved("icelog_request_bytes_total", api="Produce") > 500 * 100 / 2  # (the batches compress nothing)
    assert moved("icelog_response_bytes_total", api="Fetch") > 300 * 100 / 2
    assert moved("icelog_intake_group_commit_bytes_count") >= 1
    assert moved("icelog_intake_fsync_seconds_count") >= 1
    assert value(during, "icelog_partition_high_watermark", topic="metrics-clients") == 500
    assert value(during, "icelog_partition_intake_bytes", topic="metrics-clients") > 0
    # consumer-group lag: 500 written, the group committed what it read
    lag = value(during, "icelog_consumer_group_lag_records", group="metrics-group", topic="metrics-clients")
    assert lag == 500 - got
    assert value(during, "icelog_backpressure_state", topic="metrics-clients") == 0
    # The process's memory and the caches' sizes and bounds (docs/operations.md#memory)
    assert value(during, "process_resident_memory_bytes") > 0
    assert value(during, "icelog_cache_entries", cache="intake_index") >= 2  # a chunk per partition at least
    assert value(during, "icelog_cache_max_entries", cache="intake_index") >= 2 * 2 * 4096  # this topic's and others'
    assert value(during, "icelog_cache_max_bytes", cache="readback_batches") == 256 * 1024 * 1024
    checked = promtool_check(during)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # No client id, offset or other unbounded value as a label
    labels = set(re.findall(r"[{,]([a-z_]+)=", during))
    assert labels <= {"api", "listener", "topic", "partition", "group", "table", "outcome", "cache", "le", "quantile",
                      "implementation", "major", "minor", "patchlevel", "version"}, labels


def test_health_and_readiness(broker: BrokerProcess) -> None:
    assert _get(f"{broker.metrics_url}/healthz") == (200, {"status": "ok"})
    status, body = _get(f"{broker.metrics_url}/readyz")
    assert status == 200, body
    assert body["ready"] is True and body["problems"] == []
    assert set(body["checks"]) == {"kafka_listener", "metadata_store", "archiver", "catalog", "produce"}


def test_metrics_listen_off_and_a_taken_port(tmp_path: Path) -> None:
    off = BrokerProcess(tmp_path / "off", env={"ICELOG_METRICS_LISTEN": "off"}).start()
    try:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", off.metrics_port), timeout=1).close()
    finally:
        off.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = subprocess.run(
            [sys.executable, "-m", "icelog", "serve", "--listen", f"127.0.0.1:{free_port()}", "--registry-listen",
             "off", "--metrics-listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "ICELOG_ARCHIVE__ENABLED": "false"},
        )
    assert served.returncode != 0
    assert f"icelog: cannot serve metrics on 127.0.0.1:{port}" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr, served.stderr


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    return [t["expr"] for p in panels for t in p.get("targets", []) if t.get("expr")]


def test_every_dashboard_query_names_exported_metrics(broker: BrokerProcess) -> None:
    exported = exported_names(scrape_text(broker.metrics_url))
    queries = _dashboard_queries()
    assert len(queries) >= 10
    named: set[str] = set()
    for expr in queries:
        found = set(re.findall(r"\b((?:icelog|process)_[a-z0-9_]+)", expr))
        assert found, f"a query names no icelog metric: {expr}"
        missing = found - exported
        assert not missing, f"{expr}: not exported by icelog: {missing}"
        named |= found
    # throughput, latency, lag to Iceberg, freshness and table health are all on it
    for needed in ("icelog_request_bytes_total", "icelog_request_duration_seconds_bucket", "icelog_archive_lag_records",
                   "icelog_archive_freshness_seconds_bucket", "icelog_table_data_files"):
        assert needed in named, needed


def test_every_exported_metric_is_documented(broker: BrokerProcess) -> None:
    page = (ROOT / "docs" / "metrics.md").read_text()
    families = {line.split(" ")[2] for line in scrape_text(broker.metrics_url).splitlines()
                if line.startswith("# TYPE icelog_")}
    undocumented = {name for name in families if f"`{name}`" not in page}
    assert not undocumented, undocumented
