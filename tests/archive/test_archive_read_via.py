"""Archive tasks reading over the Kafka protocol: the same chunks and rows as the intake files give, on every
listener kind (SASL_SSL with SCRAM here), and a wrong login named in one line.

The whole archive suite also runs with tasks reading over Kafka: ICELOG_ARCHIVE__READ_VIA=kafka (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from icelog.archive.decode import decode_archive
from icelog.archive.intake_source import KafkaFetch, source_of
from icelog.archive.plan import PlannedArchive, plan_partition
from icelog.client.properties import parse
from icelog.config import ArchiveSettings
from icelog.meta.backends import open_store
from icelog.table.config import archive_config
from tests.support.archive import ARCHIVE_ENV
from tests.support.broker import BrokerProcess
from tests.support.security import start_secure_broker

USER, PASSWORD = "archiver", "s3cret-archiver"


def _plans(data_dir: Path, topic: str, max_bytes: int) -> list[PlannedArchive]:
    """What the archiver would plan now (forced) for every partition of `topic`, cut at `max_bytes`."""
    store = open_store(f"sqlite:///{data_dir / 'meta.db'}")
    try:
        record = store.get_topic(topic)
        assert record is not None
        config = archive_config(topic, {}, {}, ArchiveSettings(max_bytes=max_bytes))
        out: list[PlannedArchive] = []
        for part in store.partitions(record.topic_id):
            chunks = store.intake_chunks_after(record.topic_id, part.partition, 0, 10_000)
            out += plan_partition(chunks, 0, part.high_watermark, config, now_ms=0, force=True)
        return out
    finally:
        store.close()


def _rows(source: object, archives: list[PlannedArchive]) -> list[dict[str, object]]:
    return [row for a in archives for batch in decode_archive(source, a) for row in batch.to_pylist()]  # type: ignore[arg-type]


def test_kafka_fetch_gives_the_planned_chunks_of_the_files(broker: BrokerProcess, topic_name: str) -> None:
    from tests.support.archive import create_topic, produce

    create_topic(broker, topic_name)
    produced = produce(broker, topic_name, 3000)
    archives = _plans(broker.data_dir, topic_name, max_bytes=20_000)
    assert len(archives) > 3, "several archives per partition, each of several chunks"
    files = source_of(broker.data_dir / "intake")
    kafka = KafkaFetch((broker.bootstrap,), parse({}), topic_name)
    for archive in archives:
        assert [(r, bytes(v)) for r, v in kafka.chunks(archive)] == [(r, bytes(v)) for r, v in files.chunks(archive)]
    rows = _rows(kafka, archives)
    assert rows == _rows(files, archives)
    assert len(rows) == len(produced)

    # A range starting and ending inside stored batches: the first batch starts before it, the last ends after;
    # only the planned offsets come out.
    whole = next(a for a in archives if a.record_count > 20)
    cut = dataclasses.replace(whole, start_offset=whole.start_offset + 3, end_offset=whole.end_offset - 3)
    offsets = [r["kafka"]["offset"] for r in _rows(kafka, [cut])]  # type: ignore[index]
    assert offsets == list(range(cut.start_offset, cut.end_offset))
    assert _rows(kafka, [cut]) == _rows(files, [cut])


def test_kafka_fetch_serves_runs_cut_inside_batches_as_a_sink_plans_them(broker: BrokerProcess,
                                                                          topic_name: str) -> None:
    """A sink plans runs of offsets cut anywhere (sink/source_store.py), so an archive can start inside a stored
    batch: its first fetch returns that batch whole, from before the planned chunk. Every record comes out once,
    none as a dead letter (the decoder took such a batch for broken framing: 10 M records in bench/sink_bench.py
    sent whole runs to the dead-letter table)."""
    from icelog.archive.decode import find_dead_letters
    from icelog.meta.store import IntakeChunk
    from icelog.sink.source_store import RECORD_BYTES_GUESS
    from tests.support.archive import create_topic, produce

    create_topic(broker, topic_name)
    produced = produce(broker, topic_name, 3000)
    store = open_store(f"sqlite:///{broker.data_dir / 'meta.db'}")
    try:
        record = store.get_topic(topic_name)
        assert record is not None
        partitions = store.partitions(record.topic_id)
    finally:
        store.close()
    run = 37  # records a run: not a batch boundary
    config = archive_config(topic_name, {}, {}, ArchiveSettings(max_bytes=2 * run * RECORD_BYTES_GUESS))
    kafka = KafkaFetch((broker.bootstrap,), parse({}), topic_name)
    archives: list[PlannedArchive] = []
    for part in partitions:
        runs = [IntakeChunk(record.topic_id, part.partition, start, min(start + run, part.high_watermark), -1, 0,
                            (min(start + run, part.high_watermark) - start) * RECORD_BYTES_GUESS, -1, 0)
                for start in range(0, part.high_watermark, run)]
        archives += plan_partition(runs, 0, part.high_watermark, config, now_ms=0, force=True)
    assert len(archives) > 3 * len(partitions)
    assert not [letter for archive in archives for letter in find_dead_letters(kafka, archive)]
    rows = _rows(kafka, archives)
    got = sorted((r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows)  # type: ignore[index]
    assert got == sorted((row[0], row[1]) for row in produced)


def _archive_once(
    data_dir: Path, port: int, topic: str, properties: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_ARCHIVE__READ_VIA": "kafka",
           "ICELOG_ARCHIVE__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
           "ICELOG_ARCHIVE__CLIENT_PROPERTIES": json.dumps(properties)}
    return subprocess.run([sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(data_dir),
                           "--topic", topic], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.spark
@pytest.mark.slow
def test_archive_over_sasl_ssl_with_scram(tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyiceberg.catalog.sql import SqlCatalog

    secure = start_secure_broker(tmp_path, ("SASL_SSL",), env={**ARCHIVE_ENV, "ICELOG_SUPER_USERS": f"User:{USER}"},
                                 users={USER: PASSWORD})
    try:
        port = secure.ports["SASL_SSL"]
        client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                  "sasl.password": PASSWORD, "ssl.ca.location": str(secure.pki.ca_pem)}
        conf = {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **client}
        topic = "secure-archive"
        admin = AdminClient(conf)
        admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
        producer = Producer(conf)
        for i in range(400):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0

        bad = _archive_once(secure.broker.data_dir, port, topic, {**client, "sasl.password": "wrong"})
        assert bad.returncode != 0
        assert "refused the SASL SCRAM-SHA-512 login of 'archiver'" in bad.stdout + bad.stderr
        assert "wrong" not in bad.stdout + bad.stderr and PASSWORD not in bad.stdout + bad.stderr

        good = _archive_once(secure.broker.data_dir, port, topic, client)
        assert good.returncode == 0, good.stdout + good.stderr[-3000:]
        assert PASSWORD not in good.stdout + good.stderr

        data_dir = secure.broker.data_dir
        catalog = SqlCatalog("lake", uri=f"sqlite:///{data_dir / 'catalog.db'}",
                             warehouse=(data_dir / "warehouse").resolve().as_uri())
        rows = catalog.load_table(("icelog", topic)).scan().to_arrow().to_pylist()
        got = sorted((r["kafka"]["partition"], r["kafka"]["offset"], r["value"]["__raw__"]) for r in rows)
        assert got == sorted((i % 2, i // 2, f"v{i}".encode()) for i in range(400))
    finally:
        secure.broker.stop()



def test_kafka_fetch_drops_aborted_transactions_as_the_files_plan_does(broker: BrokerProcess, topic_name: str) -> None:
    """read_committed over Kafka (the tasks filter what the Fetch names aborted) gives the rows the files give
    with the driver's transaction index, whichever way transactions interleave and archives cut them: only
    committed records, and plain records between them."""
    from confluent_kafka import Producer

    from icelog.archive.transactions import BrokerTransactions, TransactionTracker
    from icelog.log.intake import IntakeFiles
    from tests.support.archive import create_topic

    create_topic(broker, topic_name, partitions=1)
    conf = {"bootstrap.servers": broker.bootstrap, "linger.ms": 0}
    producers = {name: Producer({**conf, "transactional.id": f"{topic_name}-{name}"}) for name in ("a", "b")}
    for producer in producers.values():
        producer.init_transactions(30)
    plain = Producer(conf)
    committed: list[bytes] = []
    for round_ in range(6):  # two transactions open at once, one committed and one aborted each round
        for producer in producers.values():
            producer.begin_transaction()
        for i in range(4):
            for name, producer in producers.items():
                producer.produce(topic_name, value=f"{name}{round_}-{i}".encode(), partition=0)
                producer.flush(30)
            plain.produce(topic_name, value=f"plain{round_}-{i}".encode(), partition=0)
            plain.flush(30)
            committed.append(f"plain{round_}-{i}".encode())
        keep, drop = ("a", "b") if round_ % 2 else ("b", "a")
        producers[drop].abort_transaction(30)
        producers[keep].commit_transaction(30)
        committed += [f"{keep}{round_}-{i}".encode() for i in range(4)]

    store = open_store(f"sqlite:///{broker.data_dir / 'meta.db'}")
    try:
        record = store.get_topic(topic_name)
        assert record is not None
        [part] = store.partitions(record.topic_id)
        chunks = store.intake_chunks_after(record.topic_id, 0, 0, 10_000)
    finally:
        store.close()
    tracker = TransactionTracker(IntakeFiles(broker.data_dir / "intake"))
    tracker.refresh(record, {0: chunks})
    remote = BrokerTransactions((broker.bootstrap,), parse({}))
    try:
        remote.refresh(record, {0: chunks})
        assert remote.stable_offset(record, part) == tracker.stable_offset(record, part) == part.high_watermark
    finally:
        remote.close()

    files, kafka = source_of(broker.data_dir / "intake"), KafkaFetch((broker.bootstrap,), parse({}), topic_name)
    for max_bytes in (400, 3000, 1_000_000):  # archives that cut transactions anywhere, and one whole
        config = archive_config(topic_name, {}, {}, ArchiveSettings(max_bytes=max_bytes))
        archives = plan_partition(chunks, 0, part.high_watermark, config, now_ms=0, force=True)
        with_ranges = [
            dataclasses.replace(a, aborted=tuple(
                (r.producer_id, r.first_offset, r.last_offset)
                for r in tracker.aborted(record.topic_id, 0, a.start_offset, a.end_offset)))
            for a in archives
        ]
        from_files = _rows(files, with_ranges)
        assert sorted(bytes(r["value"]["__raw__"]) for r in from_files) == sorted(committed)  # type: ignore[index]
        assert _rows(kafka, archives) == from_files, max_bytes
