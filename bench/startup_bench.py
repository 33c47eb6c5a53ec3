"""Start-up and archiver-poll cost against the size of the intake: 10 k vs 1 M intake chunks.

Run: .venv/bin/python bench/startup_bench.py [--small 10000] [--large 1000000] [--partitions 4]

For each size it builds a data directory the way the broker leaves it: intake files of real frames, each
holding one tiny idempotent batch (so replaying them is real work), indexed in the metadata store. The
index rows are written in large store transactions instead of one group commit per frame, which is the
only shortcut. Then it times the real code paths:
  - broker start-up (LogManager.open: intake recovery, each partition's hot tail of the index,
    producer-state rebuild), once with no producer-state snapshot (every chunk replayed, as before
    snapshots) and once with the snapshot a clean shutdown leaves;
  - one archiver poll (Archiver.archive_topic up to its plan, nothing due so no Spark), first and
    steady-state, next to what the old poll's `intake_chunks(topic)` query alone cost.
Timings are CPU seconds of this process (time.process_time): the machine the figures were taken on is
shared, so wall-clock time mostly measures the neighbours. Page cache is warm (the files were just
written): the replay figures are CPU, not disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.archive.archiver import Archiver
from icelog.config import IntakeSettings, Settings
from icelog.log import intake_file
from icelog.log.manager import LogManager
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import IntakeChunk, IntakeTail
from icelog.table.config import ARCHIVE_COMPLETE_DELAY_MAX_MS, ARCHIVE_IDLE_MAX_MS, ARCHIVE_MAX_BYTES

TOPIC = "bench"
SEGMENT_BYTES = 64 * 1024 * 1024
_CRC_FROM = 21  # a v2 batch's CRC covers the bytes from attributes on
_SEQUENCE_AT = 53  # baseSequence in a v2 batch header


def template_batch() -> bytearray:
    builder = DefaultRecordBatchBuilder(2, 0, 0, 1, 0, 0, 1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x" * 16, headers=[])
    return bytearray(builder.build())


def build(data_dir: Path, chunks: int, partitions: int) -> None:
    """Intake files and index of `chunks` one-batch chunks spread over `partitions` partitions."""
    store = SqliteStore(data_dir / "meta.db")
    topic = store.create_topic(TOPIC, partitions, {
        ARCHIVE_MAX_BYTES: str(1 << 40), ARCHIVE_COMPLETE_DELAY_MAX_MS: str(1 << 40),
        ARCHIVE_IDLE_MAX_MS: str(1 << 40),  # nothing falls due: a poll plans and stops before Spark
    })
    directory = data_dir / "intake"
    directory.mkdir(parents=True)
    batch = template_batch()
    now_ms = int(time.time() * 1000)
    file_id, position, handle = 1, 0, open(intake_file.file_path(directory, 1), "wb")  # noqa: SIM115
    pending: list[IntakeChunk] = []
    out = bytearray()
    for i in range(chunks):
        partition, offset = i % partitions, i // partitions
        struct.pack_into(">q", batch, 0, offset)
        struct.pack_into(">i", batch, _SEQUENCE_AT, offset % (1 << 31))  # producer 1's next sequence
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[_CRC_FROM:])))
        frame = intake_file.encode_frame(topic.topic_id, partition, offset, offset + 1, now_ms, bytes(batch))
        if position + len(frame) + len(batch) > SEGMENT_BYTES:
            handle.write(out)
            out.clear()
            handle.close()
            file_id, position = file_id + 1, 0
            handle = open(intake_file.file_path(directory, file_id), "wb")  # noqa: SIM115
        out += frame
        out += batch
        position += len(frame)
        pending.append(IntakeChunk(topic.topic_id, partition, offset, offset + 1, file_id, position, len(batch),
                                   now_ms, now_ms))
        position += len(batch)
        if len(pending) >= 50_000:
            store.commit_intake(pending, IntakeTail(file_id, position))
            pending.clear()
    handle.write(out)
    handle.close()
    store.commit_intake(pending, IntakeTail(file_id, position))
    store.close()


def settings_for(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, intake=IntakeSettings(fsync=False))


def time_startup(data_dir: Path, snapshot_after: bool) -> float:
    """Seconds of LogManager.open() (what `icelog serve` does before listening); optionally snapshot."""

    async def main() -> float:
        logs = LogManager(settings_for(data_dir), SqliteStore(data_dir / "meta.db"))
        started = time.process_time()
        logs.open()
        seconds = time.process_time() - started
        if snapshot_after:
            logs.start()
            await logs.close()  # a clean stop: the shutdown snapshot
        else:
            await logs.storage.close()
            logs.store.close()
        return seconds

    return asyncio.run(main())


def time_polls(data_dir: Path, polls: int = 5) -> dict[str, float]:
    store = SqliteStore(data_dir / "meta.db")
    try:
        settings = settings_for(data_dir)
        archiver = Archiver(settings, None, store)
        topic = store.get_topic(TOPIC)
        assert topic is not None
        config = archiver.topic_config(topic)
        timings = []
        for _ in range(polls + 1):
            archiver._last_reconcile_ms[topic.topic_id] = int(time.time() * 1000)  # no catalog look
            started = time.process_time()
            result = archiver.archive_topic(topic, config)
            timings.append(time.process_time() - started)
            assert result.archives == 0
        started = time.process_time()
        store.intake_chunks(topic.topic_id)
        old_query = time.process_time() - started
    finally:
        store.close()
    return {"first_poll_s": timings[0], "poll_s": statistics.median(timings[1:]),
            "old_poll_query_alone_s": old_query}


def measure(chunks: int, partitions: int, root: Path) -> dict[str, float]:
    data_dir = root / f"data-{chunks}"
    started = time.perf_counter()
    build(data_dir, chunks, partitions)
    built = time.perf_counter() - started
    replay = time_startup(data_dir, snapshot_after=True)  # no snapshot yet: replays every chunk
    snapshot = statistics.median(time_startup(data_dir, snapshot_after=False) for _ in range(3))
    polls = time_polls(data_dir)
    size = sum(f.stat().st_size for f in (data_dir / "intake").iterdir())
    return {"chunks": chunks, "intake_bytes": size, "build_s": built, "startup_without_snapshot_s": replay,
            "startup_with_snapshot_s": snapshot, **polls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icelog-startup-") as tmp:
        small = measure(args.small, args.partitions, Path(tmp))
        large = measure(args.large, args.partitions, Path(tmp))
    ratios = {
        key: large[key] / small[key]
        for key in ("startup_without_snapshot_s", "startup_with_snapshot_s", "first_poll_s", "poll_s",
                    "old_poll_query_alone_s")
        if small[key] > 0
    }
    report = {"small": small, "large": large, f"ratio_{args.large}_over_{args.small}": ratios,
              "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
