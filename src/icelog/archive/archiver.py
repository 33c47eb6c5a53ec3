"""The archive job: intake → Iceberg, exactly once, one Spark append per table per pass.

A pass, per archived topic:
  1. reconcile: read the offsets the table contains from its snapshot summary (the truth) and copy
     them to the metadata store (which drives retention and `icelog status`);
  2. plan the archives that are due from the intake index (plan.py);
  3. decode the archives in Spark's Python workers (one data file per archive; a task decodes several
     partitions' archives in turn, as few tasks as the master has slots: plan.task_groups) and append them
     with DataFrameWriterV2, the snapshot summary carrying the full next-offset map;
  4. record the new offsets in the metadata store.
A crash after 3's files are written but before its commit leaves unreferenced files and no snapshot;
a crash after the commit but before 4 leaves the store behind the table. Either way the next pass starts
from the table's summary, so it writes no duplicate and leaves no gap.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from icelog.archive.dead_letter import dead_letter_counts, dlq_table_name, write_dead_letters
from icelog.archive.decode import ArchiveDecoder, DeadLetter, find_dead_letters, find_failing_batch
from icelog.archive.intake_source import ChunkSource, KafkaFetch, chunk_source
from icelog.archive.locks import WriterTurns
from icelog.archive.pass_stats import PassStats
from icelog.archive.plan import PlannedArchive, next_due_ms, plan_partition, task_groups
from icelog.archive.reconcile import (
    COMMIT_USER,
    COMMIT_USER_PROPERTY,
    OFFSETS_PROPERTY,
    TOPIC_ID_PROPERTY,
    TableOffsets,
    encode_offsets,
    table_offsets,
)
from icelog.archive.table_schema import ArchiveSchema, MessageUndecided, TableSchemas
from icelog.archive.transactions import BrokerTransactions, TransactionTracker, TransactionView
from icelog.archive.upsert import PassRows, write_data_files, write_upserts
from icelog.client.properties import parse
from icelog.config import Settings
from icelog.errors import IcelogError, TableChangedError, TableMismatchError, first_line
from icelog.faults import armed, fault_point
from icelog.lake import iceberg_java, warehouse
from icelog.lake.jvm_errors import WorkerError, jvm_errors
from icelog.lake.warm_workers import RDD, WorkerKeeper
from icelog.log.backends import open_reader
from icelog.meta.registry import RegistryStore
from icelog.meta.store import (
    ArchiveLedger,
    IntakeChunk,
    IntakeReader,
    PartitionRecord,
    ProcessLocks,
    TopicReader,
    TopicRecord,
)
from icelog.table.config import (
    ARCHIVE_LAYOUT,
    ARCHIVE_TABLE,
    LAYOUT_RECORD,
    LAYOUT_TABLE,
    ArchiveTopicConfig,
    TableTopicConfig,
    archive_config,
    forwarded_properties,
    table_config,
    table_key,
)
from icelog.table.layout import (
    RECORD_SPEC,
    TableSpec,
    archive_table_ddl,
    layout_of_properties,
    quote_identifier,
    table_spec,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from icelog.schema.codec.sides import SideDecoder

log = logging.getLogger(__name__)

POLL_CHUNKS = 10_000  # intake chunks per partition one poll plans from (the rest wait for later passes)
CONFLICT_RETRIES_AT_ONCE = 10  # consecutive races lost (TableChangedError) retried at the next poll, then backoff
# Times a pass sets batches aside for the dead-letter table and writes again before it gives up (retried later).
DEAD_LETTER_ROUNDS = 8
RETRY_BACKOFF_FIRST_MS = 1000  # first wait after a topic fails; doubles per failure up to retry_backoff_max_ms
RECONCILE_EVERY_MS = 60_000  # re-read a table's offsets at least this often even when nothing is due

# The table property listing the properties a topic's configs forwarded (so a config deleted later is removed).
FORWARDED_PROPERTY = "icelog.forwarded-properties"
# Properties Iceberg only takes when a table is created (ALTER cannot set them through UpdateProperties).
CREATION_ONLY_PROPERTIES = frozenset({"format-version"})


@dataclass
class TopicPassResult:
    """What one pass did for one topic."""

    topic: str
    archives: int = 0
    records: int = 0
    intake_bytes: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    error: str = ""
    skipped: str = ""  # why the topic was not attempted this pass (backoff, still running)
    dead_letters: int = 0  # batches this pass sent to the dead-letter table
    next_due_ms: int | None = None  # when an archive left open completes by time (None: none, or all were due)
    timings: dict[str, float] = field(default_factory=dict)  # where a pass that wrote spent its time (PASS_PARTS)


@dataclass(frozen=True)
class TopicBackoff:
    """A failing topic's retry schedule: its consecutive failures and when it may run again."""

    failures: int
    retry_at_ms: int
    error: str


