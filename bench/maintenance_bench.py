"""Maintenance benchmark: a steady stream with automatic table maintenance on and off.

Run: .venv/bin/python bench/maintenance_bench.py [--minutes 10] [--rate-mb 5] [--interval-s 300] [--group-mib N]

Two phases on one broker, each with `icelog archive` running continuously on its default archive delays
(the archiver starts the automatic maintenance rounds, each in a child process `icelog maintain --due`):
a steady `--rate-mb` MB/s of 100-byte records for `--minutes` to a 4-partition topic, once with
`icelog.table.auto.maintenance=true` and once `false`. Before the second phase the first topic's
auto-maintenance is switched off (IncrementalAlterConfigs), so the second phase runs no round at all.
The maintenance interval is icelog's (`archive.maintenance_interval_ms`, 300 s: two or three rounds in 10
minutes) unless `--interval-s` sets it; every other maintenance setting is icelog's default unless
`--group-mib` sets `archive.maintenance_group_bytes` (default 32 MiB). At the end of each phase:
  - the table's data-file count when the stream ends and, with maintenance, once the table is at rest: a
    round that started after the stream's end has finished, or none became due; the scan is measured then,
    and also of the snapshot that was current when the stream ended (time travel: what readers saw
    between rounds while the stream ran);
  - with maintenance: each round's line from the archiver's log, and the peak resident memory and the CPU
    seconds of the rounds' process trees (their Python and Spark JVM: the cost of a second JVM);
  - a full-table Spark scan (every value read; median of 3) against the baseline: the same rows written
    once, as one file set (an identical table filled by one Spark append), measured in the same run;
    target with maintenance: scan <= 1.2 x baseline;
  - freshness: CreateTime → commit time of the first snapshot containing the record (p50 / p99; targets
    5 s / 15 s), as bench/archive_bench.py measures it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import freshness_latencies, pass_stats, percentile, running_archiver, write_results  # noqa: E402
from archive_bench import PARTITIONS, RECORD_SIZE, producer, steady_produce  # noqa: E402

from icelog.archive.maintenance import table_state  # noqa: E402
from icelog.archive.maintenance_schedule import LOOK_EVERY_MS  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.lake.iceberg_java import load_table  # noqa: E402
from icelog.lake.table_stats import open_catalog, table_stats  # noqa: E402
from icelog.table.config import TABLE_AUTO_MAINTENANCE  # noqa: E402
from icelog.table.layout import archive_table_ddl, quote_identifier  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402


def run_phase(broker: BrokerProcess, settings: Any, topic: str, maintenance: bool, args: Any) -> dict[str, Any]:
    """Steady produce with the archiver (and its maintenance) running; the snapshots' freshness."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {TABLE_AUTO_MAINTENANCE: str(maintenance).lower()}
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(30)
    env = {
        "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
        "ICELOG_REGISTRY_LISTEN": settings.registry_listen,
        "ICELOG_ARCHIVE__MAINTENANCE_INTERVAL_MS": str(int(args.interval_s * 1000)),
    }
    if args.group_mib is not None:
        env["ICELOG_ARCHIVE__MAINTENANCE_GROUP_BYTES"] = str(int(args.group_mib * 1024 * 1024))
    prod = producer(broker.bootstrap)
    memory = PeakMemory()
    with running_archiver(
        broker.data_dir, settings.metadata_url, topic, prod, env, f"archiver-{topic}.log"
    ) as child:
        memory.start()
        print(f"{topic}: archiver up; streaming {args.rate_mb} MB/s for {args.minutes} min", flush=True)
        sent, _acks, elapsed = steady_produce(prod, topic, args.minutes * 60, args.rate_mb)
        child.wait_caught_up(max(300, 2 * args.minutes * 60))  # a loaded machine leaves a backlog
        stream_end = stats(settings, topic)
        if maintenance:
            wait_until_at_rest(child, topic, args.interval_s)
        memory.stop()
    log = child.log_path.read_text(errors="replace")
    rounds = [line.split(": ", 1)[1] for line in log.splitlines() if "maintained icelog." in line]
    passes = pass_stats(child.log_path, topic)
    return {
        "sent": sent, "elapsed": elapsed, "maintenance_rounds": rounds, "at_stream_end": stream_end,
        "archiver_passes": passes, "round_process_peak_rss_mb": memory.peak_mb,
        "round_process_cpu_s": memory.cpu_s, "round_process_start_s": round_starts(log),
    }


