"""Soak benchmark: does a broker's memory stay flat under steady load once its intake retention has turned over?

Run: .venv/bin/python bench/soak_bench.py --minutes 60 [--consumers] [--rate-mb 5] [--retention-minutes 10]

`icelog serve` on its embedded defaults (SQLite store, embedded catalog, the archiver child on) in a temporary
data directory; one topic of 6 partitions with `icelog.intake.retention.ms` at `--retention-minutes`; one
confluent-kafka producer at a steady `--rate-mb` MB/s (1 KiB records, lz4, acks=all). With `--consumers`, also a
consumer group reading the tail and a consumer reading the table back (read-back of archived offsets below the
intake: it seeks to an early offset of each partition, reads a few MB, seeks again).

Every `--sample-seconds` (60): resident memory (VmRSS and its anonymous part) and open descriptors of the broker,
of the archiver process and of the archiver's JVM; the topic's intake bytes, the archive's freshness (mean of the
interval's observations) and lag, the broker's cache sizes (`icelog_cache_*`), all from /proc and /metrics. The
figure: the least-squares slope of each process's RSS over the last half of the run, as the growth over that half
in % of the RSS at the midpoint (target: < 2 % for the broker). The produce rate achieved is reported, since a
shared machine may not sustain the one asked for. Results go to bench/results/soak_bench[_consumers].json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

from tests.support.broker import BrokerProcess  # noqa: E402

RECORD_SIZE = 1024
TOPIC = "soak"
TABLE_READ_BYTES = 4 * 1024 * 1024  # what the table reader reads after each seek, per partition
METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def payloads(count: int) -> list[bytes]:
    """Half random, half repetitive 1 KiB values, so lz4 has realistic work (about 2:1)."""
    return [os.urandom(RECORD_SIZE // 2) + bytes([i % 256]) * (RECORD_SIZE // 2) for i in range(count)]


# -- what is sampled -------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, float] | None:
    """VmRSS and RssAnon (MB) and open descriptors of a process, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    kb = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(VmRSS|RssAnon):\s+(\d+) kB", status, re.M)}
    return {"rss_mb": round(kb.get("VmRSS", 0) / 1024, 1), "rss_anon_mb": round(kb.get("RssAnon", 0) / 1024, 1),
            "fds": fds}


def children(pid: int) -> list[int]:
    """Direct children of a process (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def archiver_pids(broker_pid: int) -> tuple[int | None, int | None]:
    """The broker's `icelog archive` child and that child's JVM (Spark's driver), when running."""
    archiver = next((c for c in children(broker_pid) if " archive " in cmdline(c) + " "), None)
    if archiver is None:
        return None, None
    jvm = next((c for c in children(archiver) if "java" in cmdline(c)), None)
    return archiver, jvm


def scrape(url: str) -> dict[str, list[tuple[str, float]]]:
    """/metrics as name → [(labels, value)]."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if match:
            out.setdefault(match.group(1), []).append((match.group(2) or "", float(match.group(3))))
    return out


def total(metrics: dict[str, list[tuple[str, float]]], name: str, topic: str | None = TOPIC) -> float:
    return sum(v for labels, v in metrics.get(name, []) if topic is None or f'topic="{topic}"' in labels)


# -- the load --------------------------------------------------------------------------------------------------
@dataclass
class Load:
    """Counters the load threads keep (read by the sampler)."""

    produced: int = 0
    produce_errors: int = 0
    tail_records: int = 0
    table_records: int = 0
    table_seeks: int = 0
    consumer_errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def produce_steadily(bootstrap: str, rate_mb: float, load: Load) -> None:
    """One producer at a steady rate: each 10 ms, the records due by then."""
    producer = ck.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5,
        "delivery.report.only.error": True,
    })
    values = payloads(1000)
    rate = rate_mb * 1e6 / RECORD_SIZE

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            load.produce_errors += 1

    started = time.monotonic()
    while not load.stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while load.produced < due:
            try:
                producer.produce(TOPIC, values[load.produced % 1000], on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.05)
                continue
            load.produced += 1
        producer.poll(0.01)
    producer.flush(60)


def consume_tail(bootstrap: str, load: Load) -> None:
    """A consumer group member reading the tail as it is written."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-tail", "auto.offset.reset": "latest",
                            "enable.auto.commit": True})
    consumer.subscribe([TOPIC])
    try:
        while not load.stop.is_set():
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    load.tail_records += 1
                elif len(load.consumer_errors) < 20:
                    load.consumer_errors.append(f"tail: {msg.error()}")
    finally:
        consumer.close()