class ArchiveStalledError(IcelogError):
    """A pass failed in a Spark worker for good and no stored batch explains it: the partitions it names wait for a
    fix (not retriable: the same pass fails again until something changes; retried with backoff all the same)."""


class ArchiverFencedError(IcelogError):
    """Another archiver committed to the table after this pass read it: this process no longer archives the store
    alone (its archiver lock's connection was cut: a PostgreSQL restart, a proxy's idle timeout) and the pass
    commits nothing. The continuous archiver exits (service.py); `icelog serve` starts it again, to stand by."""


class ForeignTableError(TableMismatchError):
    """The topic's table holds the archive of another topic (a deleted one of the same name, or a live one archived
    there): nothing is archived into it until a config or the table changes."""


# Where one pass's time goes (seconds, in TopicPassResult.timings and the "archived" log line):
#   wait      how old the pass's oldest record was when the pass planned it (the archive delays, the pass before)
#   plan      from the pass's start until its Spark job: store reads, planning, the table's schema and offsets
#   decode    the slowest task's decoding of its archives into Arrow rows (in a Spark worker)
#   write     that task's Parquet writing (and its read of the table's metadata)
#   job       the whole Spark job (decode and write of every task, and Spark's own cost of a job)
#   describe  the driver reading the new files' footers into Iceberg DataFiles
#   commit    loading the table and committing the snapshot: the records are visible in Iceberg from its end
#   record    the new offsets written to the metadata store
#   pass      plan + job + describe + commit + record: from the pass's start until it is done
PASS_PARTS = ("wait", "plan", "decode", "write", "job", "describe", "commit", "record", "pass")

StableOffsetHook = Callable[[TopicRecord, PartitionRecord], int]
# (topic, partition, table offset, log start): the table's next offset is below what the log still holds, so
# offsets in between will never be archived (a sink's source deleted them: sink/source_store.py reports it).
GapHook = Callable[[TopicRecord, int, int, int], None]


class ArchiverStore(TopicReader, IntakeReader, ArchiveLedger, ProcessLocks, Protocol):
    """What the archiver reads (topics, where their records lie) and records (archive progress, errors, dead
    letters, table columns), and the upsert tables' writer turns. The metadata store is one; a sink's view of
    its source cluster is another (sink/source_store.py)."""


