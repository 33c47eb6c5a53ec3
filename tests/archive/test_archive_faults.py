"""Exactly once under faults: the job killed at each stage, catalog or warehouse down, snapshots expired."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from icelog.archive import archiver as archiver_module
from icelog.archive.archiver import Archiver
from icelog.archive.reconcile import (
    COMMIT_USER,
    COMMIT_USER_PROPERTY,
    OFFSETS_PROPERTY,
    TOPIC_ID_PROPERTY,
    encode_offsets,
)
from icelog.config import Settings
from icelog.lake import iceberg_java
from icelog.meta.store import MetadataStore
from tests.support.archive import (
    ARCHIVE_ENV,
    as_produced,
    check_offsets_contiguous,
    create_topic,
    partition_counts,
    produce,
    run_archive_cli,
    spark_rows,
    table,
    wait_for,
)
from tests.support.broker import BrokerProcess


@pytest.mark.parametrize("fault", ["after-write", "after-commit"])
def test_crash_at_each_stage_then_a_new_pass_writes_exactly_once(
    fault: str,
    lake_broker: BrokerProcess,
    lake_spark: Any,
    lake_archiver: Archiver,
    lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = f"archive-crash-{fault}"
    create_topic(lake_broker, topic)
    first = produce(lake_broker, topic, 300, tag="a")
    crashed = run_archive_cli(lake_settings, topic, fault)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    topic_id = lake_store.get_topic(topic).topic_id
    # The job died before the metadata store learnt anything.
    assert all(s.archived_offset == 0 for s in lake_store.archive_states(topic_id))
    committed = lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)}").collect()[0].n
    assert committed == (0 if fault == "after-write" else 300)

    second = produce(lake_broker, topic, 200, tag="b")
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error
    rows = spark_rows(lake_spark, topic)
    assert len(rows) == 500
    expected = sorted(first + second, key=lambda r: (r[0], r[1]))
    assert as_produced(rows) == expected
    check_offsets_contiguous(rows, partition_counts(expected))
    states = {s.partition: s.archived_offset for s in lake_store.archive_states(topic_id)}
    assert states == partition_counts(expected)


def test_sigkill_of_a_running_job_then_a_new_pass_writes_exactly_once(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_settings: Settings
) -> None:
    """No hook: kill -9 the whole `icelog archive` process group once its data files appear."""
    topic = "archive-sigkill"
    create_topic(lake_broker, topic)
    produced = produce(lake_broker, topic, 3000)
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_REGISTRY_LISTEN": lake_settings.registry_listen}
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "icelog",
            "archive",
            "--once",
            "--data-dir",
            str(lake_settings.data_dir),
            "--topic",
            topic,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    data_dir = lake_settings.data_dir / "warehouse" / "icelog" / topic / "data"
    try:
        wait_for(lambda: any(data_dir.rglob("*.parquet")) or job.poll() is not None, timeout=240)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error
    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == produced  # whether the kill landed before or after the commit


def test_a_pass_commits_nothing_once_another_archiver_committed_since_it_read_the_table(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver, lake_store: MetadataStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two archivers at once (one lost the store's archiver lock without knowing: its connection was cut) would
    append the same rows twice, Iceberg re-applying the second append on top of the first: the pass looks at the
    table's offsets right before its commit (Archiver.fence) and commits nothing if they moved."""
    topic = "archive-fenced"
    create_topic(lake_broker, topic)
    produced = produce(lake_broker, topic, 300, tag="a")
    lake_archiver.run_pass(force=True, topics=[topic])
    produce(lake_broker, topic, 90, tag="b")
    record = lake_store.get_topic(topic)
    name = lake_archiver.table_name(lake_archiver.topic_config(record))
    ahead = {p: n + 1000 for p, n in partition_counts(produced).items()}  # as far as the other one has got
    real_write = archiver_module.write_data_files

    def write_then_another_archiver_commits(*args: Any, **kwargs: Any) -> Any:
        written = real_write(*args, **kwargs)
        other = iceberg_java.load_table(lake_spark, name)
        summary = {OFFSETS_PROPERTY: encode_offsets(ahead), TOPIC_ID_PROPERTY: str(record.topic_id),
                   COMMIT_USER_PROPERTY: COMMIT_USER}
        iceberg_java.commit_append(other, [], summary)
        return written

    monkeypatch.setattr(archiver_module, "write_data_files", write_then_another_archiver_commits)
    try:
        [fenced] = lake_archiver.run_pass(force=True, topics=[topic])
        assert "ArchiverFencedError" in fenced.error and "another archiver commits there" in fenced.error
        assert lake_archiver.fenced.is_set()  # (the continuous archiver exits on it: service.py)
    finally:
        lake_archiver.fenced.clear()
        monkeypatch.undo()
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)}").collect()[0].n == 300  # none of the 90
    assert {s.partition: s.archived_offset for s in lake_store.archive_states(record.topic_id)} == \
        partition_counts(produced)


