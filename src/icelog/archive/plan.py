"""Planning archives: which committed offsets of which partitions become data files now.

An archive holds committed records of one topic-partition and becomes one data file. An archive is
completed (and so written) when any of Bufstream's limits is reached:
  - icelog.archive.max.bytes: it holds this many intake bytes (a full archive is written at once);
  - icelog.archive.complete.delay.max.ms: its oldest record was ingested this long ago;
  - icelog.archive.idle.max.ms: no record has arrived for this long.
Pure functions of (intake index, archived offsets, now): the archive job and the tests share them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from icelog.meta.store import IntakeChunk
from icelog.table.config import ArchiveTopicConfig


@dataclass(frozen=True)
class ChunkRef:
    """Where some of an archive's record batches are: a run of bytes in one intake file."""

    file_id: int
    position: int
    length: int
    base_offset: int
    end_offset: int
    ingest_ms: int  # monotonic within the partition


@dataclass(frozen=True)
class PlannedArchive:
    """Offsets [start_offset, end_offset) of one partition, to be written as one data file."""

    topic_id: uuid.UUID
    partition: int
    start_offset: int
    end_offset: int
    chunks: tuple[ChunkRef, ...]
    reason: str  # max.bytes | complete.delay | idle | forced | coalesced
    # (producer id, first offset, abort marker offset) of aborted transactions: their records are dropped
    aborted: tuple[tuple[int, int, int], ...] = ()
    # Base offsets of stored batches that cannot be decoded: written to the dead-letter table, not the archive
    dead_letters: tuple[int, ...] = ()

    @property
    def intake_bytes(self) -> int:
        return sum(chunk.length for chunk in self.chunks)

    @property
    def record_count(self) -> int:
        return self.end_offset - self.start_offset


def monotonic_ingest_times(chunks: Sequence[IntakeChunk]) -> list[int]:
    """Each chunk's ingest time (ms), made non-decreasing in offset order (clocks can step back)."""
    out: list[int] = []
    latest = -1
    for chunk in chunks:
        ingest = chunk.ingest_timestamp if chunk.ingest_timestamp >= 0 else max(chunk.max_timestamp, 0)
        latest = max(latest, ingest)
        out.append(latest)
    return out


def plan_partition(
    chunks: Sequence[IntakeChunk],
    archived_offset: int,
    stable_offset: int,
    config: ArchiveTopicConfig,
    now_ms: int,
    force: bool = False,
    coalesce: bool = False,
) -> list[PlannedArchive]:
    """The archives of one partition that are due now, in offset order and contiguous from archived_offset.

    `chunks` are the partition's indexed intake chunks in offset order; records at or past
    `stable_offset` (the last stable offset: undecided transactions) are never archived. With `force`,
    everything committed is archived (still cut at max.bytes), as `icelog archive --once` does; with `coalesce`
    likewise, as reason "coalesced" (a pass that runs for another partition's due archive takes this one's open
    archive along: archiver.Archiver._plan).
    """
    ingest = monotonic_ingest_times(chunks)
    pending: list[ChunkRef] = []
    for chunk, ingest_ms in zip(chunks, ingest, strict=True):
        if chunk.end_offset <= archived_offset:
            continue
        if chunk.base_offset >= stable_offset:
            break
        if pending and chunk.base_offset != pending[-1].end_offset:
            break  # a hole in the index (should not happen): never archive past it
        if not pending and chunk.base_offset > archived_offset:
            # Offsets below this chunk are gone from the intake (retention before archiving was on).
            archived_offset = chunk.base_offset
        pending.append(
            ChunkRef(
                chunk.file_id,
                chunk.position,
                chunk.length,
                chunk.base_offset,
                min(chunk.end_offset, stable_offset),
                ingest_ms,
            )
        )
    if not pending:
        return []
    topic_id = chunks[0].topic_id
    partition = chunks[0].partition
    groups: list[list[ChunkRef]] = [[]]
    size = 0
    for ref in pending:
        if groups[-1] and size + ref.length > config.max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(ref)
        size += ref.length
    archives: list[PlannedArchive] = []
    start = archived_offset
    for index, group in enumerate(groups):
        last = index == len(groups) - 1
        group_bytes = sum(ref.length for ref in group)
        reason = ""
        if not last or group_bytes >= config.max_bytes:
            reason = "max.bytes"
        elif now_ms - group[0].ingest_ms >= config.complete_delay_max_ms:
            reason = "complete.delay"
        elif now_ms - group[-1].ingest_ms >= config.idle_max_ms:
            reason = "idle"
        elif force:
            reason = "forced"
        elif coalesce:
            reason = "coalesced"
        if not reason:
            break
        end = group[-1].end_offset
        archives.append(PlannedArchive(topic_id, partition, start, end, tuple(group), reason))
        start = end
    return archives


def next_due_ms(
    chunks: Sequence[IntakeChunk], archived_offset: int, config: ArchiveTopicConfig
) -> int | None:
    """When the open archive of a partition completes by time (None: nothing pending)."""
    ingest = [
        t
        for c, t in zip(chunks, monotonic_ingest_times(chunks), strict=True)
        if c.end_offset > archived_offset
    ]
    if not ingest:
        return None
    return min(ingest[0] + config.complete_delay_max_ms, ingest[-1] + config.idle_max_ms)


def task_groups(archives: Sequence[PlannedArchive], slots: int) -> list[list[int]]:
    """The archives (indexes) each Spark task decodes and writes, in turn: as few tasks as the master has slots.

    Spark's fixed cost per Python task (~50 ms here, as much as decoding 20 k records) is paid per task, not per
    archive. A task never holds two archives of one partition, so each archive stays one data file (its rows
    are the task's only rows of that Kafka partition, which every table's partition spec separates): a catch-up
    pass with k archives of a partition runs at least k tasks. A task's archives are in partition order, so its
    rows stay clustered by Iceberg partition (the record layout's clustered writer needs it).
    """
    order = sorted(range(len(archives)), key=lambda i: (archives[i].partition, archives[i].start_offset))
    per_partition = Counter(archive.partition for archive in archives)
    tasks = max(min(max(1, slots), len(order)), max(per_partition.values(), default=0))
    groups: list[list[int]] = [[] for _ in range(tasks)]
    for n, i in enumerate(order):  # a partition's archives are consecutive here, and at most `tasks` many
        groups[n % tasks].append(i)
    return [group for group in groups if group]