def read_table(bootstrap: str, partitions: int, load: Load) -> None:
    """Read archived offsets below the intake, again and again: a seek to a random offset between a partition's
    log start (what the table holds) and its intake's start, then TABLE_READ_BYTES of records from there."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-table", "enable.auto.commit": False,
                            "max.partition.fetch.bytes": 1024 * 1024})
    rng = random.Random(49)
    try:
        while not load.stop.is_set():
            partition = rng.randrange(partitions)
            low, high = consumer.get_watermark_offsets(ck.TopicPartition(TOPIC, partition), timeout=10)
            span = max(high - low, 1)
            # The older half of the log: archived and, once retention has turned over, read back from the table.
            offset = low + rng.randrange(max(span // 2, 1))
            consumer.assign([ck.TopicPartition(TOPIC, partition, offset)])
            read = 0
            deadline = time.monotonic() + 30
            while read < TABLE_READ_BYTES and time.monotonic() < deadline and not load.stop.is_set():
                for msg in consumer.consume(500, 0.5):
                    if msg.error() is None:
                        read += len(msg.value() or b"")
                        load.table_records += 1
                    elif len(load.consumer_errors) < 20:
                        load.consumer_errors.append(f"table: {msg.error()}")
            load.table_seeks += 1
    finally:
        consumer.close()


# -- the run ---------------------------------------------------------------------------------------------------
def sample(broker: BrokerProcess, load: Load, started: float, last: dict[str, float]) -> dict[str, Any]:
    """One row of figures; `last` carries the previous row's counters (for per-interval rates)."""
    assert broker.proc is not None
    archiver, jvm = archiver_pids(broker.proc.pid)
    metrics = scrape(broker.metrics_url)
    now = time.monotonic()
    seconds = now - last.get("at", started)
    fresh_sum = total(metrics, "icelog_archive_freshness_seconds_sum")
    fresh_count = total(metrics, "icelog_archive_freshness_seconds_count")
    observed = fresh_count - last.get("fresh_count", 0)
    row: dict[str, Any] = {
        "minute": round((now - started) / 60, 2),
        "broker": proc_status(broker.proc.pid),
        "archiver": proc_status(archiver) if archiver else None,
        "archiver_jvm": proc_status(jvm) if jvm else None,
        "intake_mb": round(total(metrics, "icelog_partition_intake_bytes") / 1e6, 1),
        "intake_chunks": int(total(metrics, "icelog_partition_intake_chunks")),
        "freshness_mean_s": round((fresh_sum - last.get("fresh_sum", 0)) / observed, 2) if observed else None,
        "archive_lag_s_max": max((v for labels, v in metrics.get("icelog_archive_lag_seconds", [])), default=None),
        "produce_mb_per_s": round((load.produced - last.get("produced", 0)) * RECORD_SIZE / seconds / 1e6, 2),
        "produce_errors": load.produce_errors,
        "tail_records_per_s": round((load.tail_records - last.get("tail", 0)) / seconds),
        "table_records_per_s": round((load.table_records - last.get("table", 0)) / seconds),
        "caches": {f"{name}{labels}": value for name, rows in sorted(metrics.items())
                   if name.startswith(("icelog_cache_", "icelog_malloc_", "icelog_arrow_")) for labels, value in rows},
    }
    last.update(at=now, fresh_sum=fresh_sum, fresh_count=fresh_count, produced=load.produced,
                tail=load.tail_records, table=load.table_records)
    return row


