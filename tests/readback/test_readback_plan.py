"""The broker plans each archive table once per commit, incrementally after appends, and gets pyiceberg's answer.

readback/plan.py plans a table once for all its Kafka partitions and, when the commits since are appends, reads only
the files they added. On real tables written by the real Spark archiver (and changed by Spark's compaction, snapshot
expiry, DELETE and primary-key upserts), after every step: each partition's files (with their delete files and
statistics) equal those of a fresh full plan and those of pyiceberg's own scan planning filtered on that partition
(what the broker planned before, once per partition); appends were read incrementally, anything else in full; and
a consumer reading the topic from the table afterwards gets every record exactly once.
"""

from __future__ import annotations

from typing import Any

import pytest

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.meta.store import MetadataStore
from icelog.readback.lake import LakeTables, catalog_locations, catalog_opener
from icelog.readback.plan import TablePlan, plan_table
from tests.archive.test_pk_tables import pass_ok, send, three_passes
from tests.readback.test_readback import TRIM, archive_and_trim, produce_codecs, read_back
from tests.support.broker import BrokerProcess
from tests.support.clients_util import comparable, create_topic

pytestmark = pytest.mark.slow


def tables_of(settings: Settings) -> LakeTables:
    opener = catalog_opener(settings)
    assert opener is not None
    return LakeTables(opener, catalog_locations(settings))


def current(tables: LakeTables, topic: str) -> TablePlan:
    """The plan after the broker's background check (one catalog query, a re-plan if the table changed)."""
    tables.refresh({("icelog", topic)})
    return tables.plan(("icelog", topic))


def described(plan: TablePlan, partition: int) -> list[tuple[Any, ...]]:
    return sorted((s.key, s.lower, s.upper, s.max_timestamp_ms, s.size) for s in plan.slices(partition))


def assert_exact(plan: TablePlan, partitions: int) -> None:
    """The plan equals a fresh full plan of the same table version, and pyiceberg's planning per partition."""
    table = plan.table
    full = plan_table(table, plan.location)
    assert full.appended is None and full.snapshot_id == plan.snapshot_id
    column = plan.layout.partition
    for partition in range(partitions):
        assert described(plan, partition) == described(full, partition), partition
        pyiceberg = table.scan(row_filter=f"{column} = {partition}", snapshot_id=plan.snapshot_id).plan_files()
        assert sorted(s.key for s in plan.slices(partition)) == sorted(
            (t.file.file_path, frozenset(d.file_path for d in t.delete_files)) for t in pyiceberg), partition
    assert (plan.owner, plan.covered, plan.raw, plan.layout) == (full.owner, full.covered, full.raw, full.layout)


def data_files(spark: Any, topic: str) -> set[str]:
    return {r.file_path for r in spark.sql(f"SELECT file_path FROM lake.icelog.`{topic}`.data_files").collect()}


def test_appends_are_planned_incrementally_and_every_plan_is_exact(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    lake_settings: Settings,
) -> None:
    topic = "planrecord"
    create_topic(lake_broker.bootstrap, topic, partitions=3, configs=TRIM)
    tables = tables_of(lake_settings)
    expected = produce_codecs(lake_broker, topic, 8, 3)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    plan = current(tables, topic)
    assert plan.appended is None and len(plan.files) == len(data_files(lake_spark, topic))
    assert_exact(plan, 3)
    assert current(tables, topic) is plan  # nothing committed: the same plan, nothing loaded or planned

    # Appends, one refresh after one and after two commits: only the files they added are read.
    for passes in (1, 2):
        before = data_files(lake_spark, topic)
        for _ in range(passes):
            expected += produce_codecs(lake_broker, topic, 4, 3)
            archive_and_trim(lake_archiver, lake_store, topic, expected)
        plan = current(tables, topic)
        assert plan.appended == len(data_files(lake_spark, topic) - before) > 0
        assert_exact(plan, 3)

    # Compaction (a replace), then an append on top: planned in full, then incrementally again.
    lake_spark.sql(f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', "
                   "options => map('min-input-files', '2'))").collect()
    plan = current(tables, topic)
    assert plan.appended is None
    assert_exact(plan, 3)
    expected += produce_codecs(lake_broker, topic, 4, 3)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    plan = current(tables, topic)
    assert plan.appended is not None and plan.appended > 0
    assert_exact(plan, 3)

    # Two appends the broker did not see, then the planned snapshot expires: the lineage is gone, planned in full.
    for _ in range(2):
        expected += produce_codecs(lake_broker, topic, 3, 3)
        archive_and_trim(lake_archiver, lake_store, topic, expected)
    lake_spark.sql(f"CALL lake.system.expire_snapshots(table => 'icelog.{topic}', "
                   "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)").collect()
    plan = current(tables, topic)
    assert plan.appended is None
    assert_exact(plan, 3)

    # An analyst's DELETE, then an append: in full, then incrementally on top of the plan after the delete.
    lake_spark.sql(f"DELETE FROM lake.icelog.`{topic}` WHERE kafka.partition = 1 AND kafka.offset IN (2, 5)").collect()
    expected = [r for r in expected if not (r.partition == 1 and r.offset in (2, 5))]
    plan = current(tables, topic)
    assert plan.appended is None
    assert_exact(plan, 3)
    expected += produce_codecs(lake_broker, topic, 3, 3)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    plan = current(tables, topic)
    assert plan.appended is not None and plan.appended > 0
    assert_exact(plan, 3)

    # What a consumer sees: every record once, from the table (the intake holds none of them).
    got = read_back("confluent", lake_broker, topic, [0, 1, 2], len(expected))
    assert comparable(got) == comparable(expected)


def test_table_layout_appends_and_primary_key_upserts_plan_exactly(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    lake_settings: Settings,
) -> None:
    tables = tables_of(lake_settings)
    topic = "plantable"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs={**TRIM, "icelog.archive.layout": "table"})
    expected = produce_codecs(lake_broker, topic, 6, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    plan = current(tables, topic)
    assert plan.layout.table and plan.appended is None
    assert_exact(plan, 2)
    expected += produce_codecs(lake_broker, topic, 3, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    plan = current(tables, topic)
    assert plan.appended is not None and plan.appended > 0
    assert_exact(plan, 2)
    assert comparable(read_back("confluent", lake_broker, topic, [0, 1], len(expected))) == comparable(expected)

    # A primary-key table: each pass commits data files with deletion vectors (not an append): planned in full.
    topic = "planpk"
    create_topic(lake_broker.bootstrap, topic, partitions=3,
                 configs={"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    for batch in three_passes(lake_broker, topic):
        send(lake_broker, topic, batch)
        pass_ok(lake_archiver, topic)
        plan = current(tables, topic)
        assert_exact(plan, 3)
    assert any(s.task.delete_files for p in range(3) for s in plan.slices(p))  # deletion vectors ride along
