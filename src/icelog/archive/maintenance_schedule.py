"""When the archiver maintains which table, and how a round stays out of the archive passes' way.

The archiver process calls `poll()` after every pass. At most every LOOK_EVERY_MS it looks, on a thread of
its own, for due tables, reading table metadata only (snapshot summary, snapshot list, manifest list: no
Spark job). If some table is due it starts the round as a child process, `icelog maintain --due`, with a
Spark of its own at CPU niceness `archive.maintenance_nice` (19), and looks again only once that child has
exited. So a round never takes the archiver's Spark task slots (its passes never queue behind a rewrite
task, however long), its driver's memory or GIL, and the kernel gives the passes the CPU first; the two
meet only at the catalog, where an append that races a rewrite is re-applied on Iceberg's retry (the
smaller side) and a rewrite that loses is retried next round (archive/maintenance.py).

A table of a topic with `icelog.table.auto.maintenance=true` (and its dead-letter table `<table>__dlq`,
when there is one) is due when `archive.maintenance_interval_ms` has passed since its last round and
there is work: `maintenance_min_new_files` data files added since (or `maintenance_min_input_files`, once
the table has not changed for the interval: a stream that stopped), delete files, snapshots past their
age, too many manifests, or no orphan check for `maintenance_orphan_age_ms` (a first round always
checks). Rounds are recorded in the metadata store, so the schedule and `icelog status --tables` survive
restarts. A failing round is logged and recorded; it never touches the topic's archive state.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from icelog.archive.dead_letter import DLQ_SUFFIX
from icelog.archive.locks import ArchiverLock, LockHeldError, WriterTurns
from icelog.archive.maintenance import (
    DLQ_SORT_COLUMN,
    SORT_COLUMN,
    MaintenancePolicy,
    MaintenanceResult,
    TableState,
    maintain_table,
    table_state,
)
from icelog.config import SETTINGS_ENV, Settings
from icelog.errors import first_line
from icelog.faults import armed
from icelog.lake.iceberg_java import load_table, table_properties
from icelog.lake.jvm_errors import from_jvm
from icelog.meta.store import ArchiveLedger, MaintenanceRecord, ProcessLocks, TopicReader
from icelog.table.config import archive_config, table_key
from icelog.table.layout import quote_identifier

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOK_EVERY_MS = 10_000  # how often the scheduler looks for due tables at most (or every interval, if shorter)
MAINTENANCE_LOCK = "maintenance.lock"  # one maintenance round per metadata store (archiver or `icelog maintain`)
# Test hook (ICELOG_TEST_FAULT, see icelog/faults.py): before each table, a round holds one Spark task slot
# of its session until <data_dir>/maintenance-stall.release exists, as a long rewrite task would (`.started`
# and `.ended` mark the task's start and end).
STALL_POINT = "maintenance-stall"


def due_reason(
    state: TableState,
    last: MaintenanceRecord | None,
    policy: MaintenancePolicy,
    properties: dict[str, str],
    interval_ms: int,
    min_new_files: int,
    now_ms: int,
) -> str:
    """Why a table needs a round now ('' if it does not)."""
    if last is not None and now_ms - last.finished_ms < interval_ms:
        return ""
    reasons = []
    new_files = state.data_files - (last.data_files_after if last is not None else 0)
    if new_files >= min_new_files:
        reasons.append(f"{new_files} new data files")
    elif new_files >= policy.min_input_files and 0 <= state.current_snapshot_ms <= now_ms - interval_ms:
        # A stream that stopped (or slowed) leaves its last small files compacted, not waiting for more.
        reasons.append(f"{new_files} new data files, no change for {interval_ms} ms")
    if state.delete_files:
        reasons.append(f"{state.delete_files} delete files")
    max_age_ms, min_keep = policy.expiry(properties)
    if state.snapshots > min_keep and 0 <= state.oldest_snapshot_ms < now_ms - max_age_ms:
        reasons.append("snapshots to expire")
    if state.manifests > policy.max_manifests:
        reasons.append(f"{state.manifests} manifests")
    # (A table never maintained is not due for orphans alone: its first round, due for other work, checks.)
    if last is not None and now_ms - last.orphans_checked_ms >= policy.orphan_age_ms:
        reasons.append("orphan check")
    return ", ".join(reasons)


def failure_record(key: str, message: str, last: MaintenanceRecord | None, now_ms: int) -> MaintenanceRecord:
    """A round that failed: its reason, the last known file count and orphan check kept."""
    return MaintenanceRecord(key, now_ms, 0, "failed", message, last.data_files_after if last else 0,
                             last.orphans_checked_ms if last else -1)


def record_of(key: str, result: MaintenanceResult, orphans_checked_ms: int) -> MaintenanceRecord:
    return MaintenanceRecord(
        table=key,
        finished_ms=int(time.time() * 1000),
        duration_ms=result.duration_ms,
        outcome=result.outcome,
        summary=result.summary(),
        # The files the round itself left (not the table at its end): files appended while it ran count
        # as new for the next round, or a long round would leave them uncompacted until other work is due.
        data_files_after=result.before.data_files - result.rewritten_files + result.added_files,
        orphans_checked_ms=orphans_checked_ms,
    )


@dataclass(frozen=True)
class DueTable:
    """A table a round should maintain now, and why."""

    key: str  # namespace.table
    name: str  # Spark identifier
    sort_column: str
    last: MaintenanceRecord | None
    reason: str
    check_orphans: bool


class MaintenanceStore(TopicReader, ArchiveLedger, ProcessLocks, Protocol):
    """The topics (their tables are maintained), the tables' last maintenance rounds, and the locks."""


