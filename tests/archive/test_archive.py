"""The Spark archiver end to end: rows read back (Spark SQL, pyiceberg, DuckDB) equal what was produced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from icelog.archive.archiver import PASS_PARTS, Archiver
from icelog.archive.reconcile import OFFSETS_PROPERTY, decode_offsets
from icelog.config import Settings, load_settings
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from tests.support.archive import (
    ARCHIVE_ENV,
    as_produced,
    committed_aborted_open,
    create_topic,
    duckdb_counts,
    partition_counts,
    produce,
    run_archive_cli,
    spark_rows,
    table,
    wait_for,
)
from tests.support.broker import BrokerProcess

# Every test here runs Spark: in this process, in `icelog archive`/`icelog sql`, or in the broker's archiver.
pytestmark = pytest.mark.spark


def test_pass_archives_exactly_what_was_produced(
    lake_broker: BrokerProcess,
    lake_spark: Any,
    lake_archiver: Archiver,
    lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = "archive-main"
    create_topic(lake_broker, topic)
    started_us = int(time.time() * 1_000_000)
    produced = produce(lake_broker, topic, 1500)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error and result.records == 1500
    # Where the pass's time went (archiver.PASS_PARTS, logged with each pass): the job holds its slowest task's
    # decode and write, the pass every part after the wait.
    timed = result.timings
    assert set(timed) == set(PASS_PARTS) and min(timed.values()) >= 0
    assert timed["decode"] + timed["write"] <= timed["job"]
    assert sum(timed[p] for p in ("plan", "job", "describe", "commit", "record")) <= timed["pass"]

    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == produced
    assert all(r["key_null"] == (r["k"] is None) for r in rows)
    assert any(r["k"] is None for r in rows) and any(r["v"] is None for r in rows)
    for p in range(3):
        part = [r for r in rows if r["p"] == p]
        ingest = [r["ing"] for r in part]
        assert ingest == sorted(ingest), "ingest_timestamp must be monotonic within a partition"
        assert started_us - 1_000_000 <= ingest[0] and ingest[-1] <= int(time.time() * 1_000_000)
        # batch_start: the first offset of the record's batch; batches are contiguous runs.
        starts = {r["bs"] for r in part}
        for r in part:
            assert r["bs"] <= r["o"] and r["bs"] in starts
            assert next(x for x in part if x["o"] == r["bs"])["bs"] == r["bs"]

    # The snapshot summary records the full next-offset map and who committed.
    summary = lake_spark.sql(f"SELECT summary FROM {table(topic)}.snapshots").collect()[-1].summary
    assert decode_offsets(summary[OFFSETS_PROPERTY]) == partition_counts(produced)
    assert summary["commit-user"] == "icelog-archiver"
    states = {s.partition: s.archived_offset for s in lake_store.archive_states(lake_store.get_topic(topic).topic_id)}
    assert states == partition_counts(produced)

    # A second pass finds nothing new and writes nothing.
    [again] = lake_archiver.run_pass(force=True, topics=[topic])
    assert again.records == 0 and again.timings == {}
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)}").collect()[0].n == 1500

    # pyiceberg reads the same table and rows.
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{lake_settings.data_dir / 'catalog.db'}", warehouse=lake_settings.warehouse
    )
    iceberg_table = catalog.load_table(("icelog", topic))
    arrow = iceberg_table.scan().to_arrow()
    assert arrow.num_rows == 1500
    py_rows = sorted(
        (
            r["kafka"]["partition"],
            r["kafka"]["offset"],
            r["key"] and r["key"]["__raw__"],
            r["value"] and r["value"]["__raw__"],
            tuple((h["key"], h["value"]) for h in r["headers"]),
            int(r["kafka"]["event_timestamp"].timestamp() * 1_000_000),
        )
        for r in arrow.to_pylist()
    )
    assert py_rows == produced

    # DuckDB reads it offline from the table's metadata file.
    assert duckdb_counts(iceberg_table.metadata_location) == sorted(partition_counts(produced).items())


def test_exact_batch_start_of_known_batches(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver
) -> None:
    """aiokafka's send_batch makes the batch boundaries known to the test."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    topic = "archive-batches"
    create_topic(lake_broker, topic, partitions=1)

    async def send() -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=lake_broker.bootstrap)
        await producer.start()
        try:
            spans = []
            for size in (1, 5, 17, 3):
                batch = producer.create_batch()
                for i in range(size):
                    batch.append(key=None, value=f"b{size}-{i}".encode(), timestamp=None)
                batch.close()
                meta = await (await producer.send_batch(batch, topic, partition=0))
                spans.append((meta.offset, size))
            return spans
        finally:
            await producer.stop()

    spans = asyncio.run(send())
    lake_archiver.run_pass(force=True, topics=[topic])
    rows = spark_rows(lake_spark, topic)
    expected = [base for base, size in spans for _ in range(size)]
    assert [r["bs"] for r in rows] == expected
    assert [r["o"] for r in rows] == list(range(sum(size for _, size in spans)))


