"""Live reads of a tail alone, without Spark: a topic whose table does not exist yet reads every committed record
from the intake, and a batch a pass would send to the dead-letter table (a record that does not parse, a bit
flipped on disk) is left out as the pass leaves it out, the records after it read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from icelog import live
from tests.archive.test_archive_isolation import inject
from tests.live.test_live import as_rows
from tests.support.archive import ARCHIVE_ENV, committed_aborted_open, create_topic, produce
from tests.support.broker import BrokerProcess


@pytest.fixture
def tail_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", env=ARCHIVE_ENV).start()
    yield proc
    proc.stop()


@pytest.mark.parametrize("poison", ["records", "bit-flip"])
def test_a_tail_with_an_undecodable_batch_reads_every_other_record_once(
    tail_broker: BrokerProcess, poison: str
) -> None:
    topic = f"live-poison-{poison}"
    create_topic(tail_broker, topic, partitions=1)
    before = produce(tail_broker, topic, 20, partitions=1, tag="a")
    tail_broker.stop()
    bad_base, _batch = inject(tail_broker.data_dir, f"sqlite:///{tail_broker.data_dir / 'meta.db'}", topic,
                              poison=poison)
    tail_broker.start()
    after = produce(tail_broker, topic, 10, partitions=1, tag="b")
    assert after[0][1] == bad_base + 3

    rows = live.scan(topic, data_dir=str(tail_broker.data_dir)).read_all()  # no table: all of it is the tail
    assert as_rows(rows) == before + after


def test_a_tail_read_over_the_kafka_protocol_is_read_committed(tail_broker: BrokerProcess, tmp_path: Path) -> None:
    """Only the broker's address (archive.read_via: kafka): an aborted transaction's records and the markers are
    left out by the read_committed Fetches, nothing at or past an open transaction is read, and the read's
    ingest time is when it was planned."""
    import time

    import yaml

    topic = "live-kafka-txn"
    create_topic(tail_broker, topic, partitions=1)
    plain = produce(tail_broker, topic, 10, partitions=1, tag="p")

    pending = committed_aborted_open(tail_broker.bootstrap, topic, topic)

    config = tmp_path / "analyst.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "analyst"), "archive": {
        "read_via": "kafka", "bootstrap_servers": tail_broker.bootstrap}}))

    def values() -> list[bytes]:  # of the records after the plain ones
        rows = sorted(live.scan(topic, config=str(config)).read_all().to_pylist(), key=lambda r: r["kafka"]["offset"])
        return [r["value"]["__raw__"] for r in rows[10:]]

    started_us = int(time.time() * 1_000_000)
    rows = live.scan(topic, config=str(config)).read_all()
    assert as_rows(rows)[:10] == plain
    assert all(k["ingest_timestamp"].timestamp() * 1_000_000 >= started_us - 1000 for k in rows.column("kafka")
               .to_pylist())
    assert values() == [f"c-{i}".encode() for i in range(5)]
    pending.commit_transaction(30)
    assert values() == [f"c-{i}".encode() for i in range(5)] + [b"open-0", b"after-open"]
    assert not (tmp_path / "analyst" / "meta.db").exists()
