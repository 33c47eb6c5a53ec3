"""Archive benchmark: archive throughput against a Spark Parquet → Iceberg baseline, and freshness.

Run: .venv/bin/python bench/archive_bench.py [--records 10000000] [--freshness-seconds 60] [--rate-mb 5]
     .venv/bin/python bench/archive_bench.py --quick     # 500 k records, 30 s of steady produce: < 5 minutes

One run measures, on the same machine and moment:
  1. decoding stored batches to Arrow rows in one Python process, as the Spark workers do (icelog's
     record reader, compiled `_records.c` vs its pure-Python fallback);
  2. one archive pass (`Archiver.run_pass(force=True)`, Spark local[*]) over `--records` records of
     100 bytes: records/s and MB/s;
  3. the baseline: Spark appending the same rows to an Iceberg table (same layout and write options)
     from Parquet already on disk; the target is archive >= 0.5 x baseline;
  4. freshness: a steady `--rate-mb` MB/s produce with `icelog archive` running continuously on its
     default delays; latency from a record's CreateTime to the commit time of the first Iceberg
     snapshot containing it (p50 / p99; issue 48's targets 1 s / 3 s), and where the archiver's passes spent
     their time (`archiver_passes.breakdown`: wait, plan, decode, write, job, describe, commit, record, pass;
     median and p90, from the archiver's log: docs/archiving.md); and the producer's ack latency then, against
     the same steady produce with no archiver running, a quarter of the run before and a quarter after
     (alternated: a busy spell of the shared machine shows on both sides), with the broker's fsync times in each
     (`ack_p99_with_vs_without`; target 1.5).
     --freshness-only skips 1-3; --out names the results file (default bench/results/archive_bench.json).
"""

from __future__ import annotations

import argparse
import array
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    freshness_latencies,
    pass_stats,
    percentile,
    running_archiver,
    send_all,
    write_results,
)

from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.archive.decode import decode_archive  # noqa: E402
from icelog.archive.plan import ChunkRef, PlannedArchive  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.lake.iceberg_java import load_table  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from icelog.table.layout import archive_table_ddl, quote_identifier  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

RECORD_SIZE = 100
PARTITIONS = 4


def values(count: int) -> list[bytes]:
    """100-byte values, half random (so lz4 has realistic work)."""
    return [os.urandom(RECORD_SIZE // 2) + bytes([i % 256]) * (RECORD_SIZE // 2) for i in range(count)]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def producer(bootstrap: str) -> ck.Producer:
    return ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "queue.buffering.max.messages": 2_000_000,
        }
    )


def produce_bulk(bootstrap: str, topic: str, records: int) -> float:
    prod = producer(bootstrap)
    pool = values(1000)
    return send_all(prod, records, lambda i: prod.produce(topic, value=pool[i % 1000], partition=i % PARTITIONS))


def decode_benchmark(settings: Any, store: Any, topic_id: Any, sample: int = 300_000) -> dict[str, float]:
    """Single-process decode rates on one partition's intake (records/s)."""
    chunks = [c for c in store.intake_chunks(topic_id) if c.partition == 0]
    picked, count = [], 0
    for chunk in chunks:
        picked.append(chunk)
        count += chunk.record_count
        if count >= sample:
            break
    refs = tuple(
        ChunkRef(c.file_id, c.position, c.length, c.base_offset, c.end_offset, c.ingest_timestamp) for c in picked
    )
    archive = PlannedArchive(topic_id, 0, picked[0].base_offset, picked[-1].end_offset, refs, "bench")
    intake = Path(settings.data_dir) / "intake"
    out = {}
    for _ in decode_archive(intake, archive):  # warm up: imports (pyarrow), first-call costs
        break
    for name, compiled in (("compiled_to_arrow", True), ("python_to_arrow", False)):
        started = time.perf_counter()
        rows = sum(batch.num_rows for batch in decode_archive(intake, archive, compiled=compiled))
        out[name] = rows / (time.perf_counter() - started)
    return out


def warm_up(broker: BrokerProcess, settings: Any, spark: Any, archiver: Archiver, work: Path) -> None:
    """A small archive pass and a small baseline append first: JIT, Python workers and catalog warm."""
    create_topic(broker.bootstrap, "bench-warm-up", PARTITIONS)
    produce_bulk(broker.bootstrap, "bench-warm-up", 50_000)
    archiver.run_pass(force=True, topics=["bench-warm-up"])
    spark.table("icelog.`bench-warm-up`").write.parquet(str(work / "warm-up-parquet"))
    for statement in archive_table_ddl(settings.archive.catalog_name, "bench", "warm_up").statements:
        spark.sql(statement)
    (
        spark.read.parquet(str(work / "warm-up-parquet"))
        .writeTo("bench.warm_up")
        .option("use-table-distribution-and-ordering", "false")
        .append()
    )


