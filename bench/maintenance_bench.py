"""Maintenance benchmark: a steady stream with automatic table maintenance on and off.

Run: .venv/bin/python bench/maintenance_bench.py [--minutes 10] [--rate-mb 5] [--interval-s 60]

Two phases on one broker, each with `icelog archive` running continuously on its default archive delays
(the archiver process runs the automatic maintenance): a steady `--rate-mb` MB/s of 100-byte records for
`--minutes` to a 4-partition topic, once with `icelog.table.auto.maintenance=true` and once `false`. The
maintenance interval is `--interval-s` (`archive.maintenance_interval_ms`; the default 300 s would give a
short run no round). At the end of each phase:
  - the table's data-file count when the stream ends and, with maintenance, once the round that follows
    has finished (the table at rest; the scan is measured then);
  - a full-table Spark scan (every value read; median of 3) against the baseline: the same rows written
    once, as one file set (an identical table filled by one Spark append), measured in the same run;
    target with maintenance: scan <= 1.2 x baseline;
  - freshness: CreateTime → commit time of the first snapshot containing the record (p50 / p99; targets
    5 s / 15 s), as bench/archive_bench.py measures it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from archive_bench import PARTITIONS, RECORD_SIZE, percentile, producer, steady_produce  # noqa: E402
from conftest import BrokerProcess  # noqa: E402

from icelog.config import load_settings  # noqa: E402
from icelog.lake.iceberg_java import load_table  # noqa: E402
from icelog.lake.layout import archive_table_ddl, quote_identifier  # noqa: E402
from icelog.lake.table_stats import open_catalog, table_stats  # noqa: E402
from icelog.meta.store import open_store  # noqa: E402
from icelog.pipeline.maintenance import table_state  # noqa: E402
from icelog.pipeline.reconcile import OFFSETS_PROPERTY, decode_offsets  # noqa: E402
from icelog.topic_configs.archive import TABLE_AUTO_MAINTENANCE  # noqa: E402


def run_phase(broker: BrokerProcess, settings: Any, topic: str, maintenance: bool, args: Any) -> dict[str, Any]:
    """Steady produce with the archiver (and its maintenance) running; the snapshots' freshness."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {TABLE_AUTO_MAINTENANCE: str(maintenance).lower()}
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(30)
    env = {
        **os.environ,
        "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
        "ICELOG_REGISTRY_LISTEN": settings.registry_listen,
        "ICELOG_ARCHIVE__MAINTENANCE_INTERVAL_MS": str(int(args.interval_s * 1000)),
    }
    log_path = broker.data_dir.parent / f"archiver-{topic}.log"
    archiver = subprocess.Popen(
        [sys.executable, "-m", "icelog", "archive", "--data-dir", str(broker.data_dir)],
        stdout=open(log_path, "wb"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        env=env,
    )
    store = open_store(settings.metadata_url)
    try:
        topic_id = store.get_topic(topic).topic_id
        prod = producer(broker.bootstrap)
        prod.produce(topic, value=b"warm-up", partition=0)
        prod.flush(30)
        deadline = time.monotonic() + 180
        while not any(s.archived_offset > 0 for s in store.archive_states(topic_id)):
            if time.monotonic() > deadline or archiver.poll() is not None:
                raise RuntimeError("archiver did not start:\n" + log_path.read_text()[-3000:])
            time.sleep(0.2)
        sent, _acks, elapsed = steady_produce(prod, topic, args.minutes * 60, args.rate_mb)
        hw = {p.partition: p.high_watermark for p in store.partitions(topic_id)}
        deadline = time.monotonic() + 300
        while {s.partition: s.archived_offset for s in store.archive_states(topic_id)} != hw:
            if time.monotonic() > deadline:
                raise RuntimeError("archiver did not catch up:\n" + log_path.read_text()[-3000:])
            time.sleep(0.2)
        stream_end = stats(settings, topic)
        rounds = [line.split(": ", 1)[1] for line in log_path.read_text().splitlines() if "maintained icelog." in line]
        if maintenance:  # let the round that follows the stream finish (bounded): the table at rest
            ended_ms = time.time() * 1000
            deadline = time.monotonic() + args.interval_s + 300
            while time.monotonic() < deadline:
                record = store.maintenance_records().get(f"icelog.{topic}")
                if record is not None and record.finished_ms > ended_ms:
                    break
                time.sleep(1)
            rounds = [
                line.split(": ", 1)[1] for line in log_path.read_text().splitlines() if "maintained icelog." in line
            ]
    finally:
        archiver.terminate()
        archiver.wait(60)
        store.close()
    return {"sent": sent, "elapsed": elapsed, "maintenance_rounds": rounds, "at_stream_end": stream_end}


def stats(settings: Any, topic: str) -> dict[str, int]:
    """Data files and snapshots from the table's metadata (pyiceberg, while the archiver runs)."""
    found = table_stats(open_catalog(settings), "icelog", topic)
    assert found is not None
    return {"data_files": found.data_files, "avg_file_bytes": found.average_file_bytes, "snapshots": found.snapshots}


def freshness(table: Any, sent: dict[int, Any], elapsed: float) -> dict[str, Any]:
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
    return {
        "records": len(latencies),
        "achieved_mb_s": round(len(latencies) * RECORD_SIZE / elapsed / 1e6, 2),
        "p50_s": round(percentile(latencies, 0.5), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "max_s": round(latencies[-1], 2),
        "mean_s": round(statistics.fmean(latencies), 2),
    }


def scan_seconds(spark: Any, name: str, repeat: int = 3) -> float:
    """Median time of a full scan that reads every value (no metadata-only count)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        spark.sql(f"SELECT count(*), sum(length(value.__raw__)), max(kafka.offset) FROM {name}").collect()
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
    return {
        "maintenance_rounds": phase["maintenance_rounds"],
        "at_stream_end": phase["at_stream_end"],
        "data_files": state.data_files,
        "avg_file_bytes": state.bytes // max(1, state.data_files),
        "snapshots": state.snapshots,
        "scan_s": round(scan_s, 2),
        "baseline_data_files": base_state.data_files,
        "baseline_scan_s": round(base_s, 2),
        "scan_vs_baseline": round(scan_s / base_s, 2),
        "freshness": freshness(table, phase["sent"], phase["elapsed"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate-mb", type=float, default=5.0)
    parser.add_argument("--interval-s", type=float, default=60, help="archive.maintenance_interval_ms / 1000")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icelog-maintenance-bench-"))
    broker = BrokerProcess(
        work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_ARCHIVE__ENABLED": "false"}
    ).start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "minutes": args.minutes,
        "rate_mb_s": args.rate_mb,
        "interval_s": args.interval_s,
        "partitions": PARTITIONS,
        "record_bytes": RECORD_SIZE,
    }
    try:
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        phases: dict[str, dict[str, Any]] = {}
        for topic, maintenance in (("bench-maint-on", True), ("bench-maint-off", False)):
            phases[topic] = run_phase(broker, settings, topic, maintenance, args)
            print(topic, "produced and archived", flush=True)
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
    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    (out / "maintenance_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