class MaintenanceScheduler:
    """Finds due tables (`due_tables`, `run_due`); in the archiver, runs rounds in a child process (`poll`)."""

    def __init__(
        self, settings: Settings, spark: SparkSession, store: MaintenanceStore, clock: Callable[[], float] = time.time,
        round_args: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.round_args = round_args  # to `icelog maintain --due`: a sink's rounds name it (--sink NAME)
        self.spark = spark
        self.store = store
        self.clock = clock
        self.policy = MaintenancePolicy.from_settings(settings.archive)
        self.lock = ArchiverLock(store, MAINTENANCE_LOCK)
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="maintenance")
        self._looking: concurrent.futures.Future[None] | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._last_look_ms = -LOOK_EVERY_MS

    # -- in the archiver -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Look for due tables (on the scheduler's thread) unless a look or a round is under way, or a look
        ran within LOOK_EVERY_MS (or the maintenance interval); a due table starts a round as a child
        process. Never waits."""
        if self._looking is not None and not self._looking.done():
            return
        if self._child is not None:
            if self._child.poll() is None:
                return
            now_ms = int(self.clock() * 1000)
            if self._child.returncode:  # (it could not start Spark?) not one JVM start per look: wait a while
                log.warning("the maintenance round exited with %s; looking again in %d ms",
                            self._child.returncode, self.settings.archive.maintenance_interval_ms)
                self._last_look_ms = now_ms + self.settings.archive.maintenance_interval_ms
            self._child = None
        now_ms = int(self.clock() * 1000)
        if now_ms - self._last_look_ms < min(LOOK_EVERY_MS, self.settings.archive.maintenance_interval_ms):
            return
        self._last_look_ms = now_ms
        self._looking = self._thread.submit(self._look)

    def _look(self) -> None:
        try:
            self.lock.acquire(wait_s=0)  # only to see that no `icelog maintain` holds it: no JVM start in vain
            self.lock.release()
        except LockHeldError:
            return
        try:
            due = self.due_tables()
        except Exception:
            log.exception("looking for tables to maintain failed; trying again later")
            return
        if due:
            log.info("starting a maintenance round (%s)", "; ".join(f"{t.key}: {t.reason}" for t in due))
            self._child = start_round_process(self.settings, self.round_args)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        child = self._child
        if child is not None and child.poll() is None:  # the round ends with the archiver (it is retried)
            child.terminate()
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    # -- what is due, and the round itself (in `icelog maintain --due`) -------------------------------
    def due_tables(self) -> list[DueTable]:
        """The tables of auto-maintained topics (and their dead-letter tables) that are due now."""
        records = self.store.maintenance_records()
        due = []
        for topic in self.store.list_topics():
            config = archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)
            if not config.enabled or not config.auto_maintenance:
                continue
            for table, sort_column in ((config.table, SORT_COLUMN), (config.table + DLQ_SUFFIX, DLQ_SORT_COLUMN)):
                key = table_key(config.namespace, table)
                try:
                    found = self._due(key, sort_column, records.get(key))
                except Exception as exc:  # the catalog is down, the table is being dropped: next look
                    # (py4j's own first line says only which call failed: the Java exception says why)
                    log.warning("could not read %s to schedule maintenance: %s", key, first_line(from_jvm(exc)))
                    continue
                if found is not None:
                    due.append(found)
        return due

    def _due(self, key: str, sort_column: str, last: MaintenanceRecord | None) -> DueTable | None:
        name = quote_identifier(self.settings.archive.catalog_name, *key.rsplit(".", 1))
        if not self.spark.catalog.tableExists(name):
            return None
        table = load_table(self.spark, name)
        now_ms = int(self.clock() * 1000)
        reason = due_reason(
            table_state(table), last, self.policy, table_properties(table),
            self.settings.archive.maintenance_interval_ms, self.settings.archive.maintenance_min_new_files, now_ms,
        )
        if not reason:
            return None
        orphans = last is None or now_ms - last.orphans_checked_ms >= self.policy.orphan_age_ms
        return DueTable(key, name, sort_column, last, reason, orphans)

    def run_due(self) -> list[MaintenanceResult]:
        """Maintain every due table now, in this process's Spark session; the rounds that ran."""
        results = []
        try:
            self.lock.acquire(wait_s=0)
        except LockHeldError:
            log.info("a maintenance round runs elsewhere (icelog maintain); looking again later")
            return []
        try:
            for table in self.due_tables():
                if armed(STALL_POINT):
                    hold_task_slot(self.spark, Path(self.settings.data_dir) / STALL_POINT)
                result = self._maintain(table)
                if result is not None:
                    results.append(result)
        finally:
            self.lock.release()
        return results

    def _maintain(self, table: DueTable) -> MaintenanceResult | None:
        log.info("maintaining %s (%s)", table.key, table.reason)
        now_ms = int(self.clock() * 1000)
        last = table.last
        try:
            result = maintain_table(
                self.spark, table.name, self.policy, remove_orphans=table.check_orphans, clock=self.clock,
                sort_column=table.sort_column, turns=WriterTurns(self.store, table.key),
            )
        except Exception as exc:  # the catalog is down, the table is being dropped: next round
            message = f"{type(exc).__name__}: {first_line(exc)}"
            log.warning("maintenance of %s failed (retried next round): %s", table.key, message)
            self.store.record_maintenance(failure_record(table.key, message, last, int(self.clock() * 1000)))
            return None
        checked = now_ms if result.orphans_checked else (last.orphans_checked_ms if last else -1)
        self.store.record_maintenance(record_of(table.key, result, checked))
        log.info("maintained %s: %s", table.key, result.summary())
        return result


def start_round_process(settings: Settings, args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`icelog maintain --due [args]` with these settings (its output goes to the archiver's)."""
    env = {**os.environ, SETTINGS_ENV: settings.model_dump_json()}
    return subprocess.Popen([sys.executable, "-m", "icelog", "maintain", "--due", *args], env=env)


def hold_task_slot(spark: SparkSession, marker: Path) -> None:
    """Test hook: one Spark task that writes `<marker>.started`, waits for `<marker>.release` (at most 300 s),
    then writes `<marker>.ended`."""
    started, release, ended = (Path(f"{marker}.{suffix}") for suffix in ("started", "release", "ended"))

    def wait(_row: object) -> None:
        started.touch()
        deadline = time.time() + 300
        while not release.exists() and time.time() < deadline:
            time.sleep(0.05)
        ended.touch()

    log.warning("fault injection: %s holds a Spark task slot until %s exists", STALL_POINT, release)
    spark.sparkContext.parallelize([0], 1).foreach(wait)
