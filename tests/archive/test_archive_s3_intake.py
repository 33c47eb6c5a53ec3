"""Archiving an intake that lives on object storage: `icelog archive` plans from the metadata store's index and its
Spark tasks read the planned chunks from the bucket (ranged GETs through the intake's own reader, pickled into the
tasks), so the table holds every produced record with nothing read from the broker's disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from icelog.config import load_settings
from icelog.lake.catalog import pyiceberg_catalog_opener
from tests.support.archive import ARCHIVE_ENV, create_topic, produce
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import BUCKET, SeaweedFS


@pytest.mark.slow
@pytest.mark.spark
def test_an_intake_on_s3_is_archived_from_the_bucket(tmp_path: Path) -> None:
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    env = {**ARCHIVE_ENV, **store.env(), "ICELOG_INTAKE__URL": f"s3://{BUCKET}/archived"}
    broker = BrokerProcess(tmp_path / "data", env=env).start()
    try:
        topic = "s3-archived"
        create_topic(broker, topic, partitions=3)
        produced = produce(broker, topic, 30, partitions=3)
        assert not (broker.data_dir / "intake").exists() and store.keys("archived/intake/")
        once = subprocess.run(
            [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(broker.data_dir), "--topic", topic],
            env={**os.environ, **env, "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{broker.registry_port}",
                 "ICELOG_LISTEN": broker.bootstrap},
            capture_output=True, text=True, timeout=300,
        )
        assert once.returncode == 0, once.stderr[-3000:]
        assert f"{topic}: 30 records" in once.stdout, once.stdout
        opener = pyiceberg_catalog_opener(load_settings(data_dir=str(broker.data_dir)))
        assert opener is not None
        catalog = opener()
        assert catalog is not None
        rows = catalog.load_table(f"icelog.{topic}").scan().to_arrow().to_pylist()
        got = sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value"] and r["value"]["__raw__"])
                     for r in rows)
        assert got == sorted((p, o, v) for p, o, _k, v, _h, _t in produced)
    finally:
        broker.stop()
        store.discard()