def steady_produce(
    prod: ck.Producer, topic: str, seconds: float, rate_mb: float
) -> tuple[dict[int, tuple[array.array, array.array]], list[float], float]:
    """Produce rate_mb MB/s for `seconds`: (offsets and CreateTimes per partition, ack latencies, seconds)."""
    sent: dict[int, tuple[array.array, array.array]] = {
        p: (array.array("q"), array.array("q")) for p in range(PARTITIONS)
    }
    acks: list[float] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            offsets, stamps = sent[msg.partition()]
            offsets.append(msg.offset())
            stamps.append(msg.timestamp()[1])
            acks.append(msg.latency())

    pool = values(1000)
    per_tick = max(1, int(rate_mb * 1e6 / RECORD_SIZE / 100))  # 100 ticks per second
    started = time.monotonic()
    tick = 0
    produced = 0
    while time.monotonic() - started < seconds:
        for _ in range(per_tick):
            prod.produce(topic, value=pool[produced % 1000], partition=produced % PARTITIONS, on_delivery=on_delivery)
            produced += 1
        prod.poll(0)
        tick += 1
        delay = started + tick / 100 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    elapsed = time.monotonic() - started
    prod.flush(60)
    return sent, acks, elapsed


def ack_summary(acks: list[float]) -> dict[str, float]:
    ordered = sorted(acks)
    return {
        "p50_ms": round(percentile(ordered, 0.5) * 1000, 1),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 1),
    }


def fsync_histogram(broker: BrokerProcess) -> dict[str, float]:
    """The broker's icelog_intake_fsync_seconds histogram: cumulative count per bucket bound, and the sum."""
    text = urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("icelog_intake_fsync_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[bound] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("icelog_intake_fsync_seconds_sum"):
            out["sum"] = float(line.rsplit(" ", 1)[1])
    return out


def fsync_summary(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The group commits' fdatasync between two scrapes: count, mean ms, and the share over 10 and 50 ms (the
    archiver's writes to the same disk slow the broker's fsyncs: what ack p99 feels)."""
    count = after.get("+Inf", 0) - before.get("+Inf", 0)
    if not count:
        return {"count": 0}

    def over(bound: str) -> float:
        return round(1 - (after.get(bound, 0) - before.get(bound, 0)) / count, 4)

    return {
        "count": int(count),
        "mean_ms": round((after.get("sum", 0) - before.get("sum", 0)) / count * 1000, 2),
        "over_10ms": over("0.01"),
        "over_50ms": over("0.05"),
    }


def ack_latency_without_archiver(
    broker: BrokerProcess, seconds: float, rate_mb: float
) -> tuple[list[float], dict[str, float]]:
    """The same steady produce to a topic that is not archived, with no archiver running: the ack latencies, and
    the broker's fsyncs meanwhile (fsync_histogram)."""
    topic = "bench-no-archive"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    if topic not in admin.list_topics(timeout=30).topics:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"icelog.archive.kind": "none"})])[topic].result(30)
    before = fsync_histogram(broker)
    _sent, acks, _elapsed = steady_produce(producer(broker.bootstrap), topic, seconds, rate_mb)
    return acks, {key: value - before.get(key, 0) for key, value in fsync_histogram(broker).items()}