def wait_until_at_rest(child: Any, topic: str, interval_s: float) -> None:
    """After the stream: until a round that started after its end has finished, or no round runs and the
    scheduler has had the interval and a look (LOOK_EVERY_MS) since the last one (and since the stream's
    end) without starting one: nothing is due. Bounded."""
    ended_ms = time.time() * 1000
    print(f"{topic}: stream archived; waiting for the table to be at rest", flush=True)
    quiet_ms = interval_s * 1000 + LOOK_EVERY_MS + 20_000
    deadline = time.monotonic() + interval_s + 1200
    while time.monotonic() < deadline:
        record = child.store.maintenance_records().get(f"icelog.{topic}")
        if record is not None and record.finished_ms - record.duration_ms > ended_ms:
            return
        log = child.log_path.read_text(errors="replace")
        running = log.rfind("starting a maintenance round") > log.rfind("maintenance_schedule: maintained ")
        last_ms = record.finished_ms if record is not None else ended_ms
        if not running and time.time() * 1000 - max(last_ms, ended_ms) > quiet_ms:
            print(f"{topic}: no round due after the stream (the table is at rest)", flush=True)
            return
        time.sleep(1)
    print(f"{topic}: still maintaining at the end of the wait", flush=True)


def round_starts(log: str) -> list[float]:
    """Per round: seconds from the archiver starting its process to the round's first table (Spark start)."""
    def at(line: str) -> float:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    starts, started = [], None
    for line in log.splitlines():
        if "starting a maintenance round" in line:
            started = at(line)
        elif "maintenance_schedule: maintaining " in line and started is not None:
            starts.append(round(at(line) - started, 1))
            started = None
    return starts


