"""Archivers on one PostgreSQL store and one bucket (issue 46: one archiver per table across the cluster, taken over
when its holder dies): the store's archiver lock lets one archive while the others stand by with no JVM; the holder
dies right after an Iceberg commit the store never heard of, the next dies of a kill -9 while records stream in, and
the table still holds every produced record exactly once.

First with dedicated archivers (`icelog archive --standby`) beside one broker that archives nothing, which lets the
test kill each holder at the moment it chooses; then as users run it, two brokers of one cluster (tests/support/
cluster.py) each with its archiver child, the holder's broker killed -9 under an idempotent producer's load. The
intake and the tables on SeaweedFS, the metadata and the catalog on PostgreSQL; one Spark start per archiver that
holds the lock, none in the test's own process (the rows are read with pyiceberg)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from icelog.config import load_settings
from icelog.lake.catalog import pyiceberg_catalog_opener
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from tests.support.archive import ArchiveChild, Row, produce
from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.cluster import BrokerCluster, ProducerStream
from tests.support.postgres import PostgresCluster
from tests.support.seaweedfs import BUCKET, SeaweedFS
from tests.system.test_tables_on_s3 import _settings_from, lake_env

pytestmark = [pytest.mark.slow, pytest.mark.spark]  # Spark only in the archivers' processes: marked by hand

TOPIC = "failover"
PARTITIONS = 3


def archived(meta: MetadataStore) -> dict[int, int]:
    [topic] = [t for t in meta.list_topics() if t.name == TOPIC]
    return {s.partition: s.archived_offset for s in meta.archive_states(topic.topic_id)}


def ends(rows: list[Row]) -> dict[int, int]:
    out = {p: 0 for p in range(PARTITIONS)}
    for r in rows:
        out[r[0]] = max(out[r[0]], r[1] + 1)
    return out


def table_rows(env: dict[str, str], data_dir: Path, topic: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the topic's table, read with pyiceberg."""
    opener = pyiceberg_catalog_opener(load_settings(data_dir=str(data_dir), **_settings_from(env)))
    assert opener is not None
    catalog = opener()
    assert catalog is not None
    rows = catalog.load_table(("icelog", topic)).scan(selected_fields=("kafka",)).to_arrow().to_pylist()
    return sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows)


def test_the_archiver_moves_when_its_holder_dies_and_every_row_lands_once(
    tmp_path: Path, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = SeaweedFS(tmp_path / "seaweedfs").start()
    for name, value in s3.env().items():  # this process's pyiceberg reads the bucket
        monkeypatch.setenv(name, value)
    env = lake_env(postgres_cluster, s3)
    broker = BrokerProcess(tmp_path / "broker", env=env).start()
    children: list[ArchiveChild] = []

    def archiver(name: str, fault: str | None = None) -> ArchiveChild:
        (tmp_path / name).mkdir()  # each archiver's own data dir, as on a machine of its own
        own = {"ICELOG_ARCHIVE__ENABLED": "true", "ICELOG_LISTEN": broker.bootstrap,
               "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{broker.registry_port}"}  # (the broker's registry, if asked)
        children.append(ArchiveChild(tmp_path / f"{name}.log", {**env, **own}, "--standby", "--data-dir",
                                     str(tmp_path / name), fault=fault))
        return children[-1]

    meta = open_store(env["ICELOG_META_URL"])
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
        produced = produce(broker, TOPIC, 300, PARTITIONS, tag="a")

        # The first archiver takes the lock and starts Spark; the two others stand by, without one.
        first = archiver("first", fault="after-commit")
        first.wait_for("starting Spark", timeout=120)
        standbys = [archiver("second"), archiver("third")]
        for standby in standbys:
            standby.wait_for("standing by: another process holds the archiver.lock", timeout=120)
        # Its first pass commits the 300 records to the table, then it dies (exit 137: a kill -9's state) before the
        # store records them: the table is ahead of the store.
        assert first.exits_within(300) == 137, first.log()[-5000:]
        assert "killing the process at after-commit" in first.log()
        assert all(offset <= 0 for offset in archived(meta).values()), "the store heard of the dead holder's commit"
        settings = load_settings(data_dir=str(tmp_path / "first"), **_settings_from(env))
        opener = pyiceberg_catalog_opener(settings)
        assert opener is not None
        catalog = opener()
        assert catalog is not None
        assert len(catalog.load_table(("icelog", TOPIC)).scan(selected_fields=("kafka",)).to_arrow()) == 300

        # One standby takes over within a couple of seconds; it must plan from the table, not from the store.
        deadline = time.monotonic() + 30
        while not (taken := [s for s in standbys if "took the archiver.lock" in s.log()]):
            assert time.monotonic() < deadline, "\n".join(s.log()[-3000:] for s in standbys)
            time.sleep(0.1)
        [second] = taken
        [third] = [s for s in standbys if s is not second]
        assert "took the archiver.lock after standing by" in second.log()
        assert third.proc.poll() is None and "took the archiver.lock" not in third.log()

        # Records stream in while the new holder archives; once it has archived some, it is killed -9 with its JVM (a
        # broker's machine dying) in the middle of a pass: as soon as a data file of its next pass is in the bucket.
        streaming = threading.Event()
        streamed: list[Row] = []

        def stream() -> None:
            batch = 0
            while not streaming.is_set():
                streamed.extend(produce(broker, TOPIC, 30, PARTITIONS, tag=f"s{batch}-"))
                batch += 1
                time.sleep(0.1)

        bucket = s3.client()

        def data_files() -> set[str]:
            listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix=f"warehouse/icelog/{TOPIC}/data/")
            return {str(entry["Key"]) for entry in listed.get("Contents", []) if entry["Key"].endswith(".parquet")}

        producer = threading.Thread(target=stream, name="stream")
        producer.start()
        try:
            second.wait_for(f"archived {TOPIC}:", timeout=180)
            before, deadline = data_files(), time.monotonic() + 60
            while not data_files() - before:
                assert time.monotonic() < deadline, second.log()[-5000:]
                time.sleep(0.02)
            second.kill_all()
            killed_at = time.monotonic()
            third.wait_for("took the archiver.lock after standing by", timeout=30)
            assert time.monotonic() - killed_at < 10, "the last standby took over within a couple of seconds"
            time.sleep(2.0)  # and records keep coming while it starts its Spark
        finally:
            streaming.set()
            producer.join(60)
        # (Files of the killed pass that no snapshot references: it died before its commit, as meant. Not asserted: a
        # commit a few ms after its first file is possible, and as safe.)
        referenced = {urlsplit(f.file.file_path).path.lstrip("/").removeprefix(f"{BUCKET}/")
                      for f in catalog.load_table(("icelog", TOPIC)).scan().plan_files()}
        print(f"the killed pass left {len(data_files() - referenced)} unreferenced data file(s)")
        produced += streamed
        assert len(streamed) > 0

        want = ends(produced)
        deadline = time.monotonic() + 240
        while archived(meta) != want:
            assert third.proc.poll() is None, third.log()[-5000:]
            assert time.monotonic() < deadline, f"archived {archived(meta)}, produced {want}\n{third.log()[-5000:]}"
            time.sleep(0.5)

        # Every produced record once: no row twice (the first holder's commit, the killed one's last pass), none
        # missing.
        rows = catalog.load_table(("icelog", TOPIC)).scan(selected_fields=("kafka",)).to_arrow().to_pylist()
        got = sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows)
        assert len(got) == len(set(got)), "a row written twice"
        assert got == sorted((r[0], r[1]) for r in produced)
        assert {p: sum(1 for g in got if g[0] == p) for p in range(PARTITIONS)} == want  # offsets 0..n-1 each

        third.proc.terminate()
        assert third.exits_within(60) == 0
    finally:
        for child in children:
            child.kill_all()
        meta.close()
        broker.stop()
        s3.discard()


