"""Nothing on the broker's disk that matters: the intake and the tables in an S3-compatible bucket (SeaweedFS), the
metadata and the Iceberg catalog in PostgreSQL. A broker killed -9 whose data dir is deleted serves every
acknowledged record from the bucket; `icelog archive --once` writes the tables' data files, deletion vectors and
metadata into the bucket (Spark through S3A, workers through pyiceberg's FileIO), and so does `icelog sink`; a
maintenance round compacts and looks for orphans there; Spark SQL, pyiceberg and DuckDB read the same rows; after
the trim consumers are served from the tables on S3 byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from icelog.config import load_settings
from icelog.lake.catalog import pyiceberg_catalog_opener
from icelog.meta.backends import open_store
from tests.archive.test_pk_tables import latest, send
from tests.readback.test_readback import TRIM, produce_codecs, read_back, wait_trimmed
from tests.support.archive import ARCHIVE_ENV, duckdb_counts
from tests.support.broker import BrokerProcess
from tests.support.clients_util import comparable, create_topic
from tests.support.postgres import PASSWORD, ROLE, PostgresCluster
from tests.support.seaweedfs import BUCKET, SECRET_KEY, SeaweedFS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

WAREHOUSE = f"s3://{BUCKET}/warehouse"


def icelog(broker: BrokerProcess, env: dict[str, str], *args: str, timeout: float = 900) -> str:
    """Run an icelog command beside the broker (its data dir, registry and settings); its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "icelog", *args, "--data-dir", str(broker.data_dir)],
        env={**os.environ, **env, "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{broker.registry_port}",
             "ICELOG_LISTEN": broker.bootstrap},
        capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert SECRET_KEY not in done.stdout + done.stderr, "the store's secret key reached a command's output"
    return done.stdout


def lake_env(postgres_cluster: PostgresCluster, s3: SeaweedFS) -> dict[str, str]:
    """The settings of every process: the metadata and the catalog in PostgreSQL, the intake and tables on S3."""
    catalog_db = urlsplit(postgres_cluster.new_database("catalog")).path
    return {
        **ARCHIVE_ENV,  # (archive.enabled false: whoever should archive sets it)
        **s3.env(),
        "ICELOG_META_URL": postgres_cluster.new_database("meta"),
        "ICELOG_INTAKE__URL": f"s3://{BUCKET}/intake",
        "ICELOG_INTAKE__COMMIT_INTERVAL_MS": "100",
        "ICELOG_ARCHIVE__WAREHOUSE": WAREHOUSE,
        "ICELOG_ARCHIVE__CATALOG_URI": f"jdbc:postgresql://127.0.0.1:{postgres_cluster.port}{catalog_db}",
        "ICELOG_ARCHIVE__CATALOG_PROPERTIES": json.dumps({"jdbc.user": ROLE, "jdbc.password": PASSWORD}),
    }