def test_archive_once_then_icelog_sql(lake_settings: Settings, lake_broker: BrokerProcess) -> None:
    """The cron-style CLI pass, then Spark SQL from the command line."""
    topic = "archive-sql"
    create_topic(lake_broker, topic, partitions=1)
    produce(lake_broker, topic, 7, partitions=1)
    once = run_archive_cli(lake_settings, topic)
    assert once.returncode == 0, once.stderr[-3000:]
    assert f"{topic}: 7 records; next offsets {{0: 7}}" in once.stdout
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "icelog",
            "sql",
            "--data-dir",
            str(lake_settings.data_dir),
            "--format",
            "json",
            f"SELECT kafka.partition AS p, count(*) AS n FROM icelog.`{topic}` GROUP BY 1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **ARCHIVE_ENV},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"p": 0, "n": 7}
    ddl = subprocess.run([sys.executable, "-m", "icelog", "sql", "--data-dir", str(lake_settings.data_dir),
                          "CREATE NAMESPACE IF NOT EXISTS sql_cli_check"],
                         capture_output=True, text=True, timeout=180, env={**os.environ, **ARCHIVE_ENV})
    assert ddl.returncode == 0 and ddl.stdout.strip() == "ok", ddl.stdout + ddl.stderr[-2000:]  # not "++\n||"


def test_only_committed_transactional_records_are_archived(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "archive-txn"
    create_topic(lake_broker, topic, partitions=1)

    pending = committed_aborted_open(lake_broker.bootstrap, topic, "tx", ("c1", "a1"))

    lake_archiver.run_pass(force=True, topics=[topic])
    values = [bytes(r["v"]) for r in spark_rows(lake_spark, topic)]
    assert values == [f"c1-{i}".encode() for i in range(5)]

    pending.commit_transaction(30)
    lake_archiver.run_pass(force=True, topics=[topic])
    values = [bytes(r["v"]) for r in spark_rows(lake_spark, topic)]
    assert values == [f"c1-{i}".encode() for i in range(5)] + [b"open-0", b"after-open"]
    hw = lake_store.partitions(lake_store.get_topic(topic).topic_id)[0].high_watermark
    assert [s.archived_offset for s in lake_store.archive_states(lake_store.get_topic(topic).topic_id)] == [hw]


def test_max_bytes_makes_one_file_per_archive(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "archive-max-bytes"
    create_topic(lake_broker, topic, partitions=1, configs={"icelog.archive.max.bytes": "3000"})
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 0})
    for i in range(20):  # one flushed batch (so one intake chunk) each, ~1 KB
        producer.produce(topic, value=bytes([i]) * 1000, partition=0)
        producer.flush(10)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 20
    files = lake_spark.sql(f"SELECT record_count, lower_bounds FROM {table(topic)}.files").collect()
    assert len(files) == result.archives > 1
    assert sum(f.record_count for f in files) == 20
    assert max(f.record_count for f in files) <= 2  # ~1 KB chunks, archives of at most 3000 intake bytes


def test_partitions_archived_by_one_task_keep_one_file_per_archive(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver
) -> None:
    """The archiver packs several partitions' archives into one Spark task (plan.task_groups); each archive
    still becomes one data file of one partition, holding exactly its offsets."""
    topic = "archive-packed-tasks"
    create_topic(lake_broker, topic, partitions=3, configs={"icelog.archive.max.bytes": "3000"})
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 0})
    for i in range(12):  # one ~1 KB batch each: two archives per partition
        producer.produce(topic, value=bytes([i]) * 1000, partition=i % 3)
        producer.flush(10)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 12
    rows = lake_spark.sql(
        f"SELECT kafka.partition AS p, min(kafka.offset) AS lo, max(kafka.offset) AS hi, count(*) AS n, "
        f"input_file_name() AS f FROM {table(topic)} GROUP BY input_file_name(), kafka.partition"
    ).collect()
    assert len(rows) == result.archives == 6  # one partition per file, one file per archive
    assert sorted((r.p, r.lo, r.hi) for r in rows) == [(p, lo, lo + 1) for p in range(3) for lo in (0, 2)]


