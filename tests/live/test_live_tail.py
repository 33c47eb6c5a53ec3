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
from tests.support.archive import ARCHIVE_ENV, create_topic, produce
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
