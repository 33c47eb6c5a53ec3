"""Consumers read the whole history from the Iceberg table (issue 9): the intake is trimmed, the table serves.

A real broker (`lake_broker`), the real Spark archiver writing the JDBC-on-SQLite catalog, then every
client (confluent-kafka, kafka-python, aiokafka, kcat) consuming from offset 0 over TCP once the topic's
intake holds nothing of what they read: offsets, keys, values, headers and timestamps must be those
produced, byte for byte, for every codec.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from icelog.archive.archiver import Archiver
from icelog.meta.store import MetadataStore
from tests.support.archive import ARCHIVE_ENV, wait_for
from tests.support.broker import BrokerProcess
from tests.support.clients_util import (
    CLIENTS,
    CODECS,
    ConfluentClient,
    Rec,
    comparable,
    create_topic,
    now_ms,
    sample_records,
)

pytestmark = pytest.mark.slow

TRIM = {"icelog.intake.retention.ms": "0"}  # archived intake goes at once (once the broker sees the table)


def produce_codecs(broker: BrokerProcess, topic: str, per_codec: int, partitions: int) -> list[Rec]:
    """Records through confluent-kafka with every codec; returned with their offsets."""
    out: list[Rec] = []
    for i, codec in enumerate(CODECS):
        records = sample_records(per_codec, partitions, seed=100 + i)
        offsets = ConfluentClient().produce(broker.bootstrap, topic, records, codec=codec)
        out.extend(replace(r, offset=o) for r, o in zip(records, offsets, strict=True))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def topic_id(store: MetadataStore, topic: str) -> uuid.UUID:
    record = store.get_topic(topic)
    assert record is not None
    return record.topic_id


def wait_trimmed(store: MetadataStore, topic: str, through: dict[int, int]) -> None:
    """Until the broker's retention moved each partition's intake start to at least `through[p]`."""
    tid = topic_id(store, topic)

    def starts() -> dict[int, int]:
        return {p.partition: p.log_start_offset for p in store.partitions(tid)}

    wait_for(lambda: all(starts()[p] >= n for p, n in through.items()), 60, starts)


def archive_and_trim(archiver: Archiver, store: MetadataStore, topic: str, expected: list[Rec]) -> None:
    results = archiver.run_pass(force=True, topics={topic})
    assert [r.error for r in results] == [""], results
    ends: dict[int, int] = {}
    for rec in expected:
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
    wait_trimmed(store, topic, ends)


def read_back(client_name: str, broker: BrokerProcess, topic: str, partitions: list[int], count: int) -> list[Rec]:
    got = CLIENTS[client_name].consume(broker.bootstrap, topic, partitions, "earliest", count)
    return [replace(r, log_append_time=False) for r in got]


def read_to_end(broker: BrokerProcess, topic: str, partitions: list[int]) -> list[Rec]:
    """Every record confluent-kafka reads from offset 0 until it reports the end (EOF) of each partition.

    Unlike a read of a count of records, it sees a record beyond those expected (one that should be gone) without
    waiting out a timeout for one more."""
    from confluent_kafka import KafkaError

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"tests-{uuid.uuid4()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out: list[Rec] = []
    at_end: set[int] = set()
    try:
        while at_end != set(partitions):
            msg = consumer.poll(30)
            assert msg is not None, f"no end of partitions {set(partitions) - at_end} after {len(out)} records"
            if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
                continue
            assert msg.error() is None, msg.error()
            at_end.discard(msg.partition())  # (a record after an EOF: that partition is not at its end yet)
            out.append(Rec(msg.partition(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1],
                           msg.offset()))
    finally:
        consumer.close()
    return out


def test_every_client_reads_a_trimmed_topic_from_the_table(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "rb-clients"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs=TRIM)
    expected = produce_codecs(lake_broker, topic, 30, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    for name in CLIENTS:
        got = read_back(name, lake_broker, topic, [0, 1], len(expected))
        assert comparable(got) == comparable(expected), name

    # `icelog status`: where the table range ends and the intake begins, and what each holds.
    status = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(lake_broker.data_dir)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **ARCHIVE_ENV})
    assert status.returncode == 0, status.stderr
    header = status.stdout.splitlines()[0].split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in status.stdout.splitlines()[1:]
            if line.split()[0] == topic]
    for row in rows:
        end = max(r.offset for r in expected if r.partition == int(row["PARTITION"])) + 1
        assert (row["LOG-START"], row["TABLE-OFFSETS"], row["INTAKE-START"], row["HIGH-WATERMARK"]) == (
            "0", f"0-{end - 1}", str(end), str(end)
        )
        assert int(row["TABLE-BYTES"]) > 0 and row["INTAKE-BYTES"] == "0"


def consume_group(broker: BrokerProcess, topic: str, group: str, count: int, commit_at: int | None = None) -> list[Rec]:
    """A confluent-kafka group member reading `count` records; commits `commit_at` (sync) before closing."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    out: list[Rec] = []
    try:
        while len(out) < count:
            msg = consumer.poll(30)
            assert msg is not None, f"group {group} got {len(out)} of {count} records"
            assert msg.error() is None, msg.error()
            out.append(Rec(msg.partition(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1],
                           msg.offset()))
        if commit_at is not None:
            consumer.commit(offsets=[TopicPartition(topic, 0, commit_at)], asynchronous=False)
    finally:
        consumer.close()
    return out