def test_spark_python_workers_import_pyspark_from_site_packages_not_sparks_zips(lake_spark: Any) -> None:
    """lake/spark_daemon.py: with Spark's zips on the workers' path, every task re-read them (~0.1 s a task)."""

    def where(_rows: Any) -> Any:
        import sys

        import pyspark

        from icelog.lake.spark_daemon import spark_archive

        archives = [e for e in [*sys.path, *sys.path_importer_cache] if spark_archive(e) is not None]
        yield pyspark.__file__, archives

    [(module, archives)] = lake_spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert ".zip" not in module and module.endswith("pyspark/__init__.py")
    assert archives == []


def test_delays_hold_an_archive_until_due(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore
) -> None:
    """complete.delay and idle with a controlled clock: nothing before the delay, everything at it."""
    topic = "archive-delays"
    create_topic(
        lake_broker,
        topic,
        partitions=1,
        configs={
            "icelog.archive.idle.max.ms": "60000",
            "icelog.archive.complete.delay.max.ms": "120000",
        },
    )
    produce(lake_broker, topic, 10, partitions=1)
    ingest_ms = min(c.ingest_timestamp for c in lake_store.intake_chunks(lake_store.get_topic(topic).topic_id))
    now = {"ms": ingest_ms + 59_000}
    delayed = Archiver(lake_settings, lake_spark, lake_store, clock=lambda: now["ms"] / 1000)
    [held] = delayed.run_pass(topics=[topic])
    assert held.records == 0
    last_ms = max(c.ingest_timestamp for c in lake_store.intake_chunks(lake_store.get_topic(topic).topic_id))
    assert held.next_due_ms == last_ms + 60_000  # when idle.max completes it: a continuous archiver wakes then
    now["ms"] = ingest_ms + 61_000  # idle.max passed (no data since)
    [written] = delayed.run_pass(topics=[topic])
    assert written.records == 10 and written.next_due_ms is None  # nothing left open


def test_complete_delay_bounds_an_archive_that_is_not_idle(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore
) -> None:
    topic = "archive-complete-delay"
    create_topic(
        lake_broker,
        topic,
        partitions=1,
        configs={
            "icelog.archive.idle.max.ms": "600000",
            "icelog.archive.complete.delay.max.ms": "30000",
        },
    )
    produce(lake_broker, topic, 10, partitions=1)
    chunks = lake_store.intake_chunks(lake_store.get_topic(topic).topic_id)
    first, last = chunks[0].ingest_timestamp, chunks[-1].ingest_timestamp
    now = {"ms": first + 29_000}
    delayed = Archiver(lake_settings, lake_spark, lake_store, clock=lambda: now["ms"] / 1000)
    [held] = delayed.run_pass(topics=[topic])
    assert held.records == 0 and held.next_due_ms == first + 30_000
    now["ms"] = first + 30_000  # complete.delay.max reached; idle.max (from the last record) is not
    assert now["ms"] < last + 600_000
    assert delayed.run_pass(topics=[topic])[0].records == 10


def test_hadoop_catalog(lake_broker: BrokerProcess, lake_spark: Any, lake_store: MetadataStore, tmp_path: Path) -> None:
    """Another catalog kind, registered on the shared session under its own catalog name."""
    from icelog.lake.catalog import catalog_spark_conf

    topic = "archive-hadoop"
    create_topic(lake_broker, topic, partitions=2)
    produced = produce(lake_broker, topic, 200, partitions=2)
    hadoop = load_settings(data_dir=str(lake_broker.data_dir), listen=lake_broker.bootstrap,
                           registry_listen=f"127.0.0.1:{lake_broker.registry_port}")
    hadoop.archive.catalog_type = "hadoop"
    hadoop.archive.catalog_name = "hlake"
    hadoop.archive.warehouse = (tmp_path / "hadoop-warehouse").as_uri()
    for key, value in catalog_spark_conf(hadoop).items():
        lake_spark.conf.set(key, value)
    [result] = Archiver(hadoop, lake_spark, lake_store).run_pass(force=True, topics=[topic])
    assert not result.error and result.records == 200
    rows = lake_spark.sql(f"SELECT kafka.partition AS p, kafka.offset AS o FROM hlake.icelog.`{topic}`").collect()
    assert sorted((r.p, r.o) for r in rows) == [(r[0], r[1]) for r in produced]
    assert list((tmp_path / "hadoop-warehouse" / "icelog" / topic / "metadata").glob("v*.metadata.json"))


