"""What is read at scrape time: partitions, lag to Iceberg, consumer-group lag, tables, back-pressure, read-back.

The archiver is another process; everything it does reaches the broker through the metadata store (archive
states, maintenance records) and `archive-stats.json` (archive/pass_stats.py), so these metrics are computed from
those when Prometheus scrapes (a few store queries per partition, the same as `icelog status`), on a worker
thread, never on the event loop. Table sizes come from Iceberg metadata with pyiceberg, cached per metadata file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from icelog.archive.pass_stats import read_pass_stats
from icelog.archive.progress import archive_progress
from icelog.config import Settings
from icelog.lake.catalog import pyiceberg_catalog_opener, sqlite_catalog_path, sqlite_metadata_locations
from icelog.lake.table_stats import TableStats, table_stats
from icelog.log.manager import LogManager
from icelog.meta.store import MetadataStore
from icelog.readback.service import ReadBack
from icelog.table.config import archive_config, table_key

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

MAINTENANCE_OUTCOMES = ("ok", "nothing-to-do", "lost-race", "failed")
TABLE_STATS_TTL_S = 30.0  # a catalog whose metadata file cannot be looked up cheaply (REST) is read this often


@dataclass(frozen=True)
class _CachedStats:
    location: str | None  # the metadata file the numbers are from (None: not known, see `at`)
    at: float
    stats: TableStats | None


class TableStatsCache:
    """Each table's numbers, read again only when its metadata file changes (the embedded catalog: one query)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cached: dict[tuple[str, str], _CachedStats] = {}
        self._lock = threading.Lock()
        self._catalog: Catalog | None = None  # opened once (it holds a connection pool), again after a failure

    def stats(self, namespace: str, table: str) -> TableStats | None:
        path = sqlite_catalog_path(self.settings)
        location: str | None = None
        if path is not None:
            location = sqlite_metadata_locations(path, self.settings.archive.catalog_name).get((namespace, table))
            if location is None:
                return None
        key = (namespace, table)
        now = time.monotonic()
        with self._lock:
            cached = self._cached.get(key)
            if cached is not None and (cached.location == location if location is not None
                                       else now - cached.at < TABLE_STATS_TTL_S):
                return cached.stats
            if self._catalog is None:
                opener = pyiceberg_catalog_opener(self.settings)
                self._catalog = opener() if opener is not None else None
            try:
                found = table_stats(self._catalog, namespace, table)
            except Exception:
                self._catalog = None
                raise
            self._cached[key] = _CachedStats(location, now, found)
            return found


