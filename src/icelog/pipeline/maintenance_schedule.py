"""When the archiver maintains which table: automatic maintenance on its own thread, never in a pass's way.

The archiver process calls `poll()` after every pass. At most one round runs at a time, on a thread of
its own whose Spark jobs go to the `maintenance` pool of Spark's FAIR scheduler (the archive passes keep
the default pool, so their tasks are interleaved with the rewrite's rather than queued behind it). A
table of a topic with `icelog.table.auto.maintenance=true` is due when `archive.maintenance_interval_ms`
has passed since its last round and there is work: `maintenance_min_new_files` data files added since,
delete files, snapshots past their age, too many manifests, or no orphan check for
`maintenance_orphan_age_ms` (a first round always checks). The decision reads table metadata only
(snapshot summary, snapshot list, manifest list). Rounds are recorded in the metadata store, so the
schedule and `icelog status --tables` survive restarts. A failing round is logged and
recorded; it never touches the topic's archive state.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.lake.iceberg_java import load_table, table_properties
from icelog.lake.layout import quote_identifier
from icelog.meta.store import MaintenanceRecord, MetadataStore
from icelog.pipeline.archiver import first_line
from icelog.pipeline.locks import ArchiverLock
from icelog.pipeline.maintenance import (
    MaintenancePolicy,
    MaintenanceResult,
    TableState,
    maintain_table,
    table_state,
)
from icelog.topic_configs.archive import archive_config

log = logging.getLogger(__name__)

SCHEDULER_POOL = "maintenance"  # Spark FAIR scheduler pool of maintenance jobs (lake/spark.py sets FAIR)
LOOK_EVERY_MS = 10_000  # how often the scheduler looks for due tables at most
MAINTENANCE_LOCK = "maintenance.lock"  # one maintenance round per data directory (archiver or `icelog maintain`)


def table_key(namespace: str, table: str) -> str:
    return f"{namespace}.{table}"


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


class MaintenanceScheduler:
    """Runs due maintenance rounds, one at a time, on its own thread."""

    def __init__(
        self, settings: Settings, spark: Any, store: MetadataStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.store = store
        self.clock = clock
        self.policy = MaintenancePolicy.from_settings(settings.archive)
        self.lock = ArchiverLock(Path(settings.data_dir), MAINTENANCE_LOCK)
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="maintenance")
        self._running: concurrent.futures.Future[list[MaintenanceResult]] | None = None
        self._last_look_ms = -LOOK_EVERY_MS

    def poll(self) -> None:
        """Start a look for due tables unless one is running or one ran within LOOK_EVERY_MS."""
        now_ms = int(self.clock() * 1000)
        if self._running is not None and not self._running.done():
            return
        if now_ms - self._last_look_ms < LOOK_EVERY_MS:
            return
        self._last_look_ms = now_ms
        self._running = self._thread.submit(self.run_due)

    def run_due(self) -> list[MaintenanceResult]:
        """Maintain every due table now (on the caller's thread); the rounds that ran."""
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", SCHEDULER_POOL)
        results = []
        try:
            self.lock.acquire(wait_s=0)
        except IcelogError:
            log.info("a maintenance round runs elsewhere (icelog maintain); looking again later")
            return []
        try:
            records = self.store.maintenance_records()
            for topic in self.store.list_topics():
                config = archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)
                if not config.enabled or not config.auto_maintenance:
                    continue
                key = table_key(config.namespace, config.table)
                result = self._maintain_if_due(key, records.get(key))
                if result is not None:
                    results.append(result)
        except Exception:
            log.exception("looking for tables to maintain failed; trying again later")
        finally:
            self.lock.release()
        return results

    def _maintain_if_due(self, key: str, last: MaintenanceRecord | None) -> MaintenanceResult | None:
        name = quote_identifier(self.settings.archive.catalog_name, *key.rsplit(".", 1))
        now_ms = int(self.clock() * 1000)
        try:
            if not self.spark.catalog.tableExists(name):
                return None
            table = load_table(self.spark, name)
            reason = due_reason(
                table_state(table), last, self.policy, table_properties(table),
                self.settings.archive.maintenance_interval_ms, self.settings.archive.maintenance_min_new_files,
                now_ms,
            )
            if not reason:
                return None
            log.info("maintaining %s (%s)", key, reason)
            orphans = last is None or now_ms - last.orphans_checked_ms >= self.policy.orphan_age_ms
            result = maintain_table(self.spark, name, self.policy, remove_orphans=orphans, clock=self.clock)
        except Exception as exc:  # the catalog is down, the table is being dropped: next round
            message = f"{type(exc).__name__}: {first_line(exc)}"
            log.warning("maintenance of %s failed (retried next round): %s", key, message)
            self.store.record_maintenance(MaintenanceRecord(
                key, int(self.clock() * 1000), 0, "failed", message,
                last.data_files_after if last else 0, last.orphans_checked_ms if last else -1,
            ))
            return None
        checked = now_ms if result.orphans_checked else (last.orphans_checked_ms if last else -1)
        self.store.record_maintenance(record_of(key, result, checked))
        log.info("maintained %s: %s", key, result.summary())
        return result

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
