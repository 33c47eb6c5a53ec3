"""One maintenance round of one archive table, as Spark work with Iceberg's actions and procedures.

A round, in this order (each step is skipped when there is nothing for it to do):
  1. compaction (`RewriteDataFiles`, bin-pack strategy): per table partition (one Kafka partition and
     one ingest day), data files below `maintenance_small_file_bytes` are rewritten in file groups of at
     most `maintenance_group_bytes`, one read task and one output file per group, rows sorted locally by
     the table's sort order (`kafka.offset`: archive files are disjoint offset runs, so no range shuffle
     is needed), committed one by one (partial progress). A group of one file is left alone (fewer than
     `min-input-files`), so a lone file is never rewritten, and a compacted file (about a group's size)
     is not rewritten round after round with every newer file (automatic rounds run in a process and a
     Spark of their own, so a long rewrite task holds no slot an archive pass needs:
     archive/maintenance_schedule.py); files whose deletes (deletion vectors, position deletes) cover
     `maintenance_delete_ratio` of their rows are rewritten with the deletes applied. Appends that commit
     meanwhile are no conflict (Iceberg re-applies the smaller side, the append, on its retry); a rewrite
     that loses a real race (its files were deleted meanwhile) is reported as `lost_race` and retried next
     round, never as an error;
  2. snapshot expiry: snapshots older than `history.expire.max-snapshot-age-ms`, keeping
     `history.expire.min-snapshots-to-keep` (icelog's defaults where the table sets neither) and always
     the newest snapshot that records `icelog.archive.offsets` with every snapshot after it, so
     reconciliation never has to fall back to reading the data;
  3. orphan removal (`remove_orphan_files`): files under the table's location that no snapshot or
     metadata references and that are older than `maintenance_orphan_age_ms` (files of passes that died
     before their commit);
  4. manifest rewrite, when the current snapshot has more than `maintenance_max_manifests` manifests.
With `dry_run` nothing is committed or deleted: the result says what would be done.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icelog.archive.locks import LockHeldError, WriterTurns
from icelog.archive.reconcile import OFFSETS_PROPERTY
from icelog.config import ArchiveSettings
from icelog.errors import first_line
from icelog.lake.iceberg_java import (
    JavaTable,
    ancestry,
    as_dict,
    each,
    expire_snapshots,
    load_table,
    manifest_count,
    rewrite_data_files,
    rewrite_manifests,
    table_properties,
)
from icelog.lake.jvm_errors import jvm_errors
from icelog.table.layout import PRIMARY_KEY_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SORT_COLUMN = "kafka.offset"  # archive tables (their sort order)
DLQ_SORT_COLUMN = "base_offset"  # dead-letter tables `<table>__dlq` (no sort order: compaction sorts by it)
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class MaintenancePolicy:
    """The knobs of a round: `archive.maintenance_*` (ArchiveSettings holds the defaults)."""

    small_file_bytes: int
    group_bytes: int
    min_input_files: int
    delete_ratio: float
    snapshot_age_ms: int
    min_snapshots: int
    orphan_age_ms: int
    max_manifests: int

    @classmethod
    def from_settings(cls, archive: ArchiveSettings) -> MaintenancePolicy:
        return cls(
            small_file_bytes=archive.maintenance_small_file_bytes,
            group_bytes=archive.maintenance_group_bytes,
            min_input_files=archive.maintenance_min_input_files,
            delete_ratio=archive.maintenance_delete_ratio,
            snapshot_age_ms=archive.maintenance_snapshot_age_ms,
            min_snapshots=archive.maintenance_min_snapshots,
            orphan_age_ms=archive.maintenance_orphan_age_ms,
            max_manifests=archive.maintenance_max_manifests,
        )

    def rewrite_options(self) -> dict[str, str]:
        """RewriteDataFiles options (the target file size is the table's write.target-file-size-bytes)."""
        return {
            "min-file-size-bytes": str(self.small_file_bytes),
            "max-file-group-size-bytes": str(self.group_bytes),
            "min-input-files": str(self.min_input_files),
            "delete-ratio-threshold": str(self.delete_ratio),
            "partial-progress.enabled": "true",
            "partial-progress.max-commits": "10",
            # One group at a time: a round takes one core at most (at a low CPU priority).
            "max-concurrent-file-group-rewrites": "1",
            "remove-dangling-deletes": "true",
        }

    def expiry(self, properties: dict[str, str]) -> tuple[int, int]:
        """(max snapshot age ms, min snapshots to keep): the table's properties, else icelog's defaults."""
        return (
            int(properties.get(MAX_SNAPSHOT_AGE, self.snapshot_age_ms)),
            int(properties.get(MIN_SNAPSHOTS_TO_KEEP, self.min_snapshots)),
        )


@dataclass(frozen=True)
class TableState:
    """What a table's metadata says about its size (no data file is read)."""

    data_files: int = 0
    delete_files: int = 0
    bytes: int = 0
    records: int = 0
    snapshots: int = 0
    manifests: int = 0
    oldest_snapshot_ms: int = -1
    current_snapshot_ms: int = -1  # when the table last changed


@dataclass
class MaintenanceResult:
    """What one round did (or, with dry_run, would do) to one table."""

    table: str
    before: TableState
    after: TableState = field(default_factory=TableState)
    dry_run: bool = False
    compaction_candidates: int = 0  # dry run: small files in partitions that would be compacted
    rewritten_files: int = 0
    added_files: int = 0
    rewritten_bytes: int = 0
    removed_delete_files: int = 0
    lost_race: str = ""  # compaction groups or a manifest rewrite that failed to commit (retried next round)
    snapshots_expired: int = 0
    orphans_removed: int = 0
    orphans_checked: bool = False
    manifests_rewritten: int = 0
    duration_ms: int = 0

    @property
    def outcome(self) -> str:
        if self.lost_race:
            return "lost-race"
        changed = self.rewritten_files or self.snapshots_expired or self.orphans_removed or self.manifests_rewritten
        return "ok" if changed or self.dry_run else "nothing-to-do"

    def summary(self) -> str:
        """One line: files before → after, bytes, snapshots expired, orphans removed, manifests."""
        b, a = self.before, self.after
        if self.dry_run:
            return (
                f"would compact {self.compaction_candidates} small of {b.data_files} data files; "
                f"would expire {self.snapshots_expired} of {b.snapshots} snapshots; "
                f"would remove {self.orphans_removed} orphan files; "
                f"{b.manifests} manifests{' (would rewrite)' if self.manifests_rewritten else ''}"
            )
        text = (
            f"data files {b.data_files} -> {a.data_files} ({self.rewritten_files} rewritten into {self.added_files}), "
            f"bytes {b.bytes} -> {a.bytes}, delete files {b.delete_files} -> {a.delete_files}, "
            f"snapshots expired {self.snapshots_expired}, orphans removed {self.orphans_removed}, "
            f"manifests {b.manifests} -> {a.manifests}, {self.duration_ms} ms"
        )
        return text + (f"; lost a race, retried next round: {self.lost_race}" if self.lost_race else "")


def table_state(table: JavaTable) -> TableState:
    """Counts from the current snapshot's summary, the snapshot list and the manifest list."""
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return TableState()
    summary = as_dict(snapshot.summary())
    times = [int(s.timestampMillis()) for s in each(table.snapshots())]
    return TableState(
        data_files=int(summary.get("total-data-files", 0)),
        delete_files=int(summary.get("total-delete-files", 0)),
        bytes=int(summary.get("total-files-size", 0)),
        records=int(summary.get("total-records", 0)),
        snapshots=len(times),
        manifests=manifest_count(table),
        oldest_snapshot_ms=min(times),
        current_snapshot_ms=int(snapshot.timestampMillis()),
    )


def snapshots_to_offsets(table: JavaTable) -> int:
    """How many snapshots, from the current one back, reach the newest one recording the archive offsets.

    Expiry keeps at least these, so the offsets map always survives (0: no snapshot records it).
    """
    for hops, snapshot in enumerate(ancestry(table)):
        if snapshot.summary().get(OFFSETS_PROPERTY) is not None:
            return hops + 1
    return 0


def expirable(table: JavaTable, older_than_ms: int, retain_last: int) -> int:
    """Snapshots an expiry with these bounds removes (those older than the cutoff, but the retained ancestors)."""
    kept = {int(s.snapshotId()) for s in ancestry(table, retain_last)}
    return sum(
        1
        for s in each(table.snapshots())
        if int(s.timestampMillis()) < older_than_ms and int(s.snapshotId()) not in kept
    )


@jvm_errors()  # a failure is reported as icelog's error (lake/jvm_errors.py), with the Java exception's line
def maintain_table(
    spark: SparkSession,
    name: str,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    remove_orphans: bool = True,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.time,
    sort_column: str = SORT_COLUMN,
    turns: WriterTurns | None = None,
) -> MaintenanceResult:
    """One maintenance round of the Iceberg table `name` (a Spark identifier); see the module docstring.

    `sort_column`: the rows' order in compacted files (a dead-letter table: DLQ_SORT_COLUMN). `turns`: an
    upsert table's compaction and manifest rewrite keep its archive passes out while they run (WriterTurns).
    """
    say = progress or (lambda _step: None)
    started = time.monotonic()
    table = load_table(spark, name)
    result = MaintenanceResult(name, table_state(table), dry_run=dry_run)
    upsert = PRIMARY_KEY_PROPERTY in table_properties(table)

    say("compacting small files")
    if dry_run:
        result.compaction_candidates = compaction_candidates(spark, name, policy)
    elif result.before.data_files >= policy.min_input_files or result.before.delete_files:
        try:
            with _writers_out(table, turns if upsert else None):
                compact(spark, table, policy, result, sort_column, upsert)
        except LockHeldError as exc:  # the pass in flight did not end: the next round tries again
            result.lost_race = f"compaction: {exc}"

    say("expiring snapshots")
    table.refresh()
    max_age_ms, min_keep = policy.expiry(table_properties(table))
    retain = max(min_keep, snapshots_to_offsets(table))
    cutoff_ms = int(clock() * 1000) - max_age_ms
    due = expirable(table, cutoff_ms, retain)
    if dry_run or not due:
        result.snapshots_expired = due
    else:
        before = len(each(table.snapshots()))
        expire_snapshots(spark, table, cutoff_ms, retain)
        table.refresh()
        result.snapshots_expired = before - len(each(table.snapshots()))

    if remove_orphans:
        say("removing orphan files")
        result.orphans_removed = remove_orphan_files(
            spark, name, int(clock() * 1000) - policy.orphan_age_ms, dry_run
        )
        result.orphans_checked = True

    table.refresh()
    manifests = manifest_count(table)
    if manifests > policy.max_manifests:
        say(f"rewriting {manifests} manifests")
        if dry_run:
            result.manifests_rewritten = manifests
        else:
            try:
                with _writers_out(table, turns if upsert else None):
                    done = rewrite_manifests(spark, table)
            except Exception as exc:  # an archive commit landed meanwhile: the next round tries again
                note = f"manifest rewrite: {type(exc).__name__}: {first_line(exc)}"
                result.lost_race = f"{result.lost_race}; {note}" if result.lost_race else note
                log.info("manifest rewrite of %s did not commit (retried next round): %s", name, note)
            else:
                result.manifests_rewritten = len(each(done.rewrittenManifests()))
            table.refresh()
    result.after = result.before if dry_run else table_state(table)
    result.duration_ms = int((time.monotonic() - started) * 1000)
    return result


@contextlib.contextmanager
def _writers_out(table: JavaTable, turns: WriterTurns | None) -> Iterator[None]:
    """With `turns` (an upsert table: its passes rewrite DVs, which fail a concurrent rewrite), the writer kept out
    and the table re-read, so a rewrite plans from the snapshot the writer left; else nothing."""
    if turns is None:
        yield
        return
    with turns.compacting():
        table.refresh()
        yield


def compact(
    spark: SparkSession, table: JavaTable, policy: MaintenancePolicy, result: MaintenanceResult,
    sort_column: str = SORT_COLUMN,
    upsert: bool = False,
) -> None:
    """RewriteDataFiles (bin-pack, local sort); a lost commit race is noted in the result, not raised."""
    try:
        # Archive files are contiguous offset runs, each in offset order: a local sort per group is enough.
        # (A dead-letter table has no sort order: the sort strategy orders its few rows by `sort_column`.)
        options = policy.rewrite_options()
        if upsert:
            # Partial progress ignores a group whose commit fails (a DV added meanwhile, by a writer that does not
            # take turns): one commit, whose failure is seen and reported as a lost race.
            options["partial-progress.enabled"] = "false"
        done = rewrite_data_files(spark, table, options, sort_column, presorted=True)
    except Exception as exc:  # a conflict with a concurrent delete/rewrite: the next round tries again
        result.lost_race = f"compaction: {type(exc).__name__}: {first_line(exc)}"
        log.info("compaction of %s did not commit (retried next round): %s", result.table, result.lost_race)
        return
    result.rewritten_files = int(done.rewrittenDataFilesCount())
    result.added_files = int(done.addedDataFilesCount())
    result.rewritten_bytes = int(done.rewrittenBytesCount())
    result.removed_delete_files = int(done.removedDeleteFilesCount())
    failed = int(done.failedDataFilesCount())
    if failed:
        result.lost_race = f"compaction: {failed} data files in groups whose commit failed"
        log.info("compaction of %s: %s (retried next round)", result.table, result.lost_race)


def compaction_candidates(spark: SparkSession, name: str, policy: MaintenancePolicy) -> int:
    """Small data files in partitions that hold at least `min_input_files` of them (what a round compacts)."""
    row = spark.sql(
        f"SELECT coalesce(sum(n), 0) AS files FROM (SELECT partition, count(*) AS n FROM {name}.files "
        f"WHERE content = 0 AND file_size_in_bytes < {policy.small_file_bytes} GROUP BY partition "
        f"HAVING count(*) >= {policy.min_input_files})"
    ).collect()[0]
    return int(row.files)


def remove_orphan_files(spark: SparkSession, name: str, older_than_ms: int, dry_run: bool) -> int:
    """Orphan files under the table's location older than the cutoff, removed unless `dry_run`: how many."""
    catalog, _, ident = name.partition(".")
    literal = ident.replace("\\", "\\\\").replace("'", "\\'")
    cutoff = datetime.fromtimestamp(older_than_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    # (The session time zone is UTC: lake/spark.py.)
    rows = spark.sql(
        f"CALL {catalog}.system.remove_orphan_files(table => '{literal}', "
        f"older_than => TIMESTAMP '{cutoff}', dry_run => {str(dry_run).lower()})"
    ).collect()
    return len(rows)