def auto_maintenance_off(broker: BrokerProcess, topic: str) -> None:
    """Switch a topic's auto-maintenance off, so a later phase's archiver runs no round for its table."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    entry = ConfigEntry(TABLE_AUTO_MAINTENANCE, "false", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


class PeakMemory:
    """Peak resident memory and CPU time of the maintenance round processes (`icelog maintain --due` and their
    descendants, the Spark JVM among them), sampled every second from /proc (CPU: each process's last sample,
    so up to a second of each is missed)."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._cpu: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds at its last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def cpu_s(self) -> float:
        return round(sum(self._cpu.values()), 1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            tree = round_tree()
            self.peak_mb = max(self.peak_mb, round(sum(rss for rss, _cpu in tree.values()) / 2**20, 1))
            for key, (_rss, cpu) in tree.items():
                self._cpu[key] = cpu


def round_tree() -> dict[tuple[int, int], tuple[int, float]]:
    """(pid, start time) -> (resident bytes, CPU seconds so far) of every `icelog maintain --due` process and
    its descendants now."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    usage: dict[int, tuple[int, int, float]] = {}
    roots = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            status = (entry / "status").read_text()
        except OSError:
            continue
        pid = int(entry.name)
        fields = stat.rsplit(")", 1)[1].split()  # fields from the state on (stat(5) field 3)
        parents[pid] = int(fields[1])
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        usage[pid] = (int(fields[19]), rss, (int(fields[11]) + int(fields[12])) / ticks)  # starttime, rss, utime+stime
        if b"icelog maintain --due" in cmdline:
            roots.add(pid)
    found = {}
    for pid, (start, rss, cpu) in usage.items():
        ancestor = pid
        while ancestor not in roots and ancestor in parents and ancestor > 1:
            ancestor = parents[ancestor]
        if ancestor in roots:
            found[(pid, start)] = (rss, cpu)
    return found


def stats(settings: Any, topic: str) -> dict[str, int]:
    """Data files, snapshots and the current snapshot's id from the table's metadata (pyiceberg, while the
    archiver runs)."""
    found = table_stats(open_catalog(settings), "icelog", topic)
    assert found is not None and found.snapshot_id is not None
    return {
        "data_files": found.data_files, "avg_file_bytes": found.average_file_bytes, "snapshots": found.snapshots,
        "snapshot_id": found.snapshot_id,
    }


def freshness(table: Any, sent: dict[int, Any], elapsed: float) -> dict[str, Any]:
    latencies, _snapshots = freshness_latencies(table, sent)
    return {
        "records": len(latencies),
        "achieved_mb_s": round(len(latencies) * RECORD_SIZE / elapsed / 1e6, 2),
        "p50_s": round(percentile(latencies, 0.5), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "max_s": round(latencies[-1], 2),
        "mean_s": round(statistics.fmean(latencies), 2),
    }


def scan_seconds(spark: Any, name: str, repeat: int = 3, snapshot_id: int | None = None) -> float:
    """Median time of a full scan that reads every value (no metadata-only count); of `snapshot_id` if given
    (time travel: the table as it stood then)."""
    version = "" if snapshot_id is None else f" VERSION AS OF {snapshot_id}"
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        spark.sql(f"SELECT count(*), sum(length(value.__raw__)), max(kafka.offset) FROM {name}{version}").collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(spark: Any, settings: Any, topic: str, phase: dict[str, Any]) -> dict[str, Any]:
    catalog = settings.archive.catalog_name
    name = quote_identifier(catalog, "icelog", topic)
    table = load_table(spark, name)
    state = table_state(table)
    baseline = f"bench.`{topic}_one_file_set`"
    for statement in archive_table_ddl(catalog, "bench", f"{topic}_one_file_set").statements:
        spark.sql(statement)
    spark.table(name).writeTo(baseline).append()  # table distribution and sort: one file per partition+day
    base_state = table_state(load_table(spark, baseline))
    scan_s, base_s = scan_seconds(spark, name), scan_seconds(spark, baseline)
    # The same rows as they stood when the stream ended (before a last round after it): what readers of a
    # table that is still being written see between rounds.
    end_s = scan_seconds(spark, name, snapshot_id=phase["at_stream_end"]["snapshot_id"])
    return {
        "maintenance_rounds": phase["maintenance_rounds"],
        "round_process_peak_rss_mb": phase["round_process_peak_rss_mb"],
        "round_process_cpu_s": phase["round_process_cpu_s"],
        "round_process_start_s": phase["round_process_start_s"],
        "at_stream_end": phase["at_stream_end"],
        "data_files": state.data_files,
        "avg_file_bytes": state.bytes // max(1, state.data_files),
        "snapshots": state.snapshots,
        "scan_s": round(scan_s, 2),
        "baseline_data_files": base_state.data_files,
        "baseline_scan_s": round(base_s, 2),
        "scan_vs_baseline": round(scan_s / base_s, 2),
        "scan_at_stream_end_s": round(end_s, 2),
        "scan_at_stream_end_vs_baseline": round(end_s / base_s, 2),
        "freshness": freshness(table, phase["sent"], phase["elapsed"]),
        "archiver_passes": phase["archiver_passes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate-mb", type=float, default=5.0)
    parser.add_argument("--interval-s", type=float, default=None,
                        help="archive.maintenance_interval_ms / 1000 (default: icelog's, 300 s)")
    parser.add_argument("--group-mib", type=float, default=None,
                        help="archive.maintenance_group_bytes / 2**20 (default: icelog's, 32 MiB)")
    args = parser.parse_args()
    if args.interval_s is None:
        args.interval_s = load_settings().archive.maintenance_interval_ms / 1000
    work = Path(tempfile.mkdtemp(prefix="icelog-maintenance-bench-"))
    broker = BrokerProcess(
        work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_ARCHIVE__ENABLED": "false"}
    ).start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "minutes": args.minutes,
        "rate_mb_s": args.rate_mb,
        "interval_s": args.interval_s,
        "group_mib": args.group_mib,
        "partitions": PARTITIONS,
        "record_bytes": RECORD_SIZE,
    }
    try:
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        phases: dict[str, dict[str, Any]] = {}
        for topic, maintenance in (("bench-maint-on", True), ("bench-maint-off", False)):
            phases[topic] = run_phase(broker, settings, topic, maintenance, args)
            print(topic, "produced and archived", flush=True)
            if maintenance:
                auto_maintenance_off(broker, topic)
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-maintenance-bench")
        results["maintenance_on"] = measure(spark, settings, "bench-maint-on", phases["bench-maint-on"])
        print("on", results["maintenance_on"], flush=True)
        results["maintenance_off"] = measure(spark, settings, "bench-maint-off", phases["bench-maint-off"])
        print("off", results["maintenance_off"], flush=True)
        spark.stop()
    except BaseException:
        print(f"failed; logs kept in {work}. Broker log tail:\n{broker.log()[-3000:]}", flush=True)
        broker.stop()
        raise
    broker.stop()
    shutil.rmtree(work, ignore_errors=True)
    write_results("maintenance_bench.json", results)


if __name__ == "__main__":
    main()
