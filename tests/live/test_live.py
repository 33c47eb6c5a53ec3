"""Live reads (icelog/live/): a topic's table at its snapshot plus the committed records after it, read with
`icelog.live.scan` (Arrow, DuckDB over it), `icelog.live.dataframe` (Spark) and `icelog sql --live`.

The lake broker archives nothing by itself (tests/support/archive.py: ARCHIVE_ENV): a test archives once with the
lake's archiver, produces a tail, and reads both; then archives the tail and checks that the live rows were the rows
the pass wrote, value for value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from icelog import live
from icelog.archive.archiver import Archiver
from icelog.archive.reconcile import OFFSETS_PROPERTY
from icelog.config import Settings
from icelog.live.cut import load_table
from tests.support.archive import ARCHIVE_ENV, Row, committed_aborted_open, create_topic, produce, table
from tests.support.broker import BrokerProcess


def as_rows(arrow: pa.Table) -> list[Row]:
    """(partition, offset, key, value, headers, event µs) of each record-layout row, in partition and offset order."""
    out = []
    for r in arrow.to_pylist():
        key = None if r["key"] is None else r["key"]["__raw__"]
        value = None if r["value"] is None else r["value"]["__raw__"]
        headers = tuple((h["key"], h["value"]) for h in r["headers"] or ())
        event = r["kafka"]["event_timestamp"]
        micros = (event - event.replace(year=1970, month=1, day=1, hour=0, minute=0, second=0, microsecond=0))
        out.append((r["kafka"]["partition"], r["kafka"]["offset"], key, value, headers,
                    micros.days * 86_400_000_000 + micros.seconds * 1_000_000 + micros.microseconds))
    return sorted(out, key=lambda row: (row[0], row[1]))


def by_offset(arrow: pa.Table) -> list[dict[str, Any]]:
    return sorted(arrow.to_pylist(), key=lambda r: (r["kafka"]["partition"], r["kafka"]["offset"]))


def icelog_sql(settings: Settings, query: str, *extra: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "icelog", "sql", "--data-dir", str(settings.data_dir), "--format", "json", *extra,
         query],
        capture_output=True, text=True, timeout=300, env={**os.environ, **ARCHIVE_ENV},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_live_scan_reads_the_table_and_its_tail_each_record_once(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver
) -> None:
    topic = "live-record"
    create_topic(lake_broker, topic, partitions=3)
    archived = produce(lake_broker, topic, 300, tag="a")
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 300
    tail = produce(lake_broker, topic, 120, tag="b")  # archiving paused: the tail

    reader = live.scan(topic, data_dir=str(lake_settings.data_dir))
    rows = reader.read_all()
    assert rows.num_rows == 420
    assert as_rows(rows) == sorted(archived + tail, key=lambda r: (r[0], r[1]))

    # DuckDB over the reader: the same records, counted per partition
    counts = duckdb.sql(
        "SELECT kafka.partition AS p, count(*) AS n, count(DISTINCT kafka.offset) AS d FROM scanned GROUP BY 1 "
        "ORDER BY 1", connection=_duckdb_with(live.scan(topic, data_dir=str(lake_settings.data_dir)))).fetchall()
    assert counts == [(p, 140, 140) for p in range(3)]

    # The tail's rows are the rows the archiver writes for it, every column (ingest time and batch start included).
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 120
    after = live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all()
    assert by_offset(after) == by_offset(rows)


def _duckdb_with(reader: pa.RecordBatchReader) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("scanned", reader)
    return con


def test_live_read_is_read_committed(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver
) -> None:
    """An aborted transaction's records and the markers are skipped; nothing at or past an open transaction."""
    topic = "live-txn"
    create_topic(lake_broker, topic, partitions=1)
    produce(lake_broker, topic, 10, partitions=1, tag="t")
    lake_archiver.run_pass(force=True, topics=[topic])

    pending = committed_aborted_open(lake_broker.bootstrap, topic, topic)

    def values() -> list[bytes]:
        rows = by_offset(live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all())
        return [r["value"]["__raw__"] for r in rows[10:]]

    assert values() == [f"c-{i}".encode() for i in range(5)]
    pending.commit_transaction(30)
    assert values() == [f"c-{i}".encode() for i in range(5)] + [b"open-0", b"after-open"]