def test_group_resumes_in_the_table_range_after_a_restart(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "rb-group"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    expected = produce_codecs(lake_broker, topic, 12, 1)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (0, len(expected))

    first = consume_group(lake_broker, topic, "rb-g", 25, commit_at=25)
    assert comparable(first) == comparable(expected[:25])
    lake_broker.restart()
    rest = consume_group(lake_broker, topic, "rb-g", len(expected) - 25)
    assert comparable(rest) == comparable(expected[25:])  # exactly from the committed offset, from the table
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (0, len(expected))


def test_reads_stay_right_after_compaction_expiry_and_deletes(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any
) -> None:
    topic = "rbmaint"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs=TRIM)
    expected = produce_codecs(lake_broker, topic, 10, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    more = produce_codecs(lake_broker, topic, 10, 2)  # a second archive per partition
    expected = sorted(expected + more, key=lambda r: (r.partition, r.offset))
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    name = f"lake.icelog.`{topic}`"
    files = lake_spark.sql(f"SELECT count(*) AS n FROM {name}.files").collect()[0].n
    assert files >= 4  # two archives per partition

    def read_all(count: int, clients: tuple[str, ...] = ("confluent",)) -> None:
        for client in clients:
            got = read_back(client, lake_broker, topic, [0, 1], count)
            assert comparable(got) == comparable(expected), (client, len(got))

    read_all(len(expected))
    lake_spark.sql(f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', "
                   "options => map('min-input-files', '2'))").collect()
    assert lake_spark.sql(f"SELECT count(*) AS n FROM {name}.files").collect()[0].n < files
    read_all(len(expected))
    lake_spark.sql(f"CALL lake.system.expire_snapshots(table => 'icelog.{topic}', "
                   "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)").collect()
    read_all(len(expected))

    # An analyst's erasure: the records are gone for consumers too, their offsets skipped.
    last0 = max(r.offset for r in expected if r.partition == 0)
    erased = {(0, 0), (0, 3), (0, 4), (0, last0), (1, 7)}
    lake_spark.sql(f"DELETE FROM {name} WHERE (kafka.partition = 0 AND kafka.offset IN (0, 3, 4, {last0})) "
                   "OR (kafka.partition = 1 AND kafka.offset = 7)").collect()
    expected = [r for r in expected if (r.partition, r.offset) not in erased]
    # The broker re-plans a table about once a second: the erasure reaches consumers within that. Each read goes
    # to the end of both partitions, so an erased record anywhere (the last of partition 0 too) would show.
    wait_for(lambda: comparable(read_to_end(lake_broker, topic, [0, 1])) == comparable(expected), 30)
    read_all(len(expected), tuple(CLIENTS))

    # A consumer positioned on an erased offset (a committed offset, or "earliest" resolved before the erasure)
    # is served from the next record, never refused: the log start does not follow the table's first row.
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0)[0] == 0
    consumer = Consumer({"bootstrap.servers": lake_broker.bootstrap, "group.id": f"{topic}-at-0",
                         "auto.offset.reset": "error", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    first = None
    for _ in range(30):
        msg = consumer.poll(1)
        if msg is not None:
            assert msg.error() is None, msg.error()
            first = msg.offset()
            break
    consumer.close()
    assert first == 1


def test_list_offsets_by_timestamp_spans_table_and_intake(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "rb-times"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs={"icelog.intake.retention.ms": "0"})
    records = sample_records(40, 1, seed=7)
    offsets = ConfluentClient().produce(lake_broker.bootstrap, topic, records, codec="zstd")
    table_part = [replace(r, offset=o) for r, o in zip(records, offsets, strict=True)]
    archive_and_trim(lake_archiver, lake_store, topic, table_part)
    later = sample_records(10, 1, seed=8, base_ts=max(r.timestamp or 0 for r in table_part) + 100_000)
    offsets = ConfluentClient().produce(lake_broker.bootstrap, topic, later, codec="none")
    produced = table_part + [replace(r, offset=o) for r, o in zip(later, offsets, strict=True)]

    def first_at_or_after(t: int) -> int | None:
        hits = [r.offset for r in produced if (r.timestamp or 0) >= t]
        return min(hits) if hits else None

    stamps = sorted({r.timestamp or 0 for r in produced})
    queries = [stamps[0] - 1, stamps[3], stamps[3] + 1, stamps[len(stamps) // 2], stamps[-12], stamps[-1],
               stamps[-1] + 1]
    wanted = [first_at_or_after(t) for t in queries]
    assert any(w is not None and w < 40 for w in wanted) and any(w is not None and w >= 40 for w in wanted)
    for client in ("confluent", "kafka-python"):
        assert CLIENTS[client].offsets_for_times(lake_broker.bootstrap, topic, 0, queries) == wanted, client


def test_log_append_time_comes_back_as_log_append_time(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """The table stores the record's timestamp; its type comes from the topic's message.timestamp.type."""
    topic = "rb-append-time"
    create_topic(lake_broker.bootstrap, topic, partitions=1,
                 configs={**TRIM, "message.timestamp.type": "LogAppendTime"})
    records = sample_records(20, 1, seed=9)
    ConfluentClient().produce(lake_broker.bootstrap, topic, records, codec="gzip")
    from_intake = {name: CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", 20)
                   for name in ("confluent", "kafka-python")}
    assert all(r.log_append_time for r in from_intake["confluent"])
    archive_and_trim(lake_archiver, lake_store, topic, [replace(r, offset=i) for i, r in enumerate(records)])
    for name, before in from_intake.items():
        after = CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", 20)
        assert after == before, name  # timestamps, their type, offsets and payloads


def test_kafka_retention_moves_the_visible_log_start_and_keeps_table_rows(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any
) -> None:
    """retention.ms drops whole table files from what consumers see (durably), never rows from the table."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    topic = "rb-retention"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    old = sample_records(15, 1, seed=11, base_ts=now_ms() - 3 * 3600_000)  # three hours old
    offsets = ConfluentClient().produce(lake_broker.bootstrap, topic, old, codec="lz4")
    archive_and_trim(lake_archiver, lake_store, topic,
                     [replace(r, offset=o) for r, o in zip(old, offsets, strict=True)])
    new = sample_records(15, 1, seed=12)
    offsets = ConfluentClient().produce(lake_broker.bootstrap, topic, new, codec="lz4")
    recent = [replace(r, offset=o) for r, o in zip(new, offsets, strict=True)]
    archive_and_trim(lake_archiver, lake_store, topic, recent)
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (0, 30)

    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})

    def set_retention(value: str) -> None:
        resource = ConfigResource("topic", topic, set_config={"retention.ms": value})
        admin.alter_configs([resource])[resource].result(30)

    set_retention("3600000")  # one hour: the first archive's file holds only older records
    wait_for(lambda: ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (15, 30), 30)
    assert comparable(read_back("confluent", lake_broker, topic, [0], 15)) == comparable(recent)

    # Unlimited again, and a restart: the log start consumers see never moves back (it is stored) ...
    set_retention("-1")
    lake_broker.restart()
    assert ConfluentClient().watermarks(lake_broker.bootstrap, topic, 0) == (15, 30)
    assert comparable(read_back("kafka-python", lake_broker, topic, [0], 15)) == comparable(recent)
    # ... and the table still holds every row: table rows are removed only explicitly (DELETE FROM).
    assert lake_spark.sql(f"SELECT count(*) AS n FROM lake.icelog.`{topic}`").collect()[0].n == 30


def test_read_committed_consumers_see_nothing_aborted_from_the_table(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    """Aborted records and markers are not rows: from the table, both isolation levels read committed records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    topic = "rb-txn"
    create_topic(lake_broker.bootstrap, topic, partitions=1, configs=TRIM)
    committer, aborter = (Producer({"bootstrap.servers": lake_broker.bootstrap, "transactional.id": f"rb-{name}"})
                          for name in ("commit", "abort"))
    for producer in (committer, aborter):
        producer.init_transactions(30)
        producer.begin_transaction()
    for i in range(6):
        committer.produce(topic, value=f"c{i}".encode(), partition=0)
        aborter.produce(topic, value=f"a{i}".encode(), partition=0)
        committer.flush(30)
        aborter.flush(30)
    committer.commit_transaction(30)
    aborter.abort_transaction(30)
    plain = Producer({"bootstrap.servers": lake_broker.bootstrap})
    plain.produce(topic, value=b"after", partition=0)
    assert plain.flush(30) == 0
    high = lake_store.partitions(topic_id(lake_store, topic))[0].high_watermark
    results = lake_archiver.run_pass(force=True, topics={topic})
    assert [r.error for r in results] == [""], results
    wait_trimmed(lake_store, topic, {0: high})

    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": lake_broker.bootstrap, "group.id": f"rb-txn-{isolation}",
                             "isolation.level": isolation, "enable.partition.eof": True})
        # (From the log start: the table's first offset, which is 0 only if a committed record got offset 0.)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values = []
        try:
            while True:
                msg = consumer.poll(30)
                assert msg is not None, values
                if msg.error():
                    break  # end of partition
                values.append(msg.value())
        finally:
            consumer.close()
        assert values == [f"c{i}".encode() for i in range(6)] + [b"after"], isolation