@pytest.mark.parametrize("outage", ["catalog-locked", "warehouse-unwritable"])
def test_catalog_or_warehouse_unavailable_then_back(
    outage: str,
    lake_broker: BrokerProcess,
    lake_spark: Any,
    lake_archiver: Archiver,
    lake_settings: Settings,
    lake_store: MetadataStore,
) -> None:
    topic = f"archive-{outage}"
    create_topic(lake_broker, topic)
    produced = produce(lake_broker, topic, 300)
    topic_id = lake_store.get_topic(topic).topic_id
    lake_archiver.ensure_table(lake_archiver.topic_config(lake_store.get_topic(topic)))
    data_dir = lake_settings.data_dir / "warehouse" / "icelog" / topic / "data"
    blocker = sqlite3.connect(lake_settings.data_dir / "catalog.db", isolation_level=None, timeout=30)
    if outage == "catalog-locked":
        # Another writer holds the catalog database: the commit waits (busy timeout), then fails.
        blocker.execute("BEGIN EXCLUSIVE")
    else:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        data_dir.write_text("not a directory: data files cannot be written")
    try:
        [failed] = lake_archiver.run_pass(force=True, topics=[topic])
    finally:
        if outage == "catalog-locked":
            blocker.execute("ROLLBACK")
        else:
            data_dir.unlink()
        blocker.close()
    assert failed.error
    states = lake_store.archive_states(topic_id)
    assert states and all(s.archived_offset == 0 and s.last_error for s in states)
    assert sum(c.record_count for c in lake_store.intake_chunks(topic_id)) == 300  # intake kept
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {table(topic)}").collect()[0].n == 0

    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error
    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == produced
    assert all(s.last_error == "" for s in lake_store.archive_states(topic_id))


def test_offsets_survive_snapshot_expiry_and_foreign_commits(
    lake_broker: BrokerProcess, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "archive-expiry"
    create_topic(lake_broker, topic)
    produced = produce(lake_broker, topic, 300, tag="a")
    lake_archiver.run_pass(force=True, topics=[topic])
    produced += produce(lake_broker, topic, 300, tag="b")
    lake_archiver.run_pass(force=True, topics=[topic])
    name = f"lake.icelog.`{topic}`"

    def expire() -> None:
        lake_spark.sql(
            f"CALL lake.system.expire_snapshots(table => 'icelog.`{topic}`', "
            "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
        ).collect()

    expire()  # only the newest snapshot is left: it carries the full offset map
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {name}.snapshots").collect()[0].n == 1
    produced += produce(lake_broker, topic, 300, tag="c")
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 300

    # A commit by someone else (compaction) carries no offsets; after expiry nothing else is left.
    lake_spark.sql(
        f"CALL lake.system.rewrite_data_files(table => 'icelog.`{topic}`', "
        "options => map('min-input-files', '2'))"
    ).collect()
    expire()
    summary = lake_spark.sql(f"SELECT summary FROM {name}.snapshots").collect()[-1].summary
    assert OFFSETS_PROPERTY not in summary
    produced += produce(lake_broker, topic, 300, tag="d")
    assert lake_archiver.run_pass(force=True, topics=[topic])[0].records == 300
    rows = spark_rows(lake_spark, topic)
    expected = sorted(produced, key=lambda r: (r[0], r[1]))
    assert as_produced(rows) == expected
    check_offsets_contiguous(rows, partition_counts(expected))



# A long-lived reader of the catalog in its own process, as a running archiver or `icelog sql` is: it opens the
# catalog, then prints the table's row count each time it reads a line.
_READER = """
import sys
from icelog.config import Settings
from icelog.lake.spark import create_session
spark = create_session(Settings(data_dir=sys.argv[1]), "catalog-reader")
spark.sql("SHOW NAMESPACES").collect()
print("open", flush=True)
for _ in sys.stdin:
    print(spark.sql(f"SELECT count(*) AS n FROM icelog.`{sys.argv[2]}`").collect()[0].n, flush=True)
"""


def test_a_running_session_sees_what_another_process_commits(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver
) -> None:
    """Processes share the catalog (archiver, `icelog sql`, maintenance): none may keep reading a stale one.

    Iceberg's JdbcCatalog leaves a ResultSet open when it opens a SQLite catalog whose tables exist, which pins
    one pooled connection to that moment: that process then never saw another's commits. Here the test
    process's archiver commits and a second, long-lived process counts the rows.
    """
    topic = "archive-foreign-process"
    create_topic(lake_broker, topic)
    produced = produce(lake_broker, topic, 100, tag="a")
    [first] = lake_archiver.run_pass(force=True, topics=[topic])  # the catalog and the table exist from here on
    assert not first.error and first.records == 100
    env = {**os.environ, **ARCHIVE_ENV}
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(lake_settings.data_dir), topic],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    assert reader.stdin and reader.stdout
    try:
        assert reader.stdout.readline().strip() == "open"
        for tag in ("b", "c"):
            produced += produce(lake_broker, topic, 100, tag=tag)
            [result] = lake_archiver.run_pass(force=True, topics=[topic])
            assert not result.error and result.records == 100
            reader.stdin.write("count\n")
            reader.stdin.flush()
            assert int(reader.stdout.readline()) == len(produced)
    finally:
        reader.kill()
        reader.wait()
