"""No poison pill, no stalled neighbour: undecodable batches go to `<table>__dlq`; a failing topic backs off alone.

Real broker processes, confluent-kafka producers, the session's Spark and Iceberg catalog
(tests/conftest.py, tests/support/archive.py).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import crc32c
import pytest
from confluent_kafka.admin import AdminClient
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.faults import FAULT_ENV
from icelog.log import intake_file
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from tests.support.archive import ARCHIVE_ENV, as_produced, create_topic, produce, spark_rows, table
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

NO_DELAY = {"icelog.archive.complete.delay.max.ms": "0", "icelog.archive.idle.max.ms": "0"}


def corrupt_batch(base_offset: int, count: int = 3, poison: str = "records") -> bytes:
    """A v2 batch with a valid header. "records": its CRC checks, but its first record's key length runs past the
    batch. "bit-flip": its records are well formed, but a bit of a value changed after the CRC was computed (a
    disk's corruption)."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(count):
        builder.append(i, timestamp=int(time.time() * 1000), key=b"k%d" % i, value=b"poison", headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if poison == "bit-flip":
        data[data.index(b"poison")] ^= 0x20  # "Poison": the CRC the builder wrote no longer matches
        return bytes(data)
    assert data[65] == 4  # the first record's key length (zigzag varint of 2)
    data[65] = 0x7E  # 63 bytes: more than the batch holds
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))  # the batch CRC still checks
    return bytes(data)


def inject(
    data_dir: Path, store_url: str, topic: str, partition: int = 0, poison: str = "records"
) -> tuple[int, bytes]:
    """Append a frame holding a corrupt batch at the partition's end (broker stopped; recovery indexes it)."""
    store = open_store(store_url)
    try:
        record = store.get_topic(topic)
        assert record is not None
        base = store.partitions(record.topic_id)[partition].high_watermark
    finally:
        store.close()
    batch = corrupt_batch(base, poison=poison)
    directory = data_dir / "intake"
    path = intake_file.file_path(directory, intake_file.list_files(directory)[-1])
    with open(path, "ab") as handle:
        handle.write(intake_file.encode_frame(record.topic_id, partition, base, base + 3, 0, batch) + batch)
        os.fsync(handle.fileno())
    return base, batch


def lake_settings_for(broker: BrokerProcess, lake_settings: Settings) -> Settings:
    """Settings of another broker's data dir that archive into the session's catalog (its Spark session's)."""
    archive = lake_settings.archive.model_copy(
        update={"catalog_uri": lake_settings.catalog_uri, "warehouse": lake_settings.warehouse}
    )
    return lake_settings.model_copy(
        update={"data_dir": broker.data_dir, "registry_listen": f"127.0.0.1:{broker.registry_port}",
                "listen": broker.bootstrap,
                "archive": archive}
    )


@pytest.fixture
def poison_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", env=ARCHIVE_ENV).start()
    yield proc
    proc.stop()


@pytest.mark.parametrize(("crash", "poison"), [(False, "records"), (True, "records"), (False, "bit-flip")],
                         ids=["clean", "crash-after-dead-letters", "bit-flipped-on-disk"])