def test_tables_on_s3_end_to_end(tmp_path: Path, postgres_cluster: PostgresCluster,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    for name, value in store.env().items():  # this process's pyiceberg reads the bucket as an analyst's would
        monkeypatch.setenv(name, value)
    env = lake_env(postgres_cluster, store)
    broker = BrokerProcess(tmp_path / "data", env=env).start()
    try:
        orders, accounts = "s3-orders", "s3-accounts"
        create_topic(broker.bootstrap, orders, partitions=2, configs=TRIM)
        create_topic(broker.bootstrap, accounts, partitions=2,
                     configs={"cleanup.policy": "compact", "icelog.archive.layout": "table"})
        expected = produce_codecs(broker, orders, 20, 2)
        # Upserts and tombstones in one pass: the superseded rows get deletion vectors in the same commit.
        keyed = send(broker, accounts, [(f"k{i}".encode(), f"a{i}".encode()) for i in range(12)], partitions=2)
        keyed += send(broker, accounts, [(b"k1", b"b1"), (b"k2", None), (b"k5", b"b5"), (b"k20", b"b20")],
                      partitions=2)

        # The disk is a cache: killed, emptied, restarted, the broker serves every acknowledged record.
        broker.kill()
        shutil.rmtree(broker.data_dir)
        broker.start()
        assert comparable(read_back("confluent", broker, orders, [0, 1], len(expected))) == comparable(expected)

        out = icelog(broker, env, "archive", "--once")
        assert f"{orders}: {len(expected)} records" in out, out

        settings = load_settings(data_dir=str(broker.data_dir), **_settings_from(env))
        opener = pyiceberg_catalog_opener(settings)
        assert opener is not None
        catalog = opener()
        assert catalog is not None
        orders_table = catalog.load_table(("icelog", orders))
        accounts_table = catalog.load_table(("icelog", accounts))
        for table in (orders_table, accounts_table):
            assert table.metadata_location.startswith(f"{WAREHOUSE}/"), table.metadata_location
        assert not (broker.data_dir / "warehouse").exists(), "nothing of the tables on the broker's disk"
        files = store.keys("warehouse/")
        assert any(k.endswith(".parquet") for k in files) and any(k.endswith(".puffin") for k in files), files

        # pyiceberg (pyarrow's S3), DuckDB (httpfs) and Spark SQL (S3A) read the same rows.
        rows = orders_table.scan().to_arrow().to_pylist()
        assert sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows) == sorted(
            (r.partition, r.offset) for r in expected)
        per_partition: dict[int, int] = {}
        for rec in expected:
            per_partition[rec.partition] = per_partition.get(rec.partition, 0) + 1
        assert duckdb_counts(orders_table.metadata_location, store.env()) == sorted(per_partition.items())
        want = {k: v for k, (v, _p, _o) in latest(keyed).items()}
        got = {bytes(r["__key"]): bytes(r["__value"]) for r in accounts_table.scan().to_arrow().to_pylist()}
        assert got == want, "the primary-key table holds the latest value of each live key"
        sql = icelog(broker, env, "sql", "--format", "json",
                     f"SELECT (SELECT count(*) FROM icelog.`{orders}`) AS orders, "
                     f"(SELECT count(*) FROM icelog.`{accounts}`) AS accounts")
        assert json.loads(sql.strip().splitlines()[-1]) == {"orders": len(expected), "accounts": len(want)}

        # A maintenance round on the bucket: compaction applies the deletion vectors; Iceberg lists the table's
        # objects for orphans, and one no snapshot references stays while younger than maintenance_orphan_age_ms.
        orphan = f"warehouse/icelog/{accounts}/data/orphan-00000.parquet"
        store.client().put_object(Bucket=BUCKET, Key=orphan, Body=b"not referenced by any snapshot")
        out = icelog(broker, env, "maintain", "--topic", accounts)
        assert f"icelog.{accounts}: data files" in out and "orphans removed 0" in out, out
        assert orphan in store.keys("warehouse/")
        accounts_table = catalog.load_table(("icelog", accounts))
        got = {bytes(r["__key"]): bytes(r["__value"]) for r in accounts_table.scan().to_arrow().to_pylist()}
        assert got == want
        status = icelog(broker, env, "status", "--tables")
        [line] = [x for x in status.splitlines() if x.startswith(f"icelog.{accounts} ")]
        header = status.splitlines()[0].split()
        assert int(line.split()[header.index("RECORDS")]) == len(want), status

        # The sink writes its tables into the same bucket (here the broker itself is its source cluster).
        config = tmp_path / "icelog.yaml"
        config.write_text(yaml.safe_dump({"sinks": {"mirror": {"bootstrap_servers": broker.bootstrap,
                                                               "topics": [orders]}}}))
        icelog(broker, env, "--config", str(config), "sink", "--once")
        mirrored = catalog.load_table(("mirror", orders))
        assert mirrored.metadata_location.startswith(f"{WAREHOUSE}/")
        assert sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in mirrored.scan().to_arrow().to_pylist()
                      ) == sorted((r.partition, r.offset) for r in expected)

        # The broker trims what is archived and serves it back from the tables on S3.
        meta = open_store(env["ICELOG_META_URL"])
        try:
            ends: dict[int, int] = {}
            for rec in expected:
                ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
            wait_trimmed(meta, orders, ends)
        finally:
            meta.close()
        assert comparable(read_back("confluent", broker, orders, [0, 1], len(expected))) == comparable(expected)
        assert SECRET_KEY not in broker.log() and PASSWORD not in broker.log()
    finally:
        broker.stop()
        store.discard()


def _settings_from(env: dict[str, str]) -> dict[str, Any]:
    return {
        "meta_url": env["ICELOG_META_URL"],
        "archive": {"catalog_uri": env["ICELOG_ARCHIVE__CATALOG_URI"], "warehouse": env["ICELOG_ARCHIVE__WAREHOUSE"],
                    "catalog_properties": json.loads(env["ICELOG_ARCHIVE__CATALOG_PROPERTIES"])},
    }
