"""The archiver on a Spark standalone cluster whose worker cannot see the broker's data dir.

The worker (tests/support/spark_cluster.py) runs with an empty read-only tmpfs over the broker's data dir, so
the only way its tasks get records is a Fetch to the broker (archive.read_via auto: kafka with a spark:// master).
The catalog and the warehouse are outside the data dir, paths every process of this machine reaches (object
storage is not tested here). `icelog archive --once` is the driver, a process of its own, as on another machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.archive.test_pk_tables import latest, send
from tests.support.archive import ARCHIVE_ENV, create_topic, produce
from tests.support.broker import BrokerProcess
from tests.support.spark_cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SRC = Path(__file__).resolve().parents[2] / "src"


class ClusterLake:
    """A broker, the cluster hiding its data dir, and the catalog and warehouse they share."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.catalog_db = root / "lake" / "catalog.db"
        self.warehouse = (root / "lake" / "warehouse").as_uri()
        self.catalog_db.parent.mkdir(parents=True)
        self.env = {**ARCHIVE_ENV, "ICELOG_ARCHIVE__CATALOG_URI": f"jdbc:sqlite:{self.catalog_db}",
                    "ICELOG_ARCHIVE__WAREHOUSE": self.warehouse}
        self.broker = BrokerProcess(root / "data", env=self.env).start()
        self.cluster = SparkCluster(root / "spark", cores=1).start(hidden=[self.broker.data_dir])

    def archive_env(self, **extra: str) -> dict[str, str]:
        conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", str(SRC)), "spark.cores.max": "1"}
        return {**os.environ, **self.env, "ICELOG_ARCHIVE__SPARK_MASTER": self.cluster.master_url,
                "ICELOG_ARCHIVE__SPARK_CONF": json.dumps(conf), "ICELOG_LISTEN": self.broker.bootstrap,
                "SPARK_LOCAL_IP": "127.0.0.1", **extra}

    def archive_once(self, topic: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(self.broker.data_dir),
             "--topic", topic], env=self.archive_env(**extra), capture_output=True, text=True, timeout=300)

    def rows(self, topic: str) -> list[dict[str, Any]]:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("lake", uri=f"sqlite:///{self.catalog_db}", warehouse=self.warehouse)
        rows: list[dict[str, Any]] = catalog.load_table(("icelog", topic)).scan().to_arrow().to_pylist()
        return rows

    def latest(self, topic: str) -> dict[bytes, tuple[bytes, int, int]]:
        """key → (value, partition, offset) of a primary-key table of the record layout."""
        rows = self.rows(topic)
        got = {r["key"]["__raw__"]: (r["value"]["__raw__"], r["kafka"]["partition"], r["kafka"]["offset"])
               for r in rows}
        assert len(got) == len(rows), "a key appears more than once"
        return got

    def stop(self) -> None:
        self.cluster.stop()
        self.broker.stop()


@pytest.fixture(scope="module")
def cluster_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterLake]:
    lake = ClusterLake(tmp_path_factory.mktemp("cluster"))
    yield lake
    lake.stop()


def test_the_worker_cannot_read_the_intake_by_path(cluster_lake: ClusterLake) -> None:
    """The control: with read_via=files the cluster's tasks fail, so the other tests prove reads over Kafka."""
    topic = "cluster-files"
    create_topic(cluster_lake.broker, topic, partitions=1)
    produce(cluster_lake.broker, topic, 50, partitions=1)
    done = cluster_lake.archive_once(topic, ICELOG_ARCHIVE__READ_VIA="files")
    assert "No such file or directory" in done.stdout + done.stderr, done.stdout + done.stderr[-3000:]


def test_record_layout_archived_on_the_cluster(cluster_lake: ClusterLake) -> None:
    topic = "cluster-records"
    create_topic(cluster_lake.broker, topic)
    produced = produce(cluster_lake.broker, topic, 2000)
    done = cluster_lake.archive_once(topic)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    got = sorted(
        (r["kafka"]["partition"], r["kafka"]["offset"], r["key"] and r["key"]["__raw__"],
         r["value"] and r["value"]["__raw__"], tuple((h["key"], h["value"]) for h in r["headers"]),
         int(r["kafka"]["event_timestamp"].timestamp() * 1_000_000))
        for r in cluster_lake.rows(topic)
    )
    assert got == produced


def test_primary_key_table_on_the_cluster(cluster_lake: ClusterLake) -> None:
    topic = "cluster_pk"
    create_topic(cluster_lake.broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "record"})
    produced = []
    for round_ in range(2):  # the second pass updates and deletes: deletion vectors
        batch = [(f"k{i}".encode(), None if i % 5 == 0 and round_ else f"v{round_}-{i}".encode()) for i in range(60)]
        produced += send(cluster_lake.broker, topic, batch)
        done = cluster_lake.archive_once(topic)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert cluster_lake.latest(topic) == latest(produced)

    # A maintenance round on the cluster (compaction applies the deletion vectors; expiry; orphans): same rows.
    maintain = subprocess.run(
        [sys.executable, "-m", "icelog", "maintain", "--topic", topic, "--data-dir", str(cluster_lake.broker.data_dir)],
        env=cluster_lake.archive_env(), capture_output=True, text=True, timeout=300)
    assert maintain.returncode == 0, maintain.stdout + maintain.stderr[-3000:]
    assert cluster_lake.latest(topic) == latest(produced)


def test_read_back_after_the_trim_is_byte_identical(cluster_lake: ClusterLake) -> None:
    """What the cluster archived is served back by the broker once its intake is gone, byte for byte."""
    from icelog.meta.backends import open_store
    from tests.readback.test_readback import TRIM, produce_codecs, read_back, wait_trimmed
    from tests.support.clients_util import comparable
    from tests.support.clients_util import create_topic as create_topic_with

    topic = "cluster-readback"
    broker = cluster_lake.broker
    create_topic_with(broker.bootstrap, topic, partitions=2, configs=TRIM)
    expected = produce_codecs(broker, topic, 30, 2)
    done = cluster_lake.archive_once(topic)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    ends: dict[int, int] = {}
    for rec in expected:
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
    store = open_store(f"sqlite:///{broker.data_dir / 'meta.db'}")
    try:
        wait_trimmed(store, topic, ends)
    finally:
        store.close()
    for client in ("confluent", "kafka-python"):
        got = read_back(client, broker, topic, [0, 1], len(expected))
        assert comparable(got) == comparable(expected), client
