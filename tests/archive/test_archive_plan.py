"""The archive delays (Bufstream's meaning) and planning rules, on the pure planner."""

from __future__ import annotations

import uuid

from icelog.archive.archiver import TopicPassResult
from icelog.archive.plan import PlannedArchive, monotonic_ingest_times, next_due_ms, plan_partition, task_groups
from icelog.archive.service import until_due_s
from icelog.config import ArchiveSettings
from icelog.meta.store import IntakeChunk
from icelog.table.config import archive_config

TOPIC = uuid.uuid4()


def chunks(*specs: tuple[int, int, int, int]) -> list[IntakeChunk]:
    """(base, end, length, ingest_ms) per chunk, contiguous in one intake file."""
    out, position = [], 0
    for base, end, length, ingest in specs:
        out.append(IntakeChunk(TOPIC, 0, base, end, 1, position, length, ingest, ingest_timestamp=ingest))
        position += length
    return out


def config(**topic: str):
    settings = ArchiveSettings(max_bytes=1000, complete_delay_max_ms=2000, idle_max_ms=500)
    return archive_config("t", topic, {}, settings)


def test_max_bytes_cuts_full_archives_at_once() -> None:
    cs = chunks((0, 10, 400, 1000), (10, 20, 400, 1000), (20, 30, 400, 1000), (30, 40, 400, 1000))
    # At t=1000 neither delay has passed: only the full archive is due; the open one waits.
    plans = plan_partition(cs, 0, 40, config(), now_ms=1000)
    assert [(p.start_offset, p.end_offset, p.intake_bytes, p.reason) for p in plans] == [
        (0, 20, 800, "max.bytes")
    ]
    # Once the delay passes, the rest goes too; no archive is over max.bytes.
    plans = plan_partition(cs, 0, 40, config(), now_ms=3000)
    assert [(p.start_offset, p.end_offset, p.reason) for p in plans] == [
        (0, 20, "max.bytes"),
        (20, 40, "complete.delay"),
    ]
    assert all(p.intake_bytes <= 1000 for p in plans)


def test_a_chunk_larger_than_max_bytes_is_one_archive() -> None:
    plans = plan_partition(chunks((0, 5, 5000, 1000)), 0, 5, config(), now_ms=1000)
    assert [(p.start_offset, p.end_offset, p.reason) for p in plans] == [(0, 5, "max.bytes")]


def test_idle_max_completes_an_archive_when_no_data_arrives() -> None:
    cs = chunks((0, 10, 100, 1000))
    assert plan_partition(cs, 0, 10, config(), now_ms=1499) == []
    [plan] = plan_partition(cs, 0, 10, config(), now_ms=1500)
    assert (plan.start_offset, plan.end_offset, plan.reason) == (0, 10, "idle")


def test_complete_delay_max_bounds_an_archive_that_keeps_receiving_data() -> None:
    # Data every 400 ms (never idle for 500 ms): the archive completes 2000 ms after its first record.
    cs = chunks(*[(i * 10, i * 10 + 10, 50, 1000 + 400 * i) for i in range(6)])
    assert plan_partition(cs, 0, 60, config(), now_ms=2999) == []
    [plan] = plan_partition(cs, 0, 60, config(), now_ms=3000)
    assert (plan.start_offset, plan.end_offset, plan.reason) == (0, 60, "complete.delay")
    assert next_due_ms(cs, 0, config()) == 3000


def test_topic_configs_override_the_defaults() -> None:
    cs = chunks((0, 10, 100, 1000))
    slow = config(**{"icelog.archive.idle.max.ms": "60000", "icelog.archive.complete.delay.max.ms": "60000"})
    assert plan_partition(cs, 0, 10, slow, now_ms=30000) == []
    assert plan_partition(cs, 0, 10, slow, now_ms=30000, force=True)[0].reason == "forced"