@pytest.mark.parametrize("layout", ["record", "table"])
def test_primary_key_topic_tail_upserts_and_tombstones_apply_over_the_table(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver, layout: str
) -> None:
    topic = f"live-pk-{layout}"
    create_topic(lake_broker, topic, partitions=2,
                 configs={"cleanup.policy": "compact", "icelog.archive.layout": layout})
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "linger.ms": 5})
    for i in range(40):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v1-{i}".encode(), partition=i % 2)
    producer.flush(30)
    lake_archiver.run_pass(force=True, topics=[topic])
    for i in range(0, 40, 4):  # the tail: every 4th key updated twice, every 4th+1 deleted, 5 new keys
        producer.produce(topic, key=f"k{i}".encode(), value=f"v2-{i}".encode(), partition=i % 2)
        producer.produce(topic, key=f"k{i}".encode(), value=f"v3-{i}".encode(), partition=i % 2)
        producer.produce(topic, key=f"k{i + 1}".encode(), value=None, partition=(i + 1) % 2)
    for i in range(40, 45):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v1-{i}".encode(), partition=i % 2)
    producer.flush(30)

    expected = {f"k{i}": f"v1-{i}" for i in range(45)}
    for i in range(0, 40, 4):
        expected[f"k{i}"] = f"v3-{i}"
        del expected[f"k{i + 1}"]

    def live_rows() -> dict[str, str]:
        rows = live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all().to_pylist()
        if layout == "table":
            pairs = [(r["__key"].decode(), r["__value"].decode()) for r in rows]
        else:
            pairs = [(r["key"]["__raw__"].decode(), r["value"]["__raw__"].decode()) for r in rows]
        assert len(pairs) == len(dict(pairs)), "one row per live key"
        return dict(pairs)

    assert live_rows() == expected
    lake_archiver.run_pass(force=True, topics=[topic])  # the pass's table holds what the live read showed
    assert live_rows() == expected


def test_icelog_sql_live_and_the_spark_dataframe(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver, lake_spark: Any
) -> None:
    topic = "live-sql"
    create_topic(lake_broker, topic, partitions=2)
    produce(lake_broker, topic, 50, partitions=2, tag="a")
    lake_archiver.run_pass(force=True, topics=[topic])
    produce(lake_broker, topic, 30, partitions=2, tag="b")
    query = f"SELECT count(*) AS n, count(DISTINCT kafka.partition, kafka.offset) AS d FROM {table(topic)}"
    assert icelog_sql(lake_settings, query) == [{"n": 50, "d": 50}]
    assert icelog_sql(lake_settings, query, "--live") == [{"n": 80, "d": 80}]

    frame = live.dataframe(lake_spark, topic, data_dir=str(lake_settings.data_dir))
    rows = frame.select("kafka.partition", "kafka.offset", "value.__raw__").collect()
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        [(p, o) for p in range(2) for o in range(40)])
    scanned = by_offset(live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all())
    assert sorted((r[0], r[1], bytes(r[2]) if r[2] is not None else None) for r in rows) == [
        (r["kafka"]["partition"], r["kafka"]["offset"], r["value"] and r["value"]["__raw__"]) for r in scanned]


def test_a_pass_committing_while_a_live_read_runs_changes_nothing_it_returns(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver, lake_spark: Any
) -> None:
    """The snapshot is pinned and the tail planned before any row is read: a pass that commits between planning and
    reading, or between two batches of the read, neither drops nor repeats a record; records produced after planning
    wait for the next read."""
    from icelog.live.frames import cut_dataframe

    topic = "live-race"
    create_topic(lake_broker, topic, partitions=2)
    first = produce(lake_broker, topic, 200, partitions=2, tag="a")
    lake_archiver.run_pass(force=True, topics=[topic])
    second = produce(lake_broker, topic, 100, partitions=2, tag="b")
    expected = sorted(first + second, key=lambda r: (r[0], r[1]))

    cut = live.plan_cut(lake_settings, topic)
    frame = cut_dataframe(lake_spark, lake_settings, live.plan_cut(lake_settings, topic))
    reader = live.read_cut(lake_settings, cut)
    head = reader.read_next_batch()  # a batch of the snapshot's rows is out
    produce(lake_broker, topic, 50, partitions=2, tag="c")  # after planning: not in this read
    [result] = lake_archiver.run_pass(force=True, topics=[topic])  # commits the tail while the read runs
    assert result.records == 150
    rows = pa.Table.from_batches([head, *reader])
    assert as_rows(rows) == expected
    assert sorted((r[0], r[1]) for r in frame.select("kafka.partition", "kafka.offset").collect()) == [
        (r[0], r[1]) for r in expected]
    assert live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all().num_rows == 350


