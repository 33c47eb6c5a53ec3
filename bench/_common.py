"""What the archive benchmarks share: `icelog archive` as a child process, and freshness from the snapshots.

Used by bench/archive_bench.py and bench/maintenance_bench.py (not a benchmark itself).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from icelog.archive.reconcile import OFFSETS_PROPERTY, decode_offsets
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore

# The archiver child's first pass includes its Spark start; on a loaded 2-core machine (load 10+), at
# archive.nice 10, that took more than the 180 s this wait used to allow.
START_TIMEOUT_S = 600
ARCHIVED_LINE = re.compile(r"^(\S+ \S+) INFO icelog\.archive\.archiver: archived (\S+): (\d+) records")
PASS_SECONDS = re.compile(r"; seconds ((?:\w+=[\d.]+ ?)+)$")  # the pass's breakdown (archiver.PASS_PARTS)


@dataclass
class ArchiverChild:
    """A running `icelog archive` child, the metadata store it archives from, and its log."""

    proc: subprocess.Popen[bytes]
    store: MetadataStore
    topic_id: Any
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_caught_up(self, timeout_s: float) -> None:
        """Until every partition's archived offset is its high watermark (the stream has ended)."""
        hw = {p.partition: p.high_watermark for p in self.store.partitions(self.topic_id)}
        deadline = time.monotonic() + timeout_s
        while {s.partition: s.archived_offset for s in self.store.archive_states(self.topic_id)} != hw:
            if time.monotonic() > deadline:
                raise RuntimeError("archiver did not catch up:\n" + self.log_tail())
            time.sleep(0.2)


@contextlib.contextmanager
def running_archiver(
    data_dir: Path, metadata_url: str, topic: str, prod: Any, env: Mapping[str, str], log_name: str
) -> Iterator[ArchiverChild]:
    """Start `icelog archive` on `data_dir` and wait until its Spark is up (a warm-up record of `topic`
    archived, produced with `prod`); stop it on exit. `env`: the child's extra environment."""
    log_path = data_dir.parent / log_name
    proc = subprocess.Popen(
        [sys.executable, "-m", "icelog", "archive", "--data-dir", str(data_dir)],
        stdout=open(log_path, "wb"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    store = open_store(metadata_url)
    try:
        child = ArchiverChild(proc, store, store.get_topic(topic).topic_id, log_path)
        prod.produce(topic, value=b"warm-up", partition=0)
        prod.flush(30)
        started = time.monotonic()
        said = started
        while not any(s.archived_offset > 0 for s in store.archive_states(child.topic_id)):
            if time.monotonic() - started > START_TIMEOUT_S or proc.poll() is not None:
                raise RuntimeError("archiver did not start:\n" + child.log_tail())
            if time.monotonic() - said > 30:
                said = time.monotonic()
                print(f"  waiting for the archiver's first pass ({said - started:.0f} s)", flush=True)
            time.sleep(0.2)
        yield child
    finally:
        proc.terminate()
        proc.wait(60)
        store.close()


def send_all(prod: Any, count: int, send: Callable[[int], None]) -> float:
    """`send(i)` (one `prod.produce`) for each i < count, polling while the producer's queue is full, then a flush:
    the seconds taken."""
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                send(i)
                break
            except BufferError:
                prod.poll(0.01)
        if i % 10000 == 0:
            prod.poll(0)
    assert prod.flush(300) == 0
    return time.perf_counter() - started


def percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def freshness_latencies(table: Any, sent: Mapping[int, tuple[Sequence[int], Sequence[int]]]) -> tuple[list[float], int]:
    """Seconds from each sent record's CreateTime to the commit of the first snapshot whose offsets map
    covers it (sorted), and how many snapshots carry an offsets map. `sent`: partition → (offsets, CreateTimes)."""
    commits = sorted(
        (int(s.timestampMillis()), decode_offsets(str(s.summary().get(OFFSETS_PROPERTY))))
        for s in table.snapshots()
        if s.summary().get(OFFSETS_PROPERTY) is not None
    )
    latencies: list[float] = []
    for partition, (offsets, stamps) in sent.items():
        ends = [c[1].get(partition, 0) for c in commits]
        for offset, stamp in zip(offsets, stamps, strict=True):
            index = bisect.bisect_right(ends, offset)
            latencies.append((commits[index][0] - stamp) / 1000)
    latencies.sort()
    return latencies, len(commits)


def pass_stats(log_path: Path, topic: str) -> dict[str, Any]:
    """From the archiver's log: its passes that archived `topic` (count, median gap between their ends,
    median records per pass), and where a pass's time went (`breakdown`: the median and p90 seconds of each part
    the archiver logs, archiver.PASS_PARTS). The gap is how long one pass takes when the archiver never idles."""
    ends: list[float] = []
    records: list[int] = []
    parts: dict[str, list[float]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        match = ARCHIVED_LINE.match(line)
        if match and match.group(2) == topic:
            ends.append(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
            records.append(int(match.group(3)))
            seconds = PASS_SECONDS.search(line)
            timed = dict(part.split("=") for part in seconds.group(1).split()) if seconds else {}
            for name, value in timed.items():
                parts.setdefault(name, []).append(float(value))
            if timed:  # the pass: from its start until its offsets are recorded
                total = sum(float(timed.get(name, 0)) for name in ("plan", "job", "describe", "commit", "record"))
                parts.setdefault("pass", []).append(total)
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "passes": len(ends),
        "median_gap_s": round(statistics.median(gaps), 2) if gaps else 0.0,
        "p90_gap_s": round(percentile(sorted(gaps), 0.9), 2) if gaps else 0.0,
        "median_records": int(statistics.median(records)) if records else 0,
        "breakdown": {
            name: {"p50_s": round(statistics.median(values), 3), "p90_s": round(percentile(sorted(values), 0.9), 3)}
            for name, values in parts.items()
        },
    }


def write_results(name: str, results: Mapping[str, Any]) -> None:
    """Keep a run's figures in bench/results/<name> (what BENCHMARKS.md quotes) and print them."""
    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    (out / name).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
