"""A live read where the analyst has only the catalog and the broker's address: the metadata store and the Iceberg
catalog in PostgreSQL, the broker's SASL_SSL listener (SCRAM), and an icelog.yaml in a directory of its own that
names nothing else. The table is read through the catalog, the tail over the Kafka protocol (read_committed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from icelog import live
from tests.support.archive import ARCHIVE_ENV
from tests.support.postgres import PASSWORD as PG_PASSWORD
from tests.support.postgres import ROLE, PostgresCluster
from tests.support.security import start_secure_broker

pytestmark = [pytest.mark.slow, pytest.mark.spark]

USER, PASSWORD = "analyst", "s3cret-analyst"


def test_live_read_through_a_postgres_catalog_and_a_sasl_listener(
    tmp_path: Path, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta_url = postgres_cluster.new_database("meta")
    catalog_db = urlsplit(postgres_cluster.new_database("cat")).path
    catalog_uri = f"jdbc:postgresql://127.0.0.1:{postgres_cluster.port}{catalog_db}"
    catalog_properties = {"jdbc.user": ROLE, "jdbc.password": PG_PASSWORD}
    env = {**ARCHIVE_ENV, "ICELOG_META_URL": meta_url, "ICELOG_ARCHIVE__CATALOG_URI": catalog_uri,
           "ICELOG_ARCHIVE__CATALOG_PROPERTIES": json.dumps(catalog_properties),
           "ICELOG_SUPER_USERS": f"User:{USER}"}
    monkeypatch.setenv("ICELOG_META_URL", meta_url)  # `icelog user add` (start_secure_broker) writes there
    secure = start_secure_broker(tmp_path, ("SASL_SSL",), env=env, users={USER: PASSWORD})
    monkeypatch.delenv("ICELOG_META_URL")
    try:
        client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                  "sasl.password": PASSWORD, "ssl.ca.location": str(secure.pki.ca_pem)}
        conf = {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **client}
        admin = AdminClient(conf)
        for topic, configs in (("remote-raw", {}), ("remote-pk", {"cleanup.policy": "compact"})):
            admin.create_topics([NewTopic(topic, 2, config=configs)])[topic].result(30)
        producer = Producer(conf)
        for i in range(200):
            producer.produce("remote-raw", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
            producer.produce("remote-pk", key=f"k{i % 50}".encode(), value=f"a{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        archived = subprocess.run(
            [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(secure.broker.data_dir)],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        assert archived.returncode == 0, archived.stdout[-3000:] + archived.stderr[-3000:]
        for i in range(200, 300):  # the tail; on the compacted topic, keys 0-9 deleted and 10-49 updated
            producer.produce("remote-raw", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
            key = i % 50
            producer.produce("remote-pk", key=f"k{key}".encode(), value=None if key < 10 else f"b{i}".encode(),
                             partition=i % 2)
        assert producer.flush(30) == 0

        analyst = tmp_path / "analyst"
        analyst.mkdir()
        config = analyst / "icelog.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": str(analyst / "nothing-here"),
            "archive": {
                "catalog_uri": catalog_uri, "catalog_properties": catalog_properties,
                "warehouse": (secure.broker.data_dir / "warehouse").resolve().as_uri(),
                "read_via": "kafka", "bootstrap_servers": secure.bootstrap("SASL_SSL"), "client_properties": client,
            },
        }))

        rows = live.scan("remote-raw", config=str(config)).read_all().to_pylist()
        got = sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value"]["__raw__"]) for r in rows)
        assert got == sorted((i % 2, i // 2, f"v{i}".encode()) for i in range(300))

        latest: dict[str, bytes | None] = {}
        for i in range(300):
            key = i % 50
            latest[f"k{key}"] = None if i >= 200 and key < 10 else f"{'a' if i < 200 else 'b'}{i}".encode()
        pk = live.scan("remote-pk", config=str(config)).read_all().to_pylist()
        assert sorted((r["key"]["__raw__"].decode(), r["value"]["__raw__"]) for r in pk) == sorted(
            (k, v) for k, v in latest.items() if v is not None)

        sql = subprocess.run(
            [sys.executable, "-m", "icelog", "--config", str(config), "sql", "--live", "--format", "json",
             "SELECT (SELECT count(*) FROM icelog.`remote-raw`) AS raw, (SELECT count(*) FROM icelog.`remote-pk`) "
             "AS pk"],
            env={k: v for k, v in os.environ.items()
                 if not k.startswith("ICELOG_") or k == "ICELOG_ARCHIVE__SPARK_CONF"},
            capture_output=True, text=True, timeout=600, cwd=analyst)
        assert sql.returncode == 0, sql.stderr[-3000:]
        assert json.loads(sql.stdout.strip().splitlines()[-1]) == {"raw": 300, "pk": 40}
        assert PASSWORD not in sql.stdout + sql.stderr
        assert not (analyst / "nothing-here" / "meta.db").exists()
    finally:
        secure.broker.stop()