class BrokerCollector(Collector):
    """The scrape-time metrics of one broker (registered in its CollectorRegistry)."""

    def __init__(self, settings: Settings, store: MetadataStore, logs: LogManager, readback: ReadBack,
                 archiver_restarts: Callable[[], int]) -> None:
        self.settings = settings
        self.store = store
        self.logs = logs
        self.readback = readback
        self.archiver_restarts = archiver_restarts
        self.tables = TableStatsCache(settings)

    def describe(self) -> list[Metric]:
        return []  # families are only known at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        # A part that fails (the store or the catalog unreachable) is left out of this scrape, not the others:
        # the request metrics still answer, and /readyz says what is wrong.
        for part in (self._partitions, self._groups, self._tables, self._pressure, self._readback):
            try:
                families = list(part())
            except Exception as exc:
                log.warning("metrics: %s left out of this scrape: %s", part.__name__.lstrip("_"), exc)
                continue
            yield from families

    def _partitions(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        hw = GaugeMetricFamily("icelog_partition_high_watermark", "The next offset a partition will write.",
                               labels=labels)
        start = GaugeMetricFamily("icelog_partition_log_start_offset",
                                  "The first offset the intake holds (the table may hold older ones).", labels=labels)
        intake = GaugeMetricFamily("icelog_partition_intake_bytes", "Bytes of the partition in the intake.",
                                   labels=labels)
        chunks = GaugeMetricFamily("icelog_partition_intake_chunks", "Intake chunks (group commits) the partition's "
                                   "intake is in.", labels=labels)
        archived = GaugeMetricFamily("icelog_archive_archived_offset", "The next offset the Iceberg table does not "
                                     "hold yet (archived topics).", labels=labels)
        lag_records = GaugeMetricFamily("icelog_archive_lag_records", "Records in the intake not yet in the Iceberg "
                                        "table.", labels=labels)
        lag_bytes = GaugeMetricFamily("icelog_archive_lag_bytes", "Intake bytes not yet in the Iceberg table.",
                                      labels=labels)
        lag_seconds = GaugeMetricFamily("icelog_archive_lag_seconds", "Age of the oldest record not yet in the "
                                        "Iceberg table (0 when none is waiting).", labels=labels)
        last_commit = GaugeMetricFamily("icelog_archive_last_commit_timestamp_seconds", "When the archiver last "
                                        "committed this partition's records to the table (Unix time).", labels=labels)
        failing = GaugeMetricFamily("icelog_archive_failing", "1 while the archiver's last attempt at the partition "
                                    "failed (`icelog status` shows the error), else 0.", labels=labels)
        progress = archive_progress(self.settings, self.store)
        for topic in self.store.list_topics():
            for part in self.store.partitions(topic.topic_id):
                values = [topic.name, str(part.partition)]
                hw.add_metric(values, part.high_watermark)
                start.add_metric(values, part.log_start_offset)
                intake.add_metric(values, part.intake_bytes)
                chunks.add_metric(values, part.intake_chunks)
                state = progress.get((topic.topic_id, part.partition))
                if state is None or not state.enabled:
                    continue
                archived.add_metric(values, state.archived_offset)
                lag_records.add_metric(values, state.lag_records)
                lag_bytes.add_metric(values, state.lag_bytes)
                lag_seconds.add_metric(values, state.lag_seconds)
                if state.last_commit_ms >= 0:
                    last_commit.add_metric(values, state.last_commit_ms / 1000)
                failing.add_metric(values, 1 if state.last_error else 0)
        yield from (hw, start, intake, chunks, archived, lag_records, lag_bytes, lag_seconds, last_commit, failing)

    def _groups(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "icelog_consumer_group_lag_records", "High watermark less the group's committed offset, per partition "
            "the group committed.", labels=["group", "topic", "partition"],
        )
        high = {}
        for topic in self.store.list_topics():
            for part in self.store.partitions(topic.topic_id):
                high[(topic.name, part.partition)] = part.high_watermark
        for group in self.store.offset_groups():
            for (topic_name, partition), committed in self.store.committed_offsets(group).items():
                end = high.get((topic_name, partition))
                if end is not None and committed.offset >= 0:
                    lag.add_metric([group, topic_name, str(partition)], max(end - committed.offset, 0))
        yield lag

    def _tables(self) -> Iterator[Metric]:
        labels = ["table"]
        commits = SummaryMetricFamily(
            "icelog_table_archive_commit_seconds", "The archiver's passes that committed records to the table: their "
            "count (_count) and the seconds they took (_sum).", labels=labels,
        )
        records = CounterMetricFamily("icelog_table_archived_records", "Records the archiver committed to the table.",
                                      labels=labels)
        failures = CounterMetricFamily("icelog_table_archive_failures", "The archiver's passes over the table that "
                                       "failed.", labels=labels)
        dead = GaugeMetricFamily("icelog_table_dead_letter_batches", "Batches in the table's dead-letter table "
                                 "(`<table>__dlq`): records that could not be decoded.", labels=labels)
        data_files = GaugeMetricFamily("icelog_table_data_files", "Data files of the table's current snapshot.",
                                       labels=labels)
        delete_files = GaugeMetricFamily("icelog_table_delete_files", "Delete files (deletion vectors) of the "
                                         "table's current snapshot.", labels=labels)
        data_bytes = GaugeMetricFamily("icelog_table_data_bytes", "Bytes of the table's current data files.",
                                       labels=labels)
        snapshots = GaugeMetricFamily("icelog_table_snapshots", "Snapshots the table's metadata keeps.", labels=labels)
        rows = GaugeMetricFamily("icelog_table_records", "Live rows of the table's current snapshot.", labels=labels)
        maintained = GaugeMetricFamily("icelog_table_last_maintenance_timestamp_seconds", "When the table's last "
                                       "maintenance round ended (Unix time).", labels=labels)
        maintenance_seconds = GaugeMetricFamily("icelog_table_last_maintenance_duration_seconds", "How long the "
                                                "table's last maintenance round took.", labels=labels)
        result = GaugeMetricFamily("icelog_table_last_maintenance_result", "1 for the outcome of the table's last "
                                   "maintenance round, 0 for the others.", labels=["table", "outcome"])
        passes = read_pass_stats(self.settings.data_dir)
        maintenance = self.store.maintenance_records()
        dead_by_table: dict[str, int] = {}
        states = {(s.topic_id, s.partition): s for s in self.store.archive_states()}
        for topic in self.store.list_topics():
            config = archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)
            if not config.enabled:
                continue
            key = table_key(config.namespace, config.table)
            dead_by_table[key] = dead_by_table.get(key, 0) + sum(
                s.dead_letters for (topic_id, _), s in states.items() if topic_id == topic.topic_id
            )
            counted = passes.get(key)
            if counted is not None:
                commits.add_metric([key], count_value=counted.commits, sum_value=counted.commit_seconds)
                records.add_metric([key], counted.records)
                failures.add_metric([key], counted.failures)
            try:
                stats = self.tables.stats(config.namespace, config.table)
            except Exception as exc:  # the catalog is unreachable: /readyz says so; the rest still scrapes
                log.debug("metrics: cannot read table %s: %s", key, exc)
                stats = None
            if stats is not None:
                data_files.add_metric([key], stats.data_files)
                delete_files.add_metric([key], stats.delete_files)
                data_bytes.add_metric([key], stats.data_bytes)
                snapshots.add_metric([key], stats.snapshots)
                rows.add_metric([key], stats.records)
            last = maintenance.get(key)
            if last is not None:
                maintained.add_metric([key], last.finished_ms / 1000)
                maintenance_seconds.add_metric([key], last.duration_ms / 1000)
                for outcome in MAINTENANCE_OUTCOMES:
                    result.add_metric([key, outcome], 1 if last.outcome == outcome else 0)
        for key, count in dead_by_table.items():
            dead.add_metric([key], count)
        yield from (commits, records, failures, dead, data_files, delete_files, data_bytes, snapshots, rows,
                    maintained, maintenance_seconds, result)
        yield CounterMetricFamily("icelog_archiver_restarts", "Times the broker restarted its archiver process.",
                                  value=self.archiver_restarts())

    def _pressure(self) -> Iterator[Metric]:
        unarchived = GaugeMetricFamily("icelog_backpressure_unarchived_bytes", "An archived topic's intake bytes not "
                                       "yet archived, as back-pressure counts them.", labels=["topic"])
        bound = GaugeMetricFamily("icelog_backpressure_max_lag_bytes", "icelog.archive.max.lag.bytes: produce is "
                                  "slowed from 0.8 of it and refused at it.", labels=["topic"])
        state = GaugeMetricFamily("icelog_backpressure_state", "Produce to the topic: 0 admitted, 1 slowed "
                                  "(throttle_time_ms), 2 refused (archive lag or disk space).", labels=["topic"])
        refused_space = 1 if self.logs.space_refusal is not None else 0
        for topic in list(self.logs.topics.values()):
            level = 2 if refused_space else 0
            if topic.max_lag_bytes is not None:
                unarchived.add_metric([topic.name], topic.unarchived_bytes)
                bound.add_metric([topic.name], topic.max_lag_bytes)
                if topic.unarchived_bytes >= topic.max_lag_bytes:
                    level = 2
                elif topic.unarchived_bytes >= 0.8 * topic.max_lag_bytes:
                    level = max(level, 1)
            state.add_metric([topic.name], level)
        yield from (unarchived, bound, state)
        free = self.logs.free_estimate()
        if free is not None:
            yield GaugeMetricFamily("icelog_data_dir_free_bytes", "Free bytes of the data directory (the last reading "
                                    "less intake written since).", value=free)
        yield GaugeMetricFamily("icelog_data_dir_min_free_bytes", "intake.min_free_bytes: produce is refused below it.",
                                value=self.settings.intake.min_free_bytes)
        yield GaugeMetricFamily("icelog_produce_refused_for_space", "1 while produce is refused because the data "
                                "directory is short of space.", value=refused_space)

    def _readback(self) -> Iterator[Metric]:
        cache = self.readback.cache
        yield CounterMetricFamily("icelog_readback_cache_hits", "Read-back look-ups served from the cache of built "
                                  "batches.", value=cache.hits)
        yield CounterMetricFamily("icelog_readback_cache_misses", "Read-back look-ups that had to read table files.",
                                  value=cache.misses)
        yield GaugeMetricFamily("icelog_readback_cache_bytes", "Bytes of built batches the read-back cache holds.",
                                value=cache.size_bytes)