def freshness(broker: BrokerProcess, settings: Any, spark: Any, seconds: float, rate_mb: float) -> dict[str, Any]:
    """Steady produce at rate_mb MB/s while `icelog archive` runs; CreateTime → snapshot commit latency."""
    topic = "bench-fresh"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # The broker's embedded registry, on the port the bench broker serves it (not the default 8081).
    env = {"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_REGISTRY_LISTEN": settings.registry_listen}
    prod = producer(broker.bootstrap)
    with running_archiver(broker.data_dir, settings.metadata_url, topic, prod, env, "archiver.log") as child:
        before = fsync_histogram(broker)
        sent, acks, elapsed = steady_produce(prod, topic, seconds, rate_mb)
        fsyncs = fsync_summary(before, fsync_histogram(broker))
        child.wait_caught_up(180)
    table = load_table(spark, quote_identifier(settings.archive.catalog_name, "icelog", topic))
    latencies, snapshots = freshness_latencies(table, sent)
    return {
        "records": len(latencies),
        "seconds": round(elapsed, 1),
        "achieved_mb_s": round(len(latencies) * RECORD_SIZE / elapsed / 1e6, 2),
        "snapshots": snapshots,
        "archiver_passes": pass_stats(child.log_path, topic),
        "p50_s": round(percentile(latencies, 0.5), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "max_s": round(latencies[-1], 2),
        "mean_s": round(statistics.fmean(latencies), 2),
        "produce_ack_with_archiver": {**ack_summary(acks), "fsync": fsyncs},
    }


def throughput(
    args: argparse.Namespace, broker: BrokerProcess, settings: Any, store: Any, spark: Any, work: Path,
    results: dict[str, Any],
) -> None:
    """Decode rates, one archive pass over --records records, and Spark's Parquet → Iceberg append of the same rows."""
    topic = "bench-archive"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    produce_s = produce_bulk(broker.bootstrap, topic, args.records)
    results["produce_records_s"] = round(args.records / produce_s)
    print(f"produced {args.records} records in {produce_s:.1f}s", flush=True)

    topic_id = store.get_topic(topic).topic_id
    intake_bytes = sum(c.length for c in store.intake_chunks(topic_id))
    results["decode_single_process_records_s"] = {
        k: round(v) for k, v in decode_benchmark(settings, store, topic_id).items()
    }
    print("decode", results["decode_single_process_records_s"], flush=True)

    archiver = Archiver(settings, spark, store)
    warm_up(broker, settings, spark, archiver, work)  # both paths measured with a warm JVM and workers
    archiver.ensure_table(archiver.topic_config(store.get_topic(topic)))  # table DDL is not the job
    started = time.perf_counter()
    [result] = archiver.run_pass(force=True, topics=[topic])
    archive_s = time.perf_counter() - started
    assert not result.error and result.records == args.records, result
    payload_mb = args.records * RECORD_SIZE / 1e6
    results["archive"] = {
        "seconds": round(archive_s, 2),
        "records_s": round(args.records / archive_s),
        "payload_mb_s": round(payload_mb / archive_s, 2),
        "intake_mb_s": round(intake_bytes / 1e6 / archive_s, 2),
        "archives": result.archives,
    }
    print("archive", results["archive"], flush=True)

    # Baseline: the same rows as Parquet on disk, appended by Spark to an identical table.
    source = spark.table(f"icelog.`{topic}`")
    parquet_dir = work / "baseline-parquet"
    source.repartition(PARTITIONS, "kafka.partition").write.parquet(str(parquet_dir))
    for statement in archive_table_ddl(settings.archive.catalog_name, "bench", "baseline").statements:
        spark.sql(statement)
    started = time.perf_counter()
    (
        spark.read.parquet(str(parquet_dir))
        .writeTo("bench.baseline")
        .option("use-table-distribution-and-ordering", "false")
        .append()
    )
    baseline_s = time.perf_counter() - started
    results["baseline"] = {
        "seconds": round(baseline_s, 2),
        "records_s": round(args.records / baseline_s),
        "payload_mb_s": round(payload_mb / baseline_s, 2),
    }
    results["archive_vs_baseline"] = round(baseline_s / archive_s, 2)
    print("baseline", results["baseline"], "ratio", results["archive_vs_baseline"], flush=True)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--freshness-seconds", type=float, default=60)
    parser.add_argument("--rate-mb", type=float, default=5.0)
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--freshness-only", action="store_true", help="skip the archive and baseline passes")
    parser.add_argument("--quick", action="store_true", help="500 k records and 30 s of steady produce")
    parser.add_argument("--out", default="archive_bench.json", help="results file under bench/results")
    args = parser.parse_args()
    if args.quick:
        args.records, args.freshness_seconds = min(args.records, 500_000), min(args.freshness_seconds, 30)

    work = Path(tempfile.mkdtemp(prefix="icelog-archive-bench-"))
    broker = BrokerProcess(
        work / "data",
        env={
            "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
            "ICELOG_ARCHIVE__ENABLED": "false",
        },
    ).start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records,
        "record_bytes": RECORD_SIZE,
        "partitions": PARTITIONS,
    }
    try:
        # The archiver reads schemas from the bench broker's embedded registry (its own free port).
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        from icelog.lake.spark import create_session

        store = open_store(settings.metadata_url)
        spark = create_session(settings, "icelog-archive-bench")
        if not args.freshness_only:
            throughput(args, broker, settings, store, spark, work, results)
        if not args.skip_freshness:
            # Without the archiver before and after the run with it (alternated: a busy spell of the machine
            # shows on both sides), a quarter of the freshness run each.
            acks, fsyncs = ack_latency_without_archiver(broker, args.freshness_seconds / 4, args.rate_mb)
            results["freshness"] = freshness(broker, settings, spark, args.freshness_seconds, args.rate_mb)
            print("freshness", results["freshness"], flush=True)
            after, more = ack_latency_without_archiver(broker, args.freshness_seconds / 4, args.rate_mb)
            results["produce_ack_without_archiver"] = {
                **ack_summary(acks + after),
                "fsync": fsync_summary({}, {key: value + more.get(key, 0) for key, value in fsyncs.items()}),
                "p99_ms_before_after": [ack_summary(acks)["p99_ms"], ack_summary(after)["p99_ms"]],
            }
            print("ack latency without archiver", results["produce_ack_without_archiver"], flush=True)
            with_p99 = results["freshness"]["produce_ack_with_archiver"]["p99_ms"]
            results["ack_p99_with_vs_without"] = round(with_p99 / results["produce_ack_without_archiver"]["p99_ms"], 2)
        spark.stop()
        store.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