def growth_last_half(rows: list[dict[str, Any]], process: str, minutes: float) -> dict[str, float] | None:
    """The least-squares slope of a process's RSS over the last half of the run, as MB per minute and as the
    growth over that half in % of the RSS at the midpoint (the sample nearest it)."""
    points = [(r["minute"], r[process]["rss_mb"]) for r in rows if r[process] and r["minute"] >= minutes / 2 - 1e-6]
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (m - mean_m) for t, m in points) / spread if spread else 0.0
    mid = min((r for r in rows if r[process]), key=lambda r: abs(r["minute"] - minutes / 2))[process]["rss_mb"]
    return {"slope_mb_per_min": round(slope, 3), "rss_at_mid_mb": mid,
            "growth_pct_of_mid": round(100 * slope * (minutes / 2) / mid, 2)}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = work / "data"
    data.mkdir()
    # The embedded defaults (`icelog serve` with nothing set), but for the test harness's quiet ones: archive on.
    env = {"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_ARCHIVE__ENABLED": "true", **dict(args.env)}
    broker = BrokerProcess(data, env=env, extra_args=["--log-level", "info"]).start(timeout=60)
    load = Load()
    threads: list[threading.Thread] = []
    rows: list[dict[str, Any]] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(
            TOPIC, args.partitions, 1, config={"icelog.intake.retention.ms": str(int(args.retention_minutes * 60_000))},
        )])[TOPIC].result(30)
        workers = [("producer", produce_steadily, (broker.bootstrap, args.rate_mb, load))]
        if args.consumers:
            workers += [("tail", consume_tail, (broker.bootstrap, load)),
                        ("table", read_table, (broker.bootstrap, args.partitions, load))]
        for name, target, targs in workers:
            threads.append(threading.Thread(target=target, args=targs, name=name, daemon=True))
            threads[-1].start()
        started = time.monotonic()
        last: dict[str, float] = {}
        for due in _ticks(started, args.sample_seconds, args.minutes * 60):
            time.sleep(max(due - time.monotonic(), 0))
            if broker.proc is None or broker.proc.poll() is not None:
                raise RuntimeError("the broker exited:\n" + broker.log()[-3000:])
            rows.append(sample(broker, load, started, last))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(90)
        broker.stop()
    minutes = rows[-1]["minute"] if rows else 0.0
    figures: dict[str, Any] = {
        "variant": "consumers" if args.consumers else "producer",
        "minutes": round(minutes, 1),
        "retention_minutes": args.retention_minutes,
        "rate_mb_asked": args.rate_mb,
        "rate_mb_achieved": round(load.produced * RECORD_SIZE / (minutes * 60) / 1e6, 2) if minutes else 0.0,
        "records_produced": load.produced,
        "produce_errors": load.produce_errors,
        "consumer_errors": load.consumer_errors,
        "table_seeks": load.table_seeks,
        "growth_last_half": {p: growth_last_half(rows, p, minutes) for p in ("broker", "archiver", "archiver_jvm")},
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "samples": rows,
    }
    return figures


def _ticks(started: float, every_s: float, total_s: float) -> Iterator[float]:
    count = max(int(total_s // every_s), 1)
    for i in range(1, count + 1):
        yield started + i * every_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate-mb", type=float, default=5.0)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--retention-minutes", type=float, default=10, help="icelog.intake.retention.ms of the topic")
    parser.add_argument("--consumers", action="store_true", help="also a tail consumer group and a table reader")
    parser.add_argument("--sample-seconds", type=float, default=60)
    parser.add_argument("--env", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                        metavar="KEY=VALUE", help="extra environment of the broker (e.g. ICELOG_INTAKE__...)")
    parser.add_argument("--keep", type=Path, help="keep the data directory and logs here (default: a temp dir)")
    parser.add_argument("--out", default=None, help="results file in bench/results/ ('none': print only)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its broker (finally)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        figures = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run(args, Path(tmp))
    out = args.out or ("soak_bench_consumers.json" if args.consumers else "soak_bench.json")
    if out == "none":
        print(json.dumps(figures, indent=2))
    else:
        write_results(out, figures)


if __name__ == "__main__":
    main()