def test_the_archivers_broker_dies_and_another_brokers_archiver_takes_over(
    tmp_path: Path, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two brokers of one cluster, each with its archiver child: one archives, the other's stands by. The holder's
    broker is killed -9 under an idempotent producer's load; its orphaned archiver ends its pass and stops, the
    other broker's takes over, and the table holds each partition's offsets 0..n-1 once, every acknowledged one."""
    s3 = SeaweedFS(tmp_path / "seaweedfs").start()
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    env = lake_env(postgres_cluster, s3)
    cluster = BrokerCluster(tmp_path, s3, env["ICELOG_META_URL"], size=2, prefix="intake",
                            env={**env, "ICELOG_ARCHIVE__ENABLED": "true"})
    meta = open_store(env["ICELOG_META_URL"])
    try:
        cluster.start()
        standing = "standing by: another process holds the archiver.lock"
        deadline = time.monotonic() + 60
        while not [b for b in cluster.brokers if standing in b.log()]:
            assert time.monotonic() < deadline, "\n".join(b.log()[-3000:] for b in cluster.brokers)
            time.sleep(0.2)
        [holder] = [b for b in cluster.brokers if standing not in b.log()]
        [other] = [b for b in cluster.brokers if b is not holder]
        create_topic(cluster.bootstrap, TOPIC, partitions=PARTITIONS)
        cluster.wait_settled((TOPIC,))

        with ProducerStream(cluster.bootstrap, TOPIC, PARTITIONS, rate=300) as stream:  # a pace the archivers keep
            deadline = time.monotonic() + 180
            while f"archived {TOPIC}:" not in holder.log():
                assert time.monotonic() < deadline, holder.log()[-5000:]
                time.sleep(0.2)
            holder.kill()  # the broker only: its archiver child finds its parent gone after the pass in flight
            deadline = time.monotonic() + 120
            while "took the archiver.lock after standing by" not in other.log():
                assert time.monotonic() < deadline, holder.log()[-3000:] + other.log()[-3000:]
                time.sleep(0.2)
            assert "the broker that started the archiver is gone; stopping" in holder.log()
            acked_at_takeover = len(stream.acked)
            deadline = time.monotonic() + 60
            while len(stream.acked) < acked_at_takeover + 600:  # the survivor takes the records
                assert time.monotonic() < deadline, "acks did not resume on the surviving broker"
                time.sleep(0.2)
        assert not stream.failed, list(stream.failed.items())[:3]

        [topic] = [t for t in meta.list_topics() if t.name == TOPIC]
        ends = {p.partition: p.high_watermark for p in meta.partitions(topic.topic_id)}
        deadline = time.monotonic() + 240
        while {s.partition: s.archived_offset for s in meta.archive_states(topic.topic_id)} != ends:
            assert time.monotonic() < deadline, other.log()[-5000:]
            time.sleep(0.5)
        got = table_rows(env, tmp_path, TOPIC)
        assert len(got) == len(set(got)), "a row written twice"
        assert got == sorted((p, o) for p, n in ends.items() for o in range(n))
        assert set(stream.acked.values()) <= set(got)
    finally:
        cluster.stop()
        meta.close()
        s3.discard()
