"""Table maintenance (issue 11): compaction, snapshot expiry, orphan removal, with archiving going on.

Real broker, confluent-kafka producers, the shared Spark session and Iceberg JDBC catalog of
tests/conftest.py; rows are read back with Spark SQL, pyiceberg and DuckDB.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icelog.archive.archiver import Archiver
from icelog.archive.dead_letter import DLQ_SUFFIX, dlq_table_name, write_dead_letters
from icelog.archive.decode import DeadLetter
from icelog.archive.maintenance import MaintenancePolicy, maintain_table, table_state
from icelog.archive.maintenance_schedule import STALL_POINT, MaintenanceScheduler
from icelog.archive.reconcile import table_offsets
from icelog.config import ArchiveSettings, Settings
from icelog.faults import FAULT_ENV
from icelog.lake.iceberg_java import load_table
from icelog.table.config import TABLE_AUTO_MAINTENANCE
from tests.support.archive import (
    ARCHIVE_ENV,
    as_produced,
    check_offsets_contiguous,
    create_topic,
    duckdb_counts,
    partition_counts,
    produce,
    spark_rows,
    table,
    wait_for,
)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

POLICY = MaintenancePolicy.from_settings(ArchiveSettings())


def spark_name(topic: str) -> str:
    return f"lake.icelog.`{topic}`"


def archive_in_rounds(
    broker: BrokerProcess, archiver: Archiver, topic: str, rounds: int, per_round: int
) -> list[Any]:
    """`rounds` produce + archive passes: every pass adds one small data file per partition."""
    produced: list[Any] = []
    for i in range(rounds):
        produced += produce(broker, topic, per_round, tag=f"r{i}-")
        [result] = archiver.run_pass(force=True, topics=[topic])
        assert not result.error, result.error
    return sorted(produced, key=lambda r: (r[0], r[1]))


def pyiceberg_table(settings: Settings, topic: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    return catalog.load_table(("icelog", topic))


def live_files(spark: Any, topic: str) -> list[str]:
    return [r.file_path for r in spark.sql(f"SELECT file_path FROM {table(topic)}.files WHERE content = 0").collect()]


def local(path: str) -> Path:
    return Path(path.removeprefix("file:").replace("///", "/", 1))


def assert_exact(spark: Any, settings: Settings, topic: str, expected: list[Any]) -> None:
    """The table holds exactly `expected` (Spark SQL), and pyiceberg and DuckDB agree."""
    assert as_produced(spark_rows(spark, topic)) == expected
    iceberg = pyiceberg_table(settings, topic)
    arrow = iceberg.scan().to_arrow()
    got = sorted(zip(arrow["kafka"].combine_chunks().field("partition").to_pylist(),
                     arrow["kafka"].combine_chunks().field("offset").to_pylist(), strict=True))
    assert got == [(r[0], r[1]) for r in expected]
    assert duckdb_counts(iceberg.metadata_location) == sorted(partition_counts(expected).items())


def set_properties(spark: Any, topic: str, **props: str) -> None:
    pairs = ", ".join(f"'{k.replace('_', '.')}'='{v}'" for k, v in props.items())
    spark.sql(f"ALTER TABLE {table(topic)} SET TBLPROPERTIES ({pairs})")


def test_compaction_makes_fewer_sorted_files_and_archiving_goes_on(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "maint-compact"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=6, per_round=300)
    before = table_state(load_table(lake_spark, spark_name(topic)))
    assert before.data_files >= 18  # 6 passes x 3 partitions

    result = maintain_table(lake_spark, spark_name(topic), POLICY)

    assert result.rewritten_files == before.data_files
    assert result.after.data_files < before.data_files
    assert result.after.data_files == len(live_files(lake_spark, topic)) <= 3 * 2  # per partition (and day)
    assert_exact(lake_spark, lake_settings, topic, produced)
    for path in live_files(lake_spark, topic):  # rows of every file in offset order
        offsets = pq.read_table(local(path), columns=["kafka"])["kafka"].combine_chunks().field("offset").to_pylist()
        assert offsets == sorted(offsets) and len(offsets) > 300 // 3
    found = table_offsets(lake_spark, spark_name(topic))
    assert found.source == "ancestor"  # the current snapshot is the rewrite; the map is one step back
    assert found.offsets == partition_counts(produced)

    more = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=2, per_round=150)
    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == sorted(produced + more, key=lambda r: (r[0], r[1]))
    check_offsets_contiguous(rows, partition_counts(produced + more))


def test_a_compacted_file_that_fills_a_group_is_not_rewritten_again(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    """With groups no larger than a compacted file, a later round rewrites only the files added since."""
    topic = "maint-tiers"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=4, per_round=3000)
    maintain_table(lake_spark, spark_name(topic), POLICY)
    sizes = {r.file_path: r.file_size_in_bytes for r in lake_spark.sql(
        f"SELECT file_path, file_size_in_bytes FROM {table(topic)}.files WHERE content = 0").collect()}
    more = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=4, per_round=150)
    before = table_state(load_table(lake_spark, spark_name(topic)))
    small_groups = dataclasses.replace(POLICY, group_bytes=min(sizes.values()))

    result = maintain_table(lake_spark, spark_name(topic), small_groups)

    assert set(sizes) <= set(live_files(lake_spark, topic))  # the compacted files are untouched
    assert 0 < result.rewritten_files <= before.data_files - len(sizes)  # only newer, archive-sized files
    assert result.after.data_files < before.data_files
    expected = sorted(produced + more, key=lambda r: (r[0], r[1]))
    assert_exact(lake_spark, lake_settings, topic, expected)
    for path in live_files(lake_spark, topic):  # every file still in offset order
        offsets = pq.read_table(local(path), columns=["kafka"])["kafka"].combine_chunks().field("offset").to_pylist()
        assert offsets == sorted(offsets)


def test_expiry_keeps_the_offsets_and_orphan_removal_only_takes_old_unreferenced_files(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "maint-expire"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=4, per_round=120)
    # Expire everything the table allows: any age, one snapshot kept (icelog keeps the offsets' one too).
    set_properties(lake_spark, topic, **{"history_expire_max-snapshot-age-ms": "1",
                                         "history_expire_min-snapshots-to-keep": "1"})
    data_dir = local(live_files(lake_spark, topic)[0]).parent
    old_orphan, young_orphan = data_dir / "orphan-old.parquet", data_dir / "orphan-young.parquet"
    for orphan in (old_orphan, young_orphan):
        orphan.write_bytes(b"PAR1 written by a pass that died before its commit")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old_orphan, (two_days_ago, two_days_ago))
    time.sleep(0.01)

    result = maintain_table(lake_spark, spark_name(topic), POLICY)

    # Left: the newest archive snapshot (it records the offsets) and the compaction's commits after it
    # (partial progress: one or more); the three older archive snapshots are gone.
    assert result.rewritten_files == 12 and result.snapshots_expired == result.before.snapshots - 1 == 3
    operations = [
        r.operation
        for r in lake_spark.sql(f"SELECT operation FROM {table(topic)}.snapshots ORDER BY committed_at").collect()
    ]
    assert operations[0] == "append" and set(operations[1:]) == {"replace"}
    assert len(operations) == result.after.snapshots
    assert result.orphans_removed == 1
    assert not old_orphan.exists() and young_orphan.exists()
    assert all(local(p).exists() for p in live_files(lake_spark, topic))
    assert_exact(lake_spark, lake_settings, topic, produced)
    found = table_offsets(lake_spark, spark_name(topic))
    assert found.source in ("snapshot", "ancestor") and found.offsets == partition_counts(produced)

    more = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=2, per_round=90)
    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == sorted(produced + more, key=lambda r: (r[0], r[1]))
    check_offsets_contiguous(rows, partition_counts(produced + more))
    young_orphan.unlink()


def test_maintenance_while_archiving_loses_nothing_and_fails_no_pass(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "maint-concurrent"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=4, per_round=150)
    stop = threading.Event()
    rounds: list[tuple[float, float, Any]] = []
    errors: list[BaseException] = []

    def maintain_meanwhile() -> None:
        lake_spark.sparkContext.setLocalProperty("spark.scheduler.pool", "maintenance")
        while not stop.is_set():
            started = time.time() * 1000
            try:
                result = maintain_table(lake_spark, spark_name(topic), POLICY, remove_orphans=False)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
                return
            rounds.append((started, time.time() * 1000, result))

    thread = threading.Thread(target=maintain_meanwhile)
    thread.start()
    try:
        for i in range(8):  # passes commit while rewrites plan and commit
            batch = produce(lake_broker, topic, 120, tag=f"c{i}-")
            [result] = lake_archiver.run_pass(force=True, topics=[topic])
            assert not result.error and not result.skipped, result
            produced += batch
    finally:
        stop.set()
        thread.join(600)
    assert not errors, errors
    rewrites = [(start, end) for start, end, r in rounds if r.rewritten_files]
    assert rewrites and not any(r.lost_race for _s, _e, r in rounds)
    # Some archive commit landed while a rewrite was between its plan and its commit.
    appends = [
        row.ms for row in lake_spark.sql(
            f"SELECT unix_millis(committed_at) AS ms FROM {table(topic)}.snapshots WHERE operation = 'append'"
        ).collect()
    ]
    assert any(start < ms < end for start, end in rewrites for ms in appends)
    produced.sort(key=lambda r: (r[0], r[1]))
    rows = spark_rows(lake_spark, topic)
    assert as_produced(rows) == produced
    check_offsets_contiguous(rows, partition_counts(produced))
    assert table_offsets(lake_spark, spark_name(topic)).offsets == partition_counts(produced)


def test_compaction_applies_deletion_vectors_of_a_v3_merge_on_read_table(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "maint-dv"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=3, per_round=300)
    set_properties(lake_spark, topic, **{"format-version": "3", "write_delete_mode": "merge-on-read"})
    lake_spark.sql(f"DELETE FROM {table(topic)} WHERE kafka.offset % 3 != 0")  # deletion vectors: 2/3 of rows
    kept = [r for r in produced if r[1] % 3 == 0]
    before = table_state(load_table(lake_spark, spark_name(topic)))
    assert before.delete_files > 0 and before.data_files == 9
    assert_exact(lake_spark, lake_settings, topic, kept)

    result = maintain_table(lake_spark, spark_name(topic), POLICY)

    assert result.rewritten_files == 9 and result.after.delete_files == 0
    assert result.after.records == len(kept)  # the deleted rows are gone from the files, not just masked
    assert_exact(lake_spark, lake_settings, topic, kept)

    more = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=2, per_round=150)
    lake_spark.sql(f"DELETE FROM {table(topic)} WHERE kafka.offset % 5 = 1")
    expected = sorted((r for r in kept + more if r[1] % 5 != 1), key=lambda r: (r[0], r[1]))
    assert_exact(lake_spark, lake_settings, topic, expected)
    maintain_table(lake_spark, spark_name(topic), POLICY)
    assert_exact(lake_spark, lake_settings, topic, expected)
    next_offsets = {p: n for p, n in partition_counts(produced + more).items()}
    assert table_offsets(lake_spark, spark_name(topic)).offsets == next_offsets


def run_icelog(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_REGISTRY_LISTEN": settings.registry_listen}
    return subprocess.run(
        [sys.executable, "-m", "icelog", *args, "--data-dir", str(settings.data_dir)],
        env=env, capture_output=True, text=True, timeout=600,
    )


def test_maintain_cli_dry_run_changes_nothing_and_a_round_reports_counts(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver
) -> None:
    topic = "maint-cli"
    create_topic(lake_broker, topic)
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=4, per_round=150)
    current = load_table(lake_spark, spark_name(topic)).currentSnapshot()
    assert current is not None
    files = len(live_files(lake_spark, topic))

    dry = run_icelog(lake_settings, "maintain", "--topic", topic, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"icelog.{topic}: dry run: would compact {files} small of {files} data files" in dry.stdout
    after_dry = load_table(lake_spark, spark_name(topic)).currentSnapshot()
    assert after_dry is not None and after_dry.snapshotId() == current.snapshotId()
    assert len(live_files(lake_spark, topic)) == files

    done = run_icelog(lake_settings, "maintain", "--topic", topic)
    assert done.returncode == 0, done.stderr
    compacted = len(live_files(lake_spark, topic))
    assert compacted < files
    assert f"icelog.{topic}: data files {files} -> {compacted} ({files} rewritten into {compacted})" in done.stdout
    assert "compacting small files" in done.stderr  # the progress line
    assert_exact(lake_spark, lake_settings, topic, produced)

    status = run_icelog(lake_settings, "status", "--tables")
    assert status.returncode == 0, status.stderr
    [line] = [x for x in status.stdout.splitlines() if x.startswith(f"icelog.{topic} ")]
    cells = line.split()
    assert cells[1:3] == ["on", str(compacted)] and f"ok: data files {files} -> {compacted}" in line

    missing = run_icelog(lake_settings, "maintain", "--topic", "no-such-topic")
    assert missing.returncode == 2 and "no topic no-such-topic" in missing.stderr
    create_topic(lake_broker, "maint-cli-plain", configs={"icelog.archive.kind": "none"})
    plain = run_icelog(lake_settings, "maintain", "--topic", "maint-cli-plain")  # said "(no archived topics)", 0
    assert plain.returncode == 2 and "topic maint-cli-plain is not archived" in plain.stderr, plain.stdout


def test_the_archiver_maintains_due_tables_and_leaves_opted_out_ones_alone(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: Any, lake_archiver: Archiver
) -> None:
    on, off = "maint-auto-on", "maint-auto-off"
    create_topic(lake_broker, on, configs={TABLE_AUTO_MAINTENANCE: "true"})
    create_topic(lake_broker, off, configs={TABLE_AUTO_MAINTENANCE: "false"})
    produced = archive_in_rounds(lake_broker, lake_archiver, on, rounds=3, per_round=90)
    archive_in_rounds(lake_broker, lake_archiver, off, rounds=3, per_round=90)
    # The dead-letter table of `on`, as three archive passes that each met an undecodable batch leave it.
    dlq = dlq_table_name("lake", "icelog", on)
    letters = [DeadLetter(p, 1000 * i + p, 1000 * i + p + 4, bytes([i, p]) * 50, f"bad {i}") for i in (2, 0, 1)
               for p in range(3)]
    for i in range(3):
        write_dead_letters(lake_spark, dlq, letters[3 * i:3 * i + 3])
    settings = lake_settings.model_copy(deep=True)
    settings.archive.maintenance_min_new_files = 5
    # Other tests' tables stay as they are: only topics that ask for it explicitly.
    settings.topic_defaults = {**settings.topic_defaults, TABLE_AUTO_MAINTENANCE: "false"}
    scheduler = MaintenanceScheduler(settings, lake_spark, lake_store)
    try:
        result, dlq_result = scheduler.run_due()
        assert result.rewritten_files == 9 and result.after.data_files <= 6
        # The dead-letter table too: one file per partition, rows as written, sorted by base offset.
        assert dlq_result.rewritten_files == 9 and dlq_result.after.data_files == 3
        stored = lake_spark.sql(f"SELECT `partition`, base_offset, last_offset, batch, error FROM {dlq}").collect()
        assert sorted((r[0], r[1], r[2], bytes(r[3]), r[4]) for r in stored) == sorted(
            (d.partition, d.base_offset, d.last_offset, d.batch, d.error) for d in letters)
        for path in live_files(lake_spark, on + DLQ_SUFFIX):
            bases = pq.read_table(local(path), columns=["base_offset"])["base_offset"].to_pylist()
            assert bases == sorted(bases) and len(bases) == 3
        record = lake_store.maintenance_records()[f"icelog.{on}"]
        assert record.outcome == "ok" and record.data_files_after == result.after.data_files
        assert f"data files 9 -> {result.after.data_files}" in record.summary and record.orphans_checked_ms > 0
        assert f"icelog.{off}" not in lake_store.maintenance_records()
        assert len(live_files(lake_spark, off)) == 9
        assert scheduler.run_due() == []  # within the interval: not due again
    finally:
        scheduler.close()
    assert_exact(lake_spark, lake_settings, on, produced)



def test_an_archive_pass_commits_while_a_maintenance_round_holds_a_spark_slot(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: Any, lake_archiver: Archiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never blocks the stream: the archiver's scheduler starts a round that holds a Spark task slot, as a
    long rewrite task does (the maintenance-stall fault hook), and the archiver's next pass commits while
    that slot is held; then the round compacts the table, rows exact."""
    topic = "maint-never-blocks"
    create_topic(lake_broker, topic, configs={TABLE_AUTO_MAINTENANCE: "true"})
    produced = archive_in_rounds(lake_broker, lake_archiver, topic, rounds=2, per_round=90)
    settings = lake_settings.model_copy(deep=True)
    settings.archive.maintenance_interval_ms = 1000
    settings.archive.maintenance_min_new_files = 1
    settings.topic_defaults = {**settings.topic_defaults, TABLE_AUTO_MAINTENANCE: "false"}  # this topic only
    stall = settings.data_dir / STALL_POINT
    started, ended, release = (Path(f"{stall}.{s}") for s in ("started", "ended", "release"))
    monkeypatch.setenv(FAULT_ENV, STALL_POINT)  # for the round's child process
    scheduler = MaintenanceScheduler(settings, lake_spark, lake_store)
    key = f"icelog.{topic}"
    try:
        scheduler.poll()  # due (6 new data files): the round starts in a child process
        wait_for(started.exists, 300)

        more = produce(lake_broker, topic, 90, tag="during-")
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert not result.error and not result.skipped, result
        assert not ended.exists() and key not in lake_store.maintenance_records()  # the round still holds it
        expected = sorted(produced + more, key=lambda r: (r[0], r[1]))
        assert as_produced(spark_rows(lake_spark, topic)) == expected

        release.touch()
        wait_for(lambda: key in lake_store.maintenance_records(), 300)
        record = lake_store.maintenance_records()[key]
        assert record.outcome == "ok" and "(9 rewritten into" in record.summary, record
        assert_exact(lake_spark, lake_settings, topic, expected)
    finally:
        release.touch()
        scheduler.close()
        for marker in (started, ended, release):
            marker.unlink(missing_ok=True)