def test_undecodable_batch_goes_to_the_dead_letter_table_and_the_partition_moves_on(
    crash: bool, poison: str, poison_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any
) -> None:
    topic = f"archive-poison-{'crash' if crash else 'clean'}-{poison}"
    settings = lake_settings_for(poison_broker, lake_settings)
    create_topic(poison_broker, topic, partitions=1)
    before = produce(poison_broker, topic, 20, partitions=1, tag="a")
    poison_broker.stop()
    bad_base, bad_batch = inject(poison_broker.data_dir, settings.metadata_url, topic, poison=poison)
    poison_broker.start()
    after = produce(poison_broker, topic, 10, partitions=1, tag="b")
    assert after[0][1] == bad_base + 3  # the poison took offsets bad_base..bad_base+2

    if crash:
        # The job dies after committing the dead letter, before the archive: the next pass must not
        # write the dead letter twice, nor lose or duplicate a record.
        env = {**os.environ, **ARCHIVE_ENV, FAULT_ENV: "after-dead-letters",
               "ICELOG_REGISTRY_LISTEN": settings.registry_listen, "ICELOG_LISTEN": settings.listen,
               "ICELOG_ARCHIVE__CATALOG_URI": settings.catalog_uri, "ICELOG_ARCHIVE__WAREHOUSE": settings.warehouse}
        died = subprocess.run(
            [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(settings.data_dir),
             "--topic", topic],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert died.returncode == 137, died.stderr[-3000:]

    store = open_store(settings.metadata_url)
    try:
        archiver = Archiver(settings, lake_spark, store)
        [result] = archiver.run_pass(force=True, topics=[topic])
        assert not result.error, result
        assert result.dead_letters == (0 if crash else 1)  # after a crash the letter was already kept
        assert as_produced(spark_rows(lake_spark, topic)) == before + after

        dlq = lake_spark.sql(
            f"SELECT `partition`, base_offset, last_offset, batch, error FROM icelog.`{topic}__dlq`"
        ).collect()
        assert [(r.partition, r.base_offset, r.last_offset, bytes(r.batch)) for r in dlq] == [
            (0, bad_base, bad_base + 2, bad_batch)
        ]
        assert ("Corrupt" if poison == "records" else "CRC-32C mismatch") in dlq[0].error

        # The partition moved on: later records archive normally, the dead letter is not written again.
        later = produce(poison_broker, topic, 5, partitions=1, tag="c")
        [result] = archiver.run_pass(force=True, topics=[topic])
        assert not result.error and result.records == 5 and result.dead_letters == 0
        assert as_produced(spark_rows(lake_spark, topic)) == before + after + later
        assert lake_spark.sql(f"SELECT count(*) AS n FROM icelog.`{topic}__dlq`").collect()[0].n == 1
        archiver.close()
    finally:
        store.close()

    status = subprocess.run(
        [sys.executable, "-m", "icelog", "status", "--data-dir", str(settings.data_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()
    header = status[0].split()
    [row] = [dict(zip(header, line.split(), strict=False)) for line in status[1:] if line.startswith(topic + " ")]
    assert row["DEAD-LETTERS"] == "1"
    assert row["ARCHIVED-THROUGH"] == str(len(before) + 3 + len(after) + len(later) - 1)


def test_an_undecodable_batch_of_a_compacted_topic_goes_to_the_dead_letter_table(
    poison_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any
) -> None:
    """An upsert table's pass (workers write its files, one row delta) sets the poison aside as an append does:
    the table holds the latest value of every key produced around it."""
    topic = "archive-poison-compacted"
    settings = lake_settings_for(poison_broker, lake_settings)
    create_topic(poison_broker, topic, partitions=1, configs={"cleanup.policy": "compact"})

    def send(values: dict[bytes, bytes]) -> None:
        producer = ck.Producer({"bootstrap.servers": poison_broker.bootstrap, "linger.ms": 5})
        for key, value in values.items():
            producer.produce(topic, key=key, value=value, partition=0)
        assert producer.flush(30) == 0

    send({b"k%d" % i: b"a%d" % i for i in range(10)})
    poison_broker.stop()
    bad_base, bad_batch = inject(poison_broker.data_dir, settings.metadata_url, topic)
    poison_broker.start()
    send({b"k%d" % i: b"b%d" % i for i in range(5)})

    store = open_store(settings.metadata_url)
    try:
        archiver = Archiver(settings, lake_spark, store)
        [result] = archiver.run_pass(force=True, topics=[topic])
        assert not result.error, result
        assert result.dead_letters == 1
        latest = {b"k%d" % i: (b"b%d" if i < 5 else b"a%d") % i for i in range(10)}
        assert {bytes(r["k"]): bytes(r["v"]) for r in spark_rows(lake_spark, topic)} == latest
        assert len(spark_rows(lake_spark, topic)) == len(latest)
        dlq = lake_spark.sql(
            f"SELECT `partition`, base_offset, last_offset, batch FROM icelog.`{topic}__dlq`").collect()
        assert [(r.partition, r.base_offset, r.last_offset, bytes(r.batch)) for r in dlq] == [
            (0, bad_base, bad_base + 2, bad_batch)
        ]
        archiver.close()
    finally:
        store.close()


class FakeClock:
    """A clock an hour ahead (every record is due at once) that only the test moves (backoff without sleeping)."""

    def __init__(self) -> None:
        self.start = time.time() + 3600
        self.shift = 0.0

    def __call__(self) -> float:
        return self.start + self.shift


def test_a_failing_topic_backs_off_alone_and_the_others_archive_every_pass(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore
) -> None:
    broken, healthy = "archive-backoff-broken", "archive-backoff-healthy"
    clock = FakeClock()
    archiver = Archiver(lake_settings, lake_spark, lake_store, clock=clock)
    # The broken topic's table holds the archive of an older topic of the same name (deleted, re-created).
    create_topic(lake_broker, broken, partitions=1, configs=NO_DELAY)
    produce(lake_broker, broken, 5, partitions=1)
    assert not archiver.run_pass(force=True, topics=[broken])[0].error
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    admin.delete_topics([broken])[broken].result(30)
    time.sleep(0.5)
    create_topic(lake_broker, broken, partitions=1, configs=NO_DELAY)
    produce(lake_broker, broken, 5, partitions=1)
    create_topic(lake_broker, healthy, partitions=1, configs=NO_DELAY)
    broken_id = lake_store.get_topic(broken).topic_id

    def broken_error_ms() -> int:
        return lake_store.archive_states(broken_id)[0].last_error_ms

    archived = []
    attempts = []
    for round_ in range(4):
        archived += produce(lake_broker, healthy, 5, partitions=1, tag=str(round_))
        clock.shift += 0.05
        by_topic = {r.topic: r for r in archiver.run_pass(topics=[broken, healthy])}
        assert not by_topic[healthy].error and by_topic[healthy].records == 5, by_topic[healthy]
        assert by_topic[broken].error and "a deleted topic" in by_topic[broken].error
        attempts.append(not by_topic[broken].skipped)
    # Tried once; then skipped until its retry time (1 s), while the healthy topic archived every pass.
    assert attempts == [True, False, False, False]
    first_error_ms = broken_error_ms()

    clock.shift += 1.0  # past the first backoff: tried again, and the next wait doubles
    by_topic = {r.topic: r for r in archiver.run_pass(topics=[broken, healthy])}
    assert not by_topic[broken].skipped and broken_error_ms() > first_error_ms
    clock.shift += 1.0
    assert archiver.run_pass(topics=[broken])[0].skipped  # 2 s now
    assert as_produced(spark_rows(lake_spark, healthy)) == archived

    # Fixed (the stale table dropped): archived at its next retry, backoff cleared.
    lake_spark.sql(f"DROP TABLE icelog.`{broken}`")
    clock.shift += 1.5
    [result] = archiver.run_pass(topics=[broken])
    assert not result.error and not result.skipped and result.records == 5
    archiver.close()


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A 'schema registry' that accepts connections and never answers (a hung dependency)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:  # the hung look-ups now fail, and their threads end
        conn.close()
    server.close()


def test_a_hung_dependency_of_one_topic_does_not_stall_the_others(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore,
    silent_registry: str,
) -> None:
    hung, healthy = "archive-hung-registry", "archive-hung-healthy"
    archive = lake_settings.archive.model_copy(update={"topic_wait_ms": 2000})
    settings = lake_settings.model_copy(update={"registry_url": silent_registry, "archive": archive})
    archiver = Archiver(settings, lake_spark, lake_store)
    create_topic(lake_broker, hung, partitions=1, configs={**NO_DELAY, "icelog.schema.value": "topic-name"})
    raw = {**NO_DELAY, "icelog.schema.key": "none", "icelog.schema.value": "none"}
    create_topic(lake_broker, healthy, partitions=1, configs=raw)  # needs no registry
    produce(lake_broker, hung, 5, partitions=1)
    archived = []
    for round_ in range(3):
        archived += produce(lake_broker, healthy, 5, partitions=1, tag=str(round_))
        # On a loaded machine the healthy topic's own Spark job may outlast topic_wait_ms too; then a
        # later pass finds it done. What must hold: it gets archived while the hung topic still hangs.
        deadline = time.monotonic() + 120
        while True:
            by_topic = {r.topic: r for r in archiver.run_pass(topics=[hung, healthy])}
            assert by_topic[hung].skipped  # waiting on the registry, in flight
            assert not by_topic[healthy].error
            if lake_spark.catalog.tableExists(table(healthy)) and as_produced(
                spark_rows(lake_spark, healthy)
            ) == archived:
                break
            assert time.monotonic() < deadline, "the healthy topic was not archived while the other hung"
    assert as_produced(spark_rows(lake_spark, healthy)) == archived
    archiver.close()