class Archiver:
    """Runs archive passes with one SparkSession against one metadata store."""

    def __init__(
        self,
        settings: Settings,
        spark: SparkSession,
        store: ArchiverStore,
        stable_offset: StableOffsetHook | None = None,
        clock: Callable[[], float] = time.time,
        on_gap: GapHook | None = None,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.store = store
        self.transactions: TransactionView = (
            BrokerTransactions(settings.archive_bootstrap, parse(settings.archive.client_properties))
            if settings.archive_reads_via_kafka
            else TransactionTracker(open_reader(settings))
        )
        # Only committed records are archived: nothing at or past a partition's last stable offset.
        self.stable_offset = stable_offset or self.transactions.stable_offset
        self.clock = clock
        self.on_gap = on_gap
        self._tables_ready: set[tuple[str, str]] = set()
        self._layouts: dict[tuple[str, str], str] = {}  # an existing table's layout (its icelog.layout property)
        self._synced: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}  # forwarded properties last synced
        self._last_reconcile_ms: dict[uuid.UUID, int] = {}
        # Each table as this archiver last loaded it, kept between passes (it is the tables' one writer while it holds
        # the store's archiver lock): a pass refreshes it (one catalog query, and a read of its metadata file only if
        # it changed) where a load also resolves the name through Spark's catalog and re-reads the metadata file;
        # its reconcile, fence and append use it. Dropped by a pass that fails: the next one loads it afresh.
        self._loaded: dict[tuple[str, str], iceberg_java.JavaTable] = {}
        self.fenced = threading.Event()  # set by a pass that found another archiver's commit (ArchiverFencedError)
        # Topics with a Protobuf schema (registry subjects per icelog.schema.<side>): table_schema.py
        # The embedded registry's schemas: the store's, if it is a registry too (a sink's view is not).
        self.schemas = TableSchemas(settings, spark, store, store if isinstance(store, RegistryStore) else None)
        self._backoff: dict[uuid.UUID, TopicBackoff] = {}
        # Topics run on worker threads so that one that hangs cannot hold up the pass; threads are reused
        # (each keeps its py4j connection). A topic still running is in _in_flight and is not started again.
        self._workers = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="archive-topic")
        self._in_flight: dict[uuid.UUID, tuple[TopicRecord, concurrent.futures.Future[TopicPassResult]]] = {}
        # Spark's Python workers, kept alive between bursts (a new one makes a pass ~0.4 s slower): warm_workers.py
        self.python_workers = WorkerKeeper(spark, lambda: self.task_slots)
        self.pass_stats = PassStats(settings.data_dir)  # the broker's per-table metrics read it (pass_stats.py)

    @functools.cached_property
    def task_slots(self) -> int:
        """Spark tasks per archive job at most (plan.task_groups): the master's slots (local[N]: N). Asked of
        Spark when a job is first planned: a poll with nothing due never touches Spark."""
        return max(1, int(self.spark.sparkContext.defaultParallelism))

    # -- naming --------------------------------------------------------------------------------
    def table_name(self, config: ArchiveTopicConfig) -> str:
        return quote_identifier(self.settings.archive.catalog_name, config.namespace, config.table)

    def topic_config(self, topic: TopicRecord) -> ArchiveTopicConfig:
        return archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)

    # -- a pass --------------------------------------------------------------------------------
    def run_pass(self, force: bool = False, topics: Collection[str] | None = None) -> list[TopicPassResult]:
        """Archive what is due in every archived topic (or those named); failures are recorded, not raised.

        One topic's trouble never holds up another's: a topic that failed waits out its own backoff
        (exponential, capped at `archive.retry_backoff_max_ms`) while the others run every pass, and each
        topic runs on a worker thread that the pass waits for at most `archive.topic_wait_ms` (a hung
        registry or catalog call of one topic leaves that topic in flight, not the pass). With `force`
        (`icelog archive --once`, an explicit request) backoff is ignored and the pass waits for every topic.
        """
        results = []
        self.schemas.begin_pass()
        self._collect_finished()
        for topic in self.store.list_topics():
            config = self.topic_config(topic)
            if not config.enabled or (topics is not None and topic.name not in topics):
                continue
            now_ms = int(self.clock() * 1000)
            if topic.topic_id in self._in_flight:
                results.append(TopicPassResult(topic.name, skipped="still running from an earlier pass"))
                continue
            backoff = self._backoff.get(topic.topic_id)
            if backoff is not None and not force and now_ms < backoff.retry_at_ms:
                results.append(TopicPassResult(
                    topic.name, error=backoff.error, skipped=f"retry in {backoff.retry_at_ms - now_ms} ms"
                ))
                continue
            future = self._workers.submit(self._counted_pass, topic, config, force)
            timeout = None if force else self.settings.archive.topic_wait_ms / 1000
            try:
                result = future.result(timeout)
            except concurrent.futures.TimeoutError:
                # Still working (a big backlog, or a dependency that hangs until its own timeout): let it
                # run on; the next passes skip it and collect its outcome when it ends.
                log.warning("archiving %s takes longer than %d ms; other topics go on meanwhile",
                            topic.name, self.settings.archive.topic_wait_ms)
                self._in_flight[topic.topic_id] = (topic, future)
                results.append(TopicPassResult(topic.name, skipped="still running"))
                continue
            except Exception as exc:  # catalog/warehouse down, bad config: record, retry after backoff
                results.append(self._failed(topic, exc))
                continue
            self._backoff.pop(topic.topic_id, None)
            results.append(result)
        if not self._in_flight:  # (a topic still running keeps its worker busy; a ping would wait for it)
            self.python_workers.poll()
        return results

    def _counted_pass(self, topic: TopicRecord, config: ArchiveTopicConfig, force: bool) -> TopicPassResult:
        """archive_topic, its outcome added to the per-table counters the broker's metrics export."""
        started = time.monotonic()
        table = table_key(config.namespace, config.table)
        try:
            result = self.archive_topic(topic, config, force)
        except Exception:
            self.pass_stats.record(table, time.monotonic() - started, 0, committed=False, failed=True)
            raise
        self.pass_stats.record(table, time.monotonic() - started, result.records, committed=result.archives > 0,
                               failed=False)
        return result

    def _collect_finished(self) -> None:
        for topic_id, (topic, future) in list(self._in_flight.items()):
            if not future.done():
                continue
            del self._in_flight[topic_id]
            exc = future.exception()
            if exc is None:
                self._backoff.pop(topic_id, None)
            elif isinstance(exc, Exception):
                self._failed(topic, exc)

    def _failed(self, topic: TopicRecord, exc: Exception) -> TopicPassResult:
        """Record a topic's failure in the store and schedule its next attempt (exponential, capped)."""
        message = f"{type(exc).__name__}: {first_line(exc)}"
        now_ms = int(self.clock() * 1000)
        previous = self._backoff.get(topic.topic_id)
        failures = 1 if previous is None else previous.failures + 1
        delay_ms = min(RETRY_BACKOFF_FIRST_MS * 2 ** (failures - 1), self.settings.archive.retry_backoff_max_ms)
        if isinstance(exc, TableChangedError) and failures <= CONFLICT_RETRIES_AT_ONCE:
            # Another writer's commit won the race (an analyst's DELETE on a file this pass marks, a compaction
            # of one): nothing is wrong, the next poll redoes the pass from the new snapshot.
            delay_ms = 0
        self._backoff[topic.topic_id] = TopicBackoff(failures, now_ms + delay_ms, message)
        identifier = self.topic_config(topic).identifier
        self._tables_ready.discard(identifier)  # look again: it may have been dropped
        self._layouts.pop(identifier, None)
        self._synced.pop(identifier, None)
        self._loaded.pop(identifier, None)
        if delay_ms and isinstance(exc, IcelogError) and not exc.retriable:
            # Retried all the same (a fix of a config or of the table is noticed without a restart)
            log.error("archiving %s failed and needs a fix (intake kept; retry in %d ms): %s", topic.name, delay_ms,
                      message)
        elif delay_ms:
            log.warning("archiving %s failed (intake kept; retry in %d ms): %s", topic.name, delay_ms, message)
        else:
            log.info("archiving %s lost a commit race to another writer (intake kept; retried at the next poll): "
                     "%s", topic.name, message)
        try:
            self.store.record_archive_error(topic.topic_id, range(topic.partitions), message, now_ms)
        except Exception:
            log.exception("could not record the archive error of %s", topic.name)
        return TopicPassResult(topic.name, error=message)

    def close(self) -> None:
        """Stop starting topics; a topic still running is abandoned (its next run reconciles from the table)."""
        self._workers.shutdown(wait=False, cancel_futures=True)
        self.transactions.close()

    def ensure_table(
        self, config: ArchiveTopicConfig, properties: dict[str, str] | None = None, spec: TableSpec = RECORD_SPEC
    ) -> None:
        """Create the record layout's raw table (namespace, partition spec, sort order) unless it exists."""
        if config.identifier in self._tables_ready:
            return
        if not self.spark.catalog.tableExists(self.table_name(config)):
            for statement in archive_table_ddl(
                self.settings.archive.catalog_name, config.namespace, config.table, spec=spec, properties=properties
            ).statements:
                self.spark.sql(statement)
        self._tables_ready.add(config.identifier)

    def table_spec(self, topic: TopicRecord, config: ArchiveTopicConfig) -> TableSpec:
        """The topic's layout, partition spec and sort order; an existing table keeps the layout it was made with.

        (The broker refuses changing icelog.archive.layout, partition.by or bucket.key of a topic; a table can
        still meet another layout through broker defaults or icelog.archive.iceberg.table, and then wins.)
        """
        wanted = table_config(topic.configs, self.settings.topic_defaults)
        existing = self._layouts.get(config.identifier)
        if existing is None and self.spark.catalog.tableExists(self.table_name(config)):
            properties = iceberg_java.table_properties(iceberg_java.load_table(self.spark, self.table_name(config)))
            existing = self._layouts[config.identifier] = layout_of_properties(properties) or LAYOUT_RECORD
        if existing is not None and existing != wanted.layout:
            log.warning("%s: table %s has the %s layout; %s=%s is not applied to it", topic.name,
                        self.table_name(config), existing, ARCHIVE_LAYOUT, wanted.layout)
            wanted = TableTopicConfig(existing)
        return table_spec(wanted, topic.partitions)

    def sync_properties(self, topic: TopicRecord, config: ArchiveTopicConfig, spec: TableSpec) -> None:
        """Make the table's forwarded properties follow the topic's configs (iceberg.<p> → p, k → icelog.k).

        Checked when the configs changed since the last sync (or on the first pass of this process); a
        forwarded property whose config was deleted is removed, or set back to the layout's default.
        """
        desired = {k: v for k, v in forwarded_properties(topic.configs).items() if k not in CREATION_ONLY_PROPERTIES}
        marker = tuple(sorted(desired.items()))
        if self._synced.get(config.identifier) == marker:
            return
        table = iceberg_java.load_table(self.spark, self.table_name(config))
        current = iceberg_java.table_properties(table)
        changes = {k: v for k, v in desired.items() if current.get(k) != v}
        removals = []
        for key in (k for k in current.get(FORWARDED_PROPERTY, "").split(",") if k and k not in desired):
            if key in spec.properties:
                if current.get(key) != spec.properties[key]:
                    changes[key] = spec.properties[key]
            elif key in current:
                removals.append(key)
        listed = ",".join(sorted(desired))
        if current.get(FORWARDED_PROPERTY, "") != listed:
            changes[FORWARDED_PROPERTY] = listed
        if changes or removals:
            iceberg_java.set_table_properties(table, changes, removals)
            log.info("table %s: properties set %s, removed %s", self.table_name(config), sorted(changes), removals)
        self._synced[config.identifier] = marker

    def reconcile(self, topic: TopicRecord, config: ArchiveTopicConfig) -> TableOffsets:
        """The table's offsets, copied into the metadata store."""
        table = iceberg_java.refreshed(self.spark, self.table_name(config), self._loaded.get(config.identifier))
        self._loaded[config.identifier] = table
        found = table_offsets(self.spark, self.table_name(config), table=table)
        if found.topic_id is not None and found.topic_id != str(topic.topic_id):
            # Another topic's table (a deleted topic of the same name, or a live topic archived there): its offsets
            # say nothing about this topic.
            owner = next((t.name for t in self.store.list_topics() if str(t.topic_id) == found.topic_id), None)
            whose = (f"topic {owner!r}, which archives there" if owner is not None
                     else f"a deleted topic (perhaps an older {topic.name!r})")
            raise ForeignTableError(
                f"table {self.table_name(config)} holds the archive of {whose} (id {found.topic_id}), not of "
                f"{topic.name!r} (id {topic.topic_id}); set {ARCHIVE_TABLE} for {topic.name!r} to another table, "
                "or drop or rename this one if its topic is gone"
            )
        if found.offsets:
            self.store.record_archive(topic.topic_id, found.offsets, found.committed_ms)
        return found

    @jvm_errors()  # what Spark and the JVM raise in a topic's pass is seen as icelog's errors (lake/jvm_errors.py)
    def archive_topic(
        self, topic: TopicRecord, config: ArchiveTopicConfig, force: bool = False
    ) -> TopicPassResult:
        """One topic's pass. Its result says when an archive it left open completes by time, so that a continuous
        archiver wakes for it (service.py) rather than at its next poll: one that completes during the pass is
        written by the next one at once. (One already due when planned but left open, e.g. behind an open
        transaction, is not counted: it waits a poll.)"""
        planned_ms = int(self.clock() * 1000)
        started = time.perf_counter()
        try:
            result, chunks_by_partition = self._archive_topic(topic, config, force, planned_ms)
        except BaseException:
            self._loaded.pop(config.identifier, None)  # whatever state it is in, the next pass loads the table
            raise
        if result.timings:
            result.timings["pass"] = time.perf_counter() - started
        dues = [due for partition, chunks in chunks_by_partition.items()
                if (due := next_due_ms(chunks, result.offsets.get(partition, 0), config)) is not None
                and due > planned_ms]
        result.next_due_ms = min(dues, default=None)
        return result

    def _archive_topic(
        self, topic: TopicRecord, config: ArchiveTopicConfig, force: bool, now_ms: int
    ) -> tuple[TopicPassResult, dict[int, list[IntakeChunk]]]:
        started = time.perf_counter()
        partitions = self.store.partitions(topic.topic_id)
        # Cheap look first, from the store's copy of the offsets: touch the catalog only when some
        # archive is due (or now and then, to notice a table changed behind our back).
        known = {s.partition: s.archived_offset for s in self.store.archive_states(topic.topic_id)}
        # Only chunks past what is archived, and a bounded number: a poll costs the same whatever the
        # intake holds (a backlog is taken POLL_CHUNKS at a time, pass after pass).
        chunks_by_partition: dict[int, list[IntakeChunk]] = {
            p.partition: self.store.intake_chunks_after(
                topic.topic_id, p.partition, max(known.get(p.partition, 0), p.log_start_offset), POLL_CHUNKS
            )
            for p in partitions
        }
        self.transactions.refresh(topic, chunks_by_partition)
        last_look = self._last_reconcile_ms.get(topic.topic_id, -1)
        due = self._plan(topic, config, partitions, chunks_by_partition, known, now_ms, force)
        if not due and 0 <= now_ms - last_look < RECONCILE_EVERY_MS:
            return TopicPassResult(topic.name, offsets=known), chunks_by_partition
        # The latest registry schemas (None: raw record layout) decide the table's columns before anything is read.
        spec = self.table_spec(topic, config)
        properties = creation_properties(topic.configs)
        try:
            schema = self.schemas.resolve(topic, config, self.table_name(config), due, spec, properties)
        except MessageUndecided:  # nothing due, and no payload yet says which message the table holds
            self._last_reconcile_ms[topic.topic_id] = now_ms
            return TopicPassResult(topic.name, offsets=known), chunks_by_partition
        if schema is None:
            self.ensure_table(config, properties, spec)
        self.sync_properties(topic, config, spec)
        committed = self.reconcile(topic, config)
        self._last_reconcile_ms[topic.topic_id] = now_ms
        for part in partitions:  # the table is behind the store's copy: plan from the table's offsets
            table_offset = max(committed.offsets.get(part.partition, 0), part.log_start_offset)
            if table_offset < max(known.get(part.partition, 0), part.log_start_offset):
                chunks_by_partition[part.partition] = self.store.intake_chunks_after(
                    topic.topic_id, part.partition, table_offset, POLL_CHUNKS
                )
        if self.on_gap is not None:
            for part in partitions:
                table_offset = committed.offsets.get(part.partition, 0)
                if table_offset < part.log_start_offset:
                    self.on_gap(topic, part.partition, table_offset, part.log_start_offset)
        archives = self._plan(
            topic, config, partitions, chunks_by_partition, committed.offsets, now_ms, force
        )
        result = TopicPassResult(topic.name, offsets=dict(committed.offsets))
        if not archives:
            return result, chunks_by_partition
        new_offsets = dict(committed.offsets)
        for archive in archives:
            new_offsets[archive.partition] = max(new_offsets.get(archive.partition, 0), archive.end_offset)
        timings = {"wait": max(0, now_ms - min(a.chunks[0].ingest_ms for a in archives)) / 1000,
                   "plan": time.perf_counter() - started}
        with self._turn(config, spec) as mine:
            if not mine:  # an upsert table being compacted: its records wait in the intake for the next poll
                log.info("%s: the table is being compacted; archiving waits for it", topic.name)
                return result, chunks_by_partition
            result.dead_letters = self.write(topic, config, archives, new_offsets, schema, spec, timings,
                                             base=committed)
        fault_point("after-commit")
        recording = time.perf_counter()
        self.store.record_archive(topic.topic_id, new_offsets, int(self.clock() * 1000))
        timings["record"] = time.perf_counter() - recording
        result.timings = timings
        result.archives = len(archives)
        result.records = sum(a.record_count for a in archives)
        result.intake_bytes = sum(a.intake_bytes for a in archives)
        result.offsets = new_offsets
        log.info(
            "archived %s: %d records in %d archive(s) (%s); next offsets %s; seconds %s",
            topic.name,
            result.records,
            len(archives),
            ",".join(sorted({a.reason for a in archives})),
            encode_offsets(new_offsets),
            " ".join(f"{part}={timings[part]:.3f}" for part in PASS_PARTS if part in timings and part != "pass"),
        )
        return result, chunks_by_partition

    @contextlib.contextmanager
    def _turn(self, config: ArchiveTopicConfig, spec: TableSpec) -> Iterator[bool]:
        """An upsert table's pass writes in its turn, not while maintenance compacts it (locks.WriterTurns)."""
        if not spec.primary_key:
            yield True
            return
        with WriterTurns(self.store, table_key(config.namespace, config.table)).writing() as mine:
            yield mine

    def _plan(
        self,
        topic: TopicRecord,
        config: ArchiveTopicConfig,
        partitions: list[PartitionRecord],
        chunks_by_partition: dict[int, list[IntakeChunk]],
        archived: dict[int, int],
        now_ms: int,
        force: bool,
    ) -> list[PlannedArchive]:
        """The archives due now. Once one is, every partition's open archive is taken along (reason "coalesced"):
        a pass costs the same fixed time however many partitions it writes (the Spark job's own cost, the commit),
        so partitions whose archives come due at staggered times share one pass instead of each paying for its
        own, a few hundred milliseconds apart (measured at 5 MB/s over 4 partitions: 69 passes in 30 s, each
        taking part of the partitions; 48 with coalescing, at the same freshness)."""
        inputs = [(chunks_by_partition.get(part.partition, []),
                   max(archived.get(part.partition, 0), part.log_start_offset), self.stable_offset(topic, part))
                  for part in partitions]

        def planned(coalesce: bool) -> list[PlannedArchive]:
            return [archive for chunks, start, stable in inputs
                    for archive in plan_partition(chunks, start, stable, config, now_ms, force, coalesce)]

        archives = planned(coalesce=False)
        if archives and not force:
            archives = planned(coalesce=True)
        for i, archive in enumerate(archives):
            aborted = self.transactions.aborted(topic.topic_id, archive.partition, archive.start_offset,
                                                archive.end_offset)
            if aborted:
                ranges = tuple((r.producer_id, r.first_offset, r.last_offset) for r in aborted)
                archives[i] = dataclasses.replace(archive, aborted=ranges)
        return archives

    def fence(self, config: ArchiveTopicConfig, base: TableOffsets | None) -> None:
        """Right before a commit: ArchiverFencedError if the table no longer holds `base`, the offsets its pass
        planned from, i.e. another archiver committed since (Iceberg would re-apply this append on top of it, and
        the rows both wrote would be there twice). The store's archiver lock lets one archiver run; this catches
        the one that lost the lock without knowing. (A commit in the milliseconds between this look and the
        commit is not caught.) Others' commits carry no offsets (compaction, DELETE) and change nothing here."""
        if base is None or base.source == "data":  # (no map to compare: the offsets were derived from the rows)
            return
        table = self._loaded.get(config.identifier)
        if table is not None:
            # The table the pass read, refreshed from the catalog: still at the snapshot the pass planned from, no one
            # committed since (the common case: a catalog query, no metadata file read, no summary walk).
            with jvm_errors():  # (the catalog down: a retriable error of the pass, one line in the log)
                table.operations().refresh()
            current = table.currentSnapshot()
            if base.snapshot_id is not None and current is not None and int(current.snapshotId()) == base.snapshot_id:
                return
        now = table_offsets(self.spark, self.table_name(config), table=table)
        if now.source != "data" and now.offsets != base.offsets:
            self.fenced.set()
            raise ArchiverFencedError(
                f"table {self.table_name(config)} moved to offsets {encode_offsets(now.offsets)} after this pass "
                f"planned from {encode_offsets(base.offsets)}: another archiver commits there, so this one no longer "
                "holds the store's archiver lock; nothing committed"
            )

    def write(
        self,
        topic: TopicRecord,
        config: ArchiveTopicConfig,
        archives: list[PlannedArchive],
        new_offsets: dict[int, int],
        schema: ArchiveSchema | None = None,
        spec: TableSpec = RECORD_SPEC,
        timings: dict[str, float] | None = None,
        base: TableOffsets | None = None,
    ) -> int:
        """Decode the archives in Spark workers (plan.task_groups) and append them in one commit (if the table still
        holds `base`, the offsets the pass planned from: `fence`).

        A worker that fails for good (a WorkerError that is not retriable) has met a batch it cannot turn into
        rows: the driver finds such batches (`find_dead_letters`: the batch checks; else `find_failing_batch`:
        the pass's own decoder run here, bisecting to the batch it fails on), commits them to the dead-letter
        table `<table>__dlq` first (idempotent by offset) and appends the archives again without them, their
        offsets counted as archived; up to DEAD_LETTER_ROUNDS times. A failure no batch explains stops the pass
        with an ArchiveStalledError naming the partitions and offsets. Returns the dead letters written.
        (A worker that failed for a retriable error, the schema registry unavailable, fails the pass: retried.)
        `timings` gets the parts of PASS_PARTS an append pass measures (decode to commit).
        """
        written = 0
        for _ in range(DEAD_LETTER_ROUNDS):
            try:
                with jvm_errors():
                    self._append(topic, config, archives, new_offsets, schema, spec, timings, base)
                break
            except WorkerError as exc:
                if exc.retriable:
                    raise
                found = self._dead_letters(topic, archives, schema, exc)
            dlq = dlq_table_name(self.settings.archive.catalog_name, config.namespace, config.table)
            letters = [letter for batch in found.values() for letter in batch]
            written += write_dead_letters(self.spark, dlq, letters)  # 0 if a crashed pass kept them already
            fault_point("after-dead-letters")
            archives = [
                dataclasses.replace(a, dead_letters=a.dead_letters + tuple(d.base_offset for d in found.get(i, [])))
                for i, a in enumerate(archives)
            ]
            self.store.record_dead_letters(topic.topic_id, dead_letter_counts(self.spark, dlq))
        else:
            with jvm_errors():
                self._append(topic, config, archives, new_offsets, schema, spec, timings, base)
        return written

    def _dead_letters(
        self, topic: TopicRecord, archives: list[PlannedArchive], schema: ArchiveSchema | None, exc: WorkerError
    ) -> dict[int, list[DeadLetter]]:
        """The batches a pass that failed in a worker with `exc` must set aside, by archive index; raises
        ArchiveStalledError if none explains the failure."""
        source = chunk_source(self.settings, topic.name)
        found = {i: letters for i, a in enumerate(archives) if (letters := find_dead_letters(source, a))}
        if found:
            return found
        decode = self._decoder(schema, source)
        for i, archive in enumerate(archives):
            letter = find_failing_batch(source, archive, decode)
            if letter is not None:
                found[i] = [letter]
        if found:
            return found
        spans = ", ".join(f"partition {a.partition} offsets {a.start_offset}-{a.end_offset - 1}" for a in archives)
        raise ArchiveStalledError(
            f"{topic.name}: writing {spans} failed in a Spark worker and no record explains it (each archive "
            f"decodes in the driver): {exc}. The intake is kept and the pass is retried with backoff; fix the "
            "cause (the worker's environment, the table's properties) — `icelog status` shows this error until "
            "a pass succeeds"
        ) from exc

    def _decoder(self, schema: ArchiveSchema | None, intake_dir: str | Path | ChunkSource) -> ArchiveDecoder:
        """The pass's decoder of one archive into Arrow batches of the table's rows (picklable into tasks)."""
        if schema is not None and schema.layout == LAYOUT_TABLE:
            key, value, arrow = schema.key, schema.value, schema.arrow_schema()
            decoders: dict[str, SideDecoder] = {}

            def decode_table(archive: PlannedArchive) -> Iterator[pa.RecordBatch]:
                from icelog.archive.decode_table import decode_archive_table

                yield from decode_archive_table(intake_dir, archive, key, value, arrow, decoders)

            return decode_table
        if schema is not None:
            key, value, arrow = schema.key, schema.value, schema.arrow_schema()
            side_decoders: dict[str, SideDecoder] = {}

            def decode_schema(archive: PlannedArchive) -> Iterator[pa.RecordBatch]:
                from icelog.archive.decode_schema import decode_archive_schema

                yield from decode_archive_schema(intake_dir, archive, key, value, arrow, side_decoders)

            return decode_schema

        def decode_raw(archive: PlannedArchive) -> Iterator[pa.RecordBatch]:
            from icelog.archive.decode import decode_archive

            yield from decode_archive(intake_dir, archive)

        return decode_raw

    def _append(
        self,
        topic: TopicRecord,
        config: ArchiveTopicConfig,
        archives: list[PlannedArchive],
        new_offsets: dict[int, int],
        schema: ArchiveSchema | None,
        spec: TableSpec = RECORD_SPEC,
        timings: dict[str, float] | None = None,
        base: TableOffsets | None = None,
    ) -> None:
        intake_dir = chunk_source(self.settings, topic.name)  # pickled into the tasks: no secret in the conf
        if isinstance(intake_dir, KafkaFetch):
            intake_dir.check()
        groups = [[archives[i] for i in group] for group in task_groups(archives, self.task_slots)]
        decode_one = self._decoder(schema, intake_dir)

        # Each task maps the task numbers it is given to the Arrow batches of its groups' archives' rows, in turn.
        def decode(tasks: Iterable[int]) -> Iterator[pa.RecordBatch]:
            for task in tasks:
                for archive in groups[task]:
                    yield from decode_one(archive)

        summary = {
            OFFSETS_PROPERTY: encode_offsets(new_offsets),
            TOPIC_ID_PROPERTY: str(topic.topic_id),
            COMMIT_USER_PROPERTY: COMMIT_USER,
        }
        rows = PassRows(len(groups), decode, warehouse.io_properties(self.settings),
                        key_decoded=schema is not None and schema.key is not None)
        if spec.primary_key:  # an upsert table: data files + deletion vectors in one row delta
            write_upserts(self.spark, self.table_name(config), rows, spec, summary, str(self.settings.data_dir),
                          fault_point, before_commit=lambda: self.fence(config, base))
            self.python_workers.used(RDD)
            return
        # The workers write the data files themselves (lake/data_files.py: pyarrow's Parquet writer, the table's
        # field ids, spec and write.* properties), so the rows never become JVM rows; the driver describes the
        # files from their footers and appends them in one snapshot. Each task holds whole archives in partition
        # and offset order: a file holds one partition's rows in offset order, as the table's sort order says.
        clock = time.perf_counter()
        table = self._loaded.get(config.identifier)
        if table is None:
            table = self._loaded[config.identifier] = iceberg_java.load_table(self.spark, self.table_name(config))
        loaded = time.perf_counter()
        written = write_data_files(self.spark, table, rows)
        job_done = time.perf_counter()
        files = iceberg_java.parquet_data_files(self.spark, table, written)
        described = time.perf_counter()
        self.fence(config, base)
        if armed("after-write"):
            # Stage the snapshot (files written, snapshot not current) and die before publishing it.
            iceberg_java.commit_append(table, files, summary, stage_only=True)
            fault_point("after-write")
        iceberg_java.commit_append(table, files, summary)
        self.python_workers.used(RDD)
        if timings is not None:
            tasks: dict[int, tuple[float, float]] = {}
            for file in written:
                decode_s, write_s = tasks.get(file.task, (0.0, 0.0))
                tasks[file.task] = (decode_s + file.decode_s, write_s + file.write_s)
            slowest = max(tasks.values(), key=sum, default=(0.0, 0.0))
            timings.update(decode=slowest[0], write=slowest[1], job=job_done - loaded, describe=described - job_done,
                           commit=time.perf_counter() - described + loaded - clock)


def creation_properties(configs: dict[str, str]) -> dict[str, str]:
    """The forwarded properties a new table is created with, and the list of them (FORWARDED_PROPERTY)."""
    forwarded = forwarded_properties(configs)
    listed = ",".join(sorted(k for k in forwarded if k not in CREATION_ONLY_PROPERTIES))
    return {**forwarded, FORWARDED_PROPERTY: listed}
