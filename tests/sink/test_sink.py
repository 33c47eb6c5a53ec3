"""`icelog sink`: topics of another Kafka cluster archived into icelog's tables, exactly once.

A second icelog broker with archiving off stands in for the external cluster (it speaks the Kafka protocol; no
other broker can be installed here). Real clients produce to it; `icelog sink --once` runs as a cron job would,
in a process of its own, against a lake (metadata store, catalog, warehouse) in a data dir of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.archive import test_archive_timestamps as timestamps
from tests.archive.test_pk_tables import latest, send
from tests.support.archive import create_topic, produce
from tests.support.broker import BrokerProcess
from tests.support.sink import SINK, Lake, end_offsets, group_offsets, record_rows, sink_status_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("source") / "data",  # archiving off: a plain Kafka
                         env={"ICELOG_RETENTION_CHECK_INTERVAL_MS": "200"}).start()
    yield proc
    proc.stop()


@pytest.fixture
def lake(tmp_path: Path, source: BrokerProcess) -> Lake:
    return Lake(tmp_path, source)


def transactional(source: BrokerProcess, topic: str, tag: str) -> list[bytes]:
    """A committed and an aborted transaction, interleaved with plain records; the values a table must hold."""
    producer = Producer({"bootstrap.servers": source.bootstrap, "transactional.id": f"sink-{topic}-{tag}"})
    aborter = Producer({"bootstrap.servers": source.bootstrap, "transactional.id": f"sink-{topic}-{tag}-a"})
    plain = Producer({"bootstrap.servers": source.bootstrap})
    producer.init_transactions(30)
    aborter.init_transactions(30)
    producer.begin_transaction()
    aborter.begin_transaction()
    kept = []
    for i in range(20):
        producer.produce(topic, value=f"{tag}-c{i}".encode(), partition=i % 2)
        aborter.produce(topic, value=f"{tag}-a{i}".encode(), partition=i % 2)
        plain.produce(topic, value=f"{tag}-p{i}".encode(), partition=i % 2)
        kept += [f"{tag}-c{i}".encode(), f"{tag}-p{i}".encode()]
    assert plain.flush(30) == 0
    aborter.abort_transaction(30)
    producer.commit_transaction(30)
    return kept

def second_pass_records(source: Any, orders: list[Any], users: list[Any], payments: list[bytes]) -> None:
    """More of each topic for a second pass, added to the lists: records of orders, updates and deletes of the
    compacted users, a committed and an aborted transaction of payments."""
    orders += produce(source, "orders", 300, tag="two-")
    changes = [(f"u{i}".encode(), None if i % 3 == 0 else f"v1-{i}".encode()) for i in range(0, 40, 2)]
    users += send(source, "users", changes, partitions=2)
    payments += transactional(source, "payments", "two")


def assert_tables_hold(lake: Lake, orders: list[Any], users: list[Any], payments: list[bytes], label: str = "") -> None:
    """orders row for row, users' latest value per key, payments' committed values only, each once."""
    assert record_rows(lake.rows("orders")) == sorted(orders), label
    got_users = {r["key"]["__raw__"]: r["value"]["__raw__"] for r in lake.rows("users")}
    assert got_users == {k: v for k, (v, _p, _o) in latest(users).items()}, label
    assert sorted(r["value"]["__raw__"] for r in lake.rows("payments")) == sorted(payments), label



def set_retention(source: BrokerProcess, topic: str, retention_ms: str | None) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    op = AlterConfigOpType.SET if retention_ms else AlterConfigOpType.DELETE
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", retention_ms, incremental_operation=op)])
    admin = AdminClient({"bootstrap.servers": source.bootstrap})  # (held: a dropped client fails its futures)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def log_start(source: BrokerProcess, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": source.bootstrap, "group.id": "probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[0])
    finally:
        consumer.close()


def test_a_sink_archives_raw_compacted_and_transactional_topics_exactly_once(lake: Lake, source: BrokerProcess) -> None:
    """Two passes over a raw, a compacted and a transactional topic; and a topic whose retention deletes records
    the sink has not read between the passes: a gap, reported in the log and `icelog status`."""
    lake.topics = [*lake.topics, "gappy"]
    lake.write_config()
    create_topic(source, "orders", 3)
    create_topic(source, "users", 2, {"cleanup.policy": "compact"})
    create_topic(source, "payments", 2)
    create_topic(source, "gappy", 1)
    gappy = [r[3] for r in produce(source, "gappy", 50, partitions=1)]
    orders = produce(source, "orders", 600)
    users = send(source, "users", [(f"u{i}".encode(), f"v0-{i}".encode()) for i in range(40)], partitions=2)
    payments = transactional(source, "payments", "one")

    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert_tables_hold(lake, orders, users, payments)
    # The source's group shows the sink's progress once the tables hold it.
    for topic, partitions in (("orders", 3), ("users", 2), ("payments", 2)):
        assert group_offsets(source, topic, partitions) == end_offsets(source, topic, partitions), topic

    # Retention on the source deletes 30 records of gappy the sink never read (offsets 50..79).
    produce(source, "gappy", 30, partitions=1, tag="lost-")
    set_retention(source, "gappy", "300")
    deadline = time.monotonic() + 30
    while log_start(source, "gappy") < 80:
        assert time.monotonic() < deadline, "the source's retention did not run"
        time.sleep(0.2)
    set_retention(source, "gappy", None)
    gappy += [r[3] for r in produce(source, "gappy", 10, partitions=1, tag="after-")]

    # A second pass takes only what is new: updates and deletes of the compacted topic, more of the others.
    second_pass_records(source, orders, users, payments)
    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert_tables_hold(lake, orders, users, payments)
    assert sorted(r["kafka"]["offset"] for r in lake.rows("gappy")) == [*range(50), *range(80, 90)]
    assert sorted((r["value"] or {}).get("__raw__") or b"" for r in lake.rows("gappy")) == sorted(
        v or b"" for v in gappy)
    assert "gappy-0: offsets 50..79 were deleted by the source's retention before the sink read them" in done.stderr

    status = lake.run("status")
    assert status.returncode == 0, status.stderr[-2000:]
    lines = sink_status_lines(status.stdout)
    assert {(cells[1], cells[2]) for cells in lines} == {("orders", "0"), ("orders", "1"), ("orders", "2"),
                                                          ("users", "0"), ("users", "1"), ("payments", "0"),
                                                          ("payments", "1"), ("gappy", "0")}
    assert all(cells[6] == "0" for cells in lines), status.stdout  # LAG-RECORDS
    assert f"sink {SINK}: GAP gappy-0 offsets 50..79 were deleted by the source's retention" in status.stdout


def test_no_timestamp_a_source_accepted_stops_the_sink(lake: Lake, source: BrokerProcess) -> None:
    """The invariant of tests/archive/test_archive_timestamps.py through `icelog sink`: a source topic whose bounds
    are widened holds boundary and extreme timestamps; every record a table can hold is a row, the others are in
    the dead-letter table, and the source's group moves past all of them."""
    topic = timestamps.topic_of("raw")
    lake.topics = [topic]
    lake.write_config()
    # (retention.ms -1: time retention, as Kafka's, goes by the records' timestamps, and those of 1970 are due)
    create_topic(source, topic, 1, {**timestamps.WIDE, "retention.ms": "-1"})
    sent, unholdable = timestamps.send_all(source, "raw", 0)
    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert timestamps.pyiceberg_rows(lake.table(topic)) == timestamps.expected_rows(sent, unholdable), done.stderr
    assert timestamps.dead_letter_spans(lake.table(f"{topic}__dlq")) == [(o, o) for o in sorted(unholdable)]
    assert group_offsets(source, topic, 1) == end_offsets(source, topic, 1)