def test_live_reads_while_the_archiver_commits_in_a_loop(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver
) -> None:
    """Passes committing every few hundred milliseconds while records arrive and live reads run: every read holds
    each offset of each partition once, from 0 up to where it was planned."""
    import threading
    import time

    topic = "live-race-loop"
    create_topic(lake_broker, topic, partitions=2)
    produce(lake_broker, topic, 100, partitions=2, tag="0")
    stop = threading.Event()
    passes: list[int] = []

    def archive() -> None:
        while not stop.is_set():
            [result] = lake_archiver.run_pass(force=True, topics=[topic])
            passes.append(result.records)
            time.sleep(0.1)

    thread = threading.Thread(target=archive)
    thread.start()
    produced, reads = 100, 0
    deadline = time.monotonic() + 240
    try:
        while sum(1 for n in passes if n) < 4 and time.monotonic() < deadline:  # reads overlap passes' commits
            produce(lake_broker, topic, 20, partitions=2, tag=str(reads))
            produced += 20
            kafka = live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all().column("kafka").to_pylist()
            by_partition: dict[int, list[int]] = {}
            for k in kafka:
                by_partition.setdefault(k["partition"], []).append(k["offset"])
            assert {p: sorted(o) for p, o in by_partition.items()} == {
                p: list(range(len(o))) for p, o in by_partition.items()}
            assert sum(len(o) for o in by_partition.values()) == produced
            reads += 1
    finally:
        stop.set()
        thread.join(120)
    assert sum(1 for n in passes if n) >= 4 and reads >= 4, passes


def test_offsets_when_compaction_and_expiry_left_no_snapshot_that_records_them(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver, lake_spark: Any
) -> None:
    """After a compaction (its snapshot records no offsets) the offsets come from the newest ancestor that does; once
    expiry removed every such ancestor, from the data (max offset + 1): each record once either way."""
    topic = "live-compacted"
    create_topic(lake_broker, topic, partitions=2)
    first = produce(lake_broker, topic, 60, partitions=2, tag="a")
    lake_archiver.run_pass(force=True, topics=[topic])
    second = produce(lake_broker, topic, 60, partitions=2, tag="b")
    lake_archiver.run_pass(force=True, topics=[topic])
    tail = produce(lake_broker, topic, 30, partitions=2, tag="c")
    expected = sorted(first + second + tail, key=lambda r: (r[0], r[1]))

    def rows() -> list[Row]:
        return as_rows(live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all())

    lake_spark.sql(f"CALL lake.system.rewrite_data_files(table => 'icelog.`{topic}`', "
                   "options => map('min-input-files', '2'))").collect()
    table = load_table(lake_settings, "icelog", topic)
    assert table is not None and table.current_snapshot().summary.get(OFFSETS_PROPERTY) is None  # a compaction's
    cut = live.plan_cut(lake_settings, topic)
    assert cut.table_offsets == {0: 60, 1: 60} and cut.tail_records == 30  # from the ancestor
    assert rows() == expected
    lake_spark.sql(f"CALL lake.system.expire_snapshots(table => 'icelog.`{topic}`', "
                   "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)").collect()
    table = load_table(lake_settings, "icelog", topic)
    assert table is not None and len(table.snapshots()) == 1  # no snapshot records the offsets any more
    assert live.plan_cut(lake_settings, topic).table_offsets == {0: 60, 1: 60}  # from the data
    assert rows() == expected
