"""Nothing on one disk but the intake: metadata in PostgreSQL and the Iceberg catalog in PostgreSQL (Iceberg's JDBC
catalog, Debian's driver), archived by `icelog archive --once` (its own Spark), read by pyiceberg, DuckDB and Spark
SQL through that catalog, and served back to a Kafka consumer byte for byte after the intake's trim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from icelog.config import load_settings
from icelog.lake.catalog import postgres_catalog_url
from icelog.meta.backends import open_store
from tests.readback.test_readback import TRIM, produce_codecs, read_back, wait_trimmed
from tests.support.archive import ARCHIVE_ENV, duckdb_counts
from tests.support.broker import BrokerProcess
from tests.support.clients_util import comparable, create_topic
from tests.support.postgres import PASSWORD, ROLE, PostgresCluster

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_archive_through_a_postgres_catalog(tmp_path: Path, postgres_cluster: PostgresCluster) -> None:
    meta_url = postgres_cluster.new_database("meta")
    catalog_db = urlsplit(postgres_cluster.new_database("catalog")).path
    env = {
        **ARCHIVE_ENV,
        "ICELOG_META_URL": meta_url,
        "ICELOG_ARCHIVE__CATALOG_URI": f"jdbc:postgresql://127.0.0.1:{postgres_cluster.port}{catalog_db}",
        "ICELOG_ARCHIVE__CATALOG_PROPERTIES": json.dumps({"jdbc.user": ROLE, "jdbc.password": PASSWORD}),
    }
    broker = BrokerProcess(tmp_path / "data", env=env).start()
    try:
        topic = "pg-orders"
        create_topic(broker.bootstrap, topic, partitions=2, configs=TRIM)
        expected = produce_codecs(broker, topic, 20, 2)
        run_env = {**os.environ, **env, "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{broker.registry_port}"}
        done = subprocess.run([sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(broker.data_dir)],
                              env=run_env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not (broker.data_dir / "catalog.db").exists() and not (broker.data_dir / "meta.db").exists()

        # pyiceberg through the same PostgreSQL catalog (what the broker's read-back uses)
        settings = load_settings(data_dir=str(broker.data_dir), **_settings_from(env))
        from pyiceberg.catalog.sql import SqlCatalog

        url = postgres_catalog_url(settings)
        assert url is not None
        table = SqlCatalog(settings.archive.catalog_name, uri=url, warehouse=settings.warehouse).load_table(
            ("icelog", topic))
        rows = table.scan().to_arrow().to_pylist()
        assert sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows) == sorted(
            (r.partition, r.offset) for r in expected)

        # DuckDB reads the same table from the metadata file the catalog points at
        per_partition: dict[int, int] = {}
        for rec in expected:
            per_partition[rec.partition] = per_partition.get(rec.partition, 0) + 1
        assert duckdb_counts(table.metadata_location) == sorted(per_partition.items())

        # Spark SQL through the JDBC catalog on PostgreSQL (`icelog sql`, a JVM of its own)
        sql = subprocess.run(
            [sys.executable, "-m", "icelog", "sql", f"SELECT count(*) AS n FROM icelog.`{topic}`", "--format", "json",
             "--data-dir", str(broker.data_dir)], env=run_env, capture_output=True, text=True, timeout=600)
        assert sql.returncode == 0, sql.stderr[-3000:]
        assert json.loads(sql.stdout.strip().splitlines()[-1])["n"] == len(expected)

        # the broker sees the table through the same catalog, trims the intake, and serves consumers from it
        store = open_store(meta_url)
        try:
            ends: dict[int, int] = {}
            for rec in expected:
                ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
            wait_trimmed(store, topic, ends)
        finally:
            store.close()
        got = read_back("confluent", broker, topic, [0, 1], len(expected))
        assert comparable(got) == comparable(expected)
        assert PASSWORD not in broker.log()
    finally:
        broker.stop()


def _settings_from(env: dict[str, str]) -> dict[str, Any]:
    return {
        "meta_url": env["ICELOG_META_URL"],
        "archive": {"catalog_uri": env["ICELOG_ARCHIVE__CATALOG_URI"],
                    "catalog_properties": json.loads(env["ICELOG_ARCHIVE__CATALOG_PROPERTIES"])},
    }