def test_a_java_error_py4j_did_not_convert_is_reported_by_its_own_line(lake_spark: Any) -> None:
    """A maintenance round's failure shows the Java exception (e.g. a CommitFailedException), not py4j's
    "An error occurred while calling o438.execute." (what `icelog maintain` printed)."""
    from icelog.errors import first_line
    from icelog.lake.jvm_errors import jvm_errors

    with pytest.raises(Exception) as info, jvm_errors():  # (maintain_table runs under jvm_errors)
        lake_spark._jvm.java.util.ArrayList().get(3)  # IndexOutOfBoundsException: pyspark leaves it a Py4JJavaError
    assert str(info.value.__cause__).startswith("An error occurred while calling")
    assert first_line(info.value).startswith("java.lang.IndexOutOfBoundsException: Index 3 out of bounds")


def test_compaction_of_an_upsert_table_takes_turns_with_a_steady_stream_of_updates(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_archiver: Archiver, lake_store: Any
) -> None:
    """Every upsert pass replaces the DVs of the files it touches, which fails a concurrent compaction: with
    WriterTurns a pass waits (its records stay in the intake) while compaction commits, so the rewrite lands
    under a steady stream of updates and the table stays exactly the latest row per key."""
    from confluent_kafka import Producer

    from icelog.archive.locks import WriterTurns

    topic = "maint-upserts"
    create_topic(lake_broker, topic, 2, {"cleanup.policy": "compact"})
    latest: dict[bytes, bytes] = {}

    def update_every_key(i: int) -> None:
        producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 5})
        for k in range(40):
            key, value = f"k{k}".encode(), f"v{i}-{k}".encode()
            producer.produce(topic, key=key, value=value, partition=k % 2)
            latest[key] = value
        assert producer.flush(30) == 0
        [result] = lake_archiver.run_pass(force=True, topics=[topic])
        assert not result.error, result.error

    for i in range(6):  # 12 small files, every one with a DV
        update_every_key(i)
    stop = threading.Event()
    rounds: list[Any] = []
    errors: list[BaseException] = []
    turns = WriterTurns(lake_store, f"icelog.{topic}")

    def maintain_meanwhile() -> None:
        lake_spark.sparkContext.setLocalProperty("spark.scheduler.pool", "maintenance")
        while not stop.is_set() and len(rounds) < 3:
            try:
                rounds.append(maintain_table(lake_spark, spark_name(topic), POLICY, remove_orphans=False, turns=turns))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=maintain_meanwhile)
    thread.start()
    try:
        i = 6
        while thread.is_alive() and i < 40:  # passes go on while rounds plan and commit
            update_every_key(i)
            i += 1
    finally:
        stop.set()
        thread.join(600)
    assert not errors, errors
    assert rounds and not [r.lost_race for r in rounds if r.lost_race]
    assert any(r.rewritten_files for r in rounds), [r.summary() for r in rounds]
    update_every_key(i)  # and whatever waited in the intake
    rows = lake_spark.sql(f"SELECT key.__raw__ AS k, value.__raw__ AS v FROM {table(topic)}").collect()
    assert {bytes(r.k): bytes(r.v) for r in rows} == latest and len(rows) == len(latest)