def test_a_sink_killed_before_or_after_its_iceberg_commit_loses_and_repeats_nothing(
    lake: Lake, source: BrokerProcess
) -> None:
    """Killed before the commit (files written, nothing committed), then between the Iceberg commit and the group
    commit: each next run resumes from the table, so the table holds each record once, and the group catches up."""
    topic = "crash"
    lake.topics = [topic]
    lake.write_config()
    create_topic(source, topic, 2)
    produced = produce(source, topic, 400, partitions=2)

    crashed = lake.sink_once(fault="after-write")
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr[-3000:]
    assert all(offset < 0 for offset in group_offsets(source, topic, 2).values())  # the group was not told

    produced += produce(source, topic, 200, partitions=2, tag="more-")
    crashed = lake.sink_once(fault="after-commit")
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr[-3000:]
    assert record_rows(lake.rows(topic)) == sorted(produced)  # in the table, once: the earlier files are orphans
    assert all(offset < 0 for offset in group_offsets(source, topic, 2).values())  # and still not in the group

    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert record_rows(lake.rows(topic)) == sorted(produced)
    assert group_offsets(source, topic, 2) == end_offsets(source, topic, 2)


def test_an_unreachable_source_is_one_line(lake: Lake, source: BrokerProcess, tmp_path: Path) -> None:
    from tests.support.broker import free_port

    lake.write_config(bootstrap_servers=f"127.0.0.1:{free_port()}")
    done = lake.sink_once()
    assert done.returncode != 0
    assert "cannot reach the broker at 127.0.0.1:" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