def test_retention_keeps_unarchived_intake(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    archived, plain = "archive-retention", "plain-retention"
    create_topic(lake_broker, archived, partitions=1, configs={"retention.ms": "1"})
    create_topic(lake_broker, plain, partitions=1, configs={"retention.ms": "1", "icelog.archive.kind": "none"})
    produce(lake_broker, archived, 50, partitions=1)
    produce(lake_broker, plain, 50, partitions=1)

    def log_start(name: str) -> int:
        return lake_store.partitions(lake_store.get_topic(name).topic_id)[0].log_start_offset

    wait_for(lambda: log_start(plain) == 50)  # Kafka retention ran for the topic that is not archived
    assert log_start(archived) == 0  # ... and kept every unarchived record of the archived one
    lake_archiver.run_pass(force=True, topics=[archived])
    wait_for(lambda: log_start(archived) == 50)


def test_serve_runs_the_archiver_and_status_shows_it(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        env={
            **ARCHIVE_ENV,
            "ICELOG_ARCHIVE__ENABLED": "true",
            "ICELOG_ARCHIVE__POLL_INTERVAL_MS": "200",
            "ICELOG_ARCHIVE__SPARK_MASTER": "local[1]",
        },
    ).start()
    try:
        topic = "served"
        create_topic(broker, topic)
        produced = produce(broker, topic, 200)
        meta = open_store(f"sqlite:///{broker.data_dir / 'meta.db'}")
        try:
            topic_id = meta.get_topic(topic).topic_id
            wait_for(
                lambda: (
                    {s.partition: s.archived_offset for s in meta.archive_states(topic_id)}
                    == partition_counts(produced)
                ),
                timeout=240,
                what=lambda: broker.log()[-3000:],
            )
        finally:
            meta.close()
        status = subprocess.run(
            [sys.executable, "-m", "icelog", "status", "--data-dir", str(broker.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **ARCHIVE_ENV},
        )
        lines = [line.split() for line in status.stdout.splitlines() if line.startswith(topic)]
        header = status.stdout.splitlines()[0].split()
        assert len(lines) == 3
        for cells in lines:
            row = dict(zip(header, cells, strict=True))
            assert row["LAG-RECORDS"] == "0" and row["LAST-ERROR"] == "-"
            assert int(row["ARCHIVED-THROUGH"]) == int(row["HIGH-WATERMARK"]) - 1
    finally:
        broker.stop()
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "lake",
        uri=f"sqlite:///{broker.data_dir / 'catalog.db'}",
        warehouse=(broker.data_dir / "warehouse").as_uri(),
    )
    assert catalog.load_table(("icelog", topic)).scan().to_arrow().num_rows == 200


def _alter_topic(broker: BrokerProcess, topic: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET, as `kafka-configs --alter` and the AdminClient send it."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_switching_archiving_on_backfills_the_retained_history_exactly_once(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """A topic created with icelog.archive.kind=none, later set to iceberg: its table holds every record from the
    log start offset (its whole history when nothing was deleted; from where Kafka retention had moved the log
    start otherwise), and later passes add only what is new."""
    whole, trimmed = "backfill-whole", "backfill-trimmed"
    create_topic(lake_broker, whole, partitions=2, configs={"icelog.archive.kind": "none"})
    create_topic(lake_broker, trimmed, partitions=1, configs={"icelog.archive.kind": "none", "retention.ms": "1"})
    history = produce(lake_broker, whole, 120, partitions=2)
    produce(lake_broker, trimmed, 40, partitions=1)

    def log_start(name: str) -> int:
        return lake_store.partitions(lake_store.get_topic(name).topic_id)[0].log_start_offset

    wait_for(lambda: log_start(trimmed) == 40)  # plain Kafka retention removed the first 40
    results = lake_archiver.run_pass(force=True, topics=[whole, trimmed])
    assert all(r.records == 0 for r in results), "kind=none: nothing is archived"

    _alter_topic(lake_broker, whole, {"icelog.archive.kind": "iceberg"})
    _alter_topic(lake_broker, trimmed, {"icelog.archive.kind": "iceberg", "retention.ms": "604800000"})
    later = produce(lake_broker, trimmed, 25, partitions=1, tag="later-")
    [first] = lake_archiver.run_pass(force=True, topics=[whole])
    assert not first.error and first.records == 120
    assert as_produced(spark_rows(lake_spark, whole)) == history
    [cut] = lake_archiver.run_pass(force=True, topics=[trimmed])
    assert not cut.error and cut.records == 25
    assert as_produced(spark_rows(lake_spark, trimmed)) == later, "from the log start offset (40) on"

    more = produce(lake_broker, whole, 30, partitions=2, tag="more-")
    [second] = lake_archiver.run_pass(force=True, topics=[whole])
    assert not second.error and second.records == 30
    assert as_produced(spark_rows(lake_spark, whole)) == sorted(history + more)
