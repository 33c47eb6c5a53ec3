"""Read-back reads a file's row groups, and a large unit of them in windows of offsets, with the rows a whole read
gets: a compaction can write one row group of 100+ MB, which built whole held ~1 GB of the broker for one seek.

(A segment of several files whose offset runs interleave, merged by their overlapping row groups, was checked the
same way on a soak's compaction outputs; Spark's compaction cannot be made to interleave on a small table here.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kafka.record.default_records import DefaultRecordBatch

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.meta.store import MetadataStore
from icelog.readback import source as readback_source
from icelog.readback.service import ReadBack
from icelog.schema.codec.registry_source import StoreSchemaSource
from tests.readback.test_readback import TRIM, archive_and_trim, produce_codecs
from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic

pytestmark = pytest.mark.slow


def test_a_large_unit_is_read_in_windows_with_the_rows_of_a_whole_read(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    lake_settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = "rbwindows"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs=TRIM)
    expected = produce_codecs(lake_broker, topic, 20, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    more = produce_codecs(lake_broker, topic, 20, 2)
    expected = sorted(expected + more, key=lambda r: (r.partition, r.offset))
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    lake_spark.sql(f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', "
                   "options => map('min-input-files', '2'))").collect()
    monkeypatch.setattr(readback_source, "UNIT_MAX_ROWS", 7)  # every row group is "large": read in windows
    monkeypatch.setattr(readback_source, "WINDOW_READ_ROWS", 3)  # ... of several batches, so a window stops early
    record = lake_store.get_topic(topic)
    assert record is not None
    readback = ReadBack(lake_settings, StoreSchemaSource(lake_store))
    for partition in (0, 1):
        source = readback.source(record.topic_id, topic, record.configs, partition, False)
        assert source is not None
        source.refresh(fresh=True)
        plan = source._plan
        assert plan.table is not None
        windows = 0
        for segment in plan.slices:
            units = source._row_groups(plan, segment, 0)
            assert all(u is not None for u in units)
            windows += sum(1 for u in units if u is not None and u.window is not None)
            whole = source._read_rows(plan.table, segment, plan.layout, None)
            parts = [source._read_rows(plan.table, segment, plan.layout, u) for u in units]
            assert np.array_equal(np.concatenate([p.offsets for p in parts]), whole.offsets)
        assert windows > 1, "the compacted file's row groups were read in windows"
        assert source._in_order and all(source._in_order.values()), "windows after the first stop past their end"
        parts = [source._read_rows(plan.table, segment, plan.layout, u) for segment in plan.slices
                 for u in source._row_groups(plan, segment, 0)]  # again: every window now stops early
        assert np.array_equal(np.concatenate([p.offsets for p in parts]),
                              np.concatenate([source._read_rows(plan.table, s, plan.layout, None).offsets
                                              for s in plan.slices]))
        # Through the read path the broker serves Fetch with: every record, in order, from any offset.
        wanted = [(r.offset, r.value) for r in expected if r.partition == partition]
        for start in (wanted[0][0], wanted[len(wanted) // 2][0]):
            got: list[tuple[int, bytes | None]] = []
            offset = start
            while offset <= wanted[-1][0]:
                batches = source.read(offset, 200)
                assert batches, offset
                for data in batches:
                    got.extend((r.offset, r.value) for r in DefaultRecordBatch(data) if r.offset >= offset)
                offset = got[-1][0] + 1
            assert got == [w for w in wanted if w[0] >= start]
