"""When a table is due for maintenance, and the store keeping the last round across restarts (no Spark)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from icelog.archive.maintenance import MaintenancePolicy, MaintenanceResult, TableState
from icelog.archive.maintenance_schedule import due_reason, record_of
from icelog.config import ArchiveSettings
from icelog.errors import KafkaApiError
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import MaintenanceRecord
from icelog.table.config import CHECKS, TABLE_AUTO_MAINTENANCE, archive_config
from icelog.topics import validate_topic_configs

POLICY = MaintenancePolicy.from_settings(ArchiveSettings())
NOW = 10_000_000_000
HOUR = 3_600_000


def last(files: int, ago_ms: int, orphans_ago_ms: int = HOUR) -> MaintenanceRecord:
    return MaintenanceRecord("icelog.t", NOW - ago_ms, 1000, "ok", "", files, NOW - orphans_ago_ms)


def due(state: TableState, record: MaintenanceRecord | None, properties: dict[str, str] | None = None) -> str:
    return due_reason(state, record, POLICY, properties or {}, 300_000, 50, NOW)


def test_a_table_is_due_only_after_the_interval_and_with_work() -> None:
    small = TableState(data_files=80, snapshots=5, manifests=3, oldest_snapshot_ms=NOW - 60_000)
    assert due(small, last(files=10, ago_ms=60_000)) == ""  # interval not over
    assert due(small, last(files=10, ago_ms=600_000)) == "70 new data files"
    assert due(small, last(files=40, ago_ms=600_000)) == ""  # 40 new: under the trigger, nothing else to do
    assert due(TableState(data_files=3, delete_files=2, snapshots=1), last(3, 600_000)) == "2 delete files"
    old = TableState(data_files=3, snapshots=40, oldest_snapshot_ms=NOW - 2 * HOUR)
    assert due(old, last(3, 600_000)) == "snapshots to expire"
    # The table's own history.expire.* win over icelog's defaults.
    assert due(old, last(3, 600_000), {"history.expire.max-snapshot-age-ms": str(3 * HOUR)}) == ""
    assert due(TableState(data_files=3, snapshots=1, manifests=33), last(3, 600_000)) == "33 manifests"
    assert due(TableState(data_files=3, snapshots=1), last(3, 600_000, orphans_ago_ms=25 * HOUR)) == "orphan check"
    assert due(TableState(data_files=3, snapshots=2), None) == ""  # never maintained, no work: a new table waits
    assert due(TableState(data_files=60, snapshots=2), None) == "60 new data files"
    # A stream that stopped: too few new files for the trigger, but the table has not changed for an interval.
    quiet = TableState(data_files=28, snapshots=9, oldest_snapshot_ms=NOW - 600_000, current_snapshot_ms=NOW - 300_000)
    assert due(quiet, last(files=4, ago_ms=400_000)) == "24 new data files, no change for 300000 ms"
    assert due(dataclasses.replace(quiet, current_snapshot_ms=NOW - 60_000), last(files=4, ago_ms=400_000)) == ""
    assert due(dataclasses.replace(quiet, data_files=5), last(files=4, ago_ms=400_000)) == ""  # one file: no rewrite


def test_files_appended_while_a_round_ran_count_as_new_for_the_next_one() -> None:
    # A round compacted 13 files into 4 while passes appended 60 more: the table ended with 64.
    result = MaintenanceResult("icelog.t", TableState(data_files=13), TableState(data_files=64),
                               rewritten_files=13, added_files=4)
    record = record_of("icelog.t", result, NOW)
    assert record.data_files_after == 4
    later = dataclasses.replace(record, finished_ms=NOW - 600_000)
    assert due(TableState(data_files=64, snapshots=5, oldest_snapshot_ms=NOW - 60_000), later) == "60 new data files"


def test_the_last_round_survives_a_reopen_of_the_store(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    # A store created before maintenance existed: no table_maintenance table yet.
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE unrelated (x INT)")
    old.close()
    store = SqliteStore(path)
    record = MaintenanceRecord("icelog.t", NOW, 1234, "ok", "data files 40 -> 3", 3, NOW)
    store.record_maintenance(record)
    store.record_maintenance(MaintenanceRecord("icelog.u", NOW, 5, "lost-race", "x", 7))
    store.close()
    reopened = SqliteStore(path)
    assert reopened.maintenance_records() == {
        "icelog.t": record, "icelog.u": MaintenanceRecord("icelog.u", NOW, 5, "lost-race", "x", 7, -1)
    }
    reopened.close()


def test_auto_maintenance_topic_config_is_validated_and_defaults_to_on() -> None:
    assert archive_config("t", {}, {}, ArchiveSettings()).auto_maintenance
    assert not archive_config("t", {TABLE_AUTO_MAINTENANCE: "false"}, {}, ArchiveSettings()).auto_maintenance
    assert not archive_config("t", {}, {TABLE_AUTO_MAINTENANCE: "false"}, ArchiveSettings()).auto_maintenance
    with pytest.raises(ValueError, match="'yes' is not one of true, false"):
        CHECKS[TABLE_AUTO_MAINTENANCE]("yes")
    with pytest.raises(KafkaApiError, match="icelog.table.auto.maintenance"):
        validate_topic_configs({TABLE_AUTO_MAINTENANCE: "on"})