def test_only_offsets_from_archived_to_the_stable_offset() -> None:
    cs = chunks((0, 10, 100, 1000), (10, 20, 100, 1000), (20, 30, 100, 1000))
    [plan] = plan_partition(cs, 15, 25, config(), now_ms=10_000)
    assert (plan.start_offset, plan.end_offset) == (15, 25)
    assert [c.base_offset for c in plan.chunks] == [10, 20]
    assert plan_partition(cs, 30, 30, config(), now_ms=10_000) == []


def test_ingest_times_are_made_monotonic() -> None:
    cs = chunks((0, 1, 10, 5000), (1, 2, 10, 4000), (2, 3, 10, 6000))
    assert monotonic_ingest_times(cs) == [5000, 5000, 6000]


def test_table_override_and_namespace() -> None:
    assert config().identifier == ("icelog", "t")
    assert config(**{"icelog.archive.iceberg.table": "analytics.orders"}).identifier == (
        "analytics",
        "orders",
    )
    assert not config(**{"icelog.archive.kind": "none"}).enabled


def test_task_groups_pack_partitions_into_few_tasks_and_never_two_archives_of_one_partition() -> None:
    def archive(partition: int, start: int) -> PlannedArchive:
        return PlannedArchive(TOPIC, partition, start, start + 10, (), "forced")

    # Steady state: one archive per partition, one task slot: one task, in partition order.
    steady = [archive(2, 0), archive(0, 0), archive(1, 0)]
    assert task_groups(steady, 1) == [[1, 2, 0]]
    assert task_groups(steady, 2) == [[1, 0], [2]]
    assert task_groups(steady, 8) == [[1], [2], [0]]
    # Catch-up: partition 0 has three archives; each lands in its own task (one data file each), in offset order.
    catch_up = [archive(0, 20), archive(1, 0), archive(0, 0), archive(0, 10)]
    groups = task_groups(catch_up, 1)
    assert len(groups) == 3 and sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    for group in groups:
        partitions = [catch_up[i].partition for i in group]
        assert partitions == sorted(partitions) and len(set(partitions)) == len(partitions)
    assert [i for g in groups for i in g if catch_up[i].partition == 0] == [2, 3, 0]
    assert task_groups([], 1) == []


def test_a_continuous_archiver_wakes_when_the_earliest_open_archive_is_due() -> None:
    def due(ms: int | None) -> TopicPassResult:
        return TopicPassResult("t", next_due_ms=ms)

    now = 10_000
    assert until_due_s([due(10_800), due(None), due(10_300)], now, 0.5) == 0.3  # the earliest, before the poll
    assert until_due_s([due(12_000)], now, 0.5) == 0.5  # later than the next poll: the poll
    assert until_due_s([due(9_000), due(None)], now, 0.5) == 0  # completed while the pass wrote: at once
    assert until_due_s([due(None)], now, 0.5) == until_due_s([], now, 0.5) == 0.5


def test_the_default_delays_keep_a_steady_stream_within_a_second() -> None:
    """At the defaults an archive of a steady stream is due half a second after its first record (a lone record
    a quarter second after it), and the archiver looks every quarter second: produce → Iceberg p50 ≤ 1 s at
    5 MB/s (archive_bench.py) needs the delay plus a pass under a second."""
    defaults = archive_config("t", {}, {}, ArchiveSettings())
    assert (defaults.complete_delay_max_ms, defaults.idle_max_ms) == (500, 250)
    assert ArchiveSettings().poll_interval_ms == 250
    steady = chunks(*((n * 10, n * 10 + 10, 100, 1000 + n * 100) for n in range(6)))  # a chunk every 100 ms
    assert plan_partition(steady, 0, 60, defaults, now_ms=1499) == []
    [plan] = plan_partition(steady, 0, 60, defaults, now_ms=1500)
    assert (plan.end_offset, plan.reason) == (60, "complete.delay")
    assert next_due_ms(chunks((0, 1, 100, 1000)), 0, defaults) == 1250  # a lone record: idle.max.ms
