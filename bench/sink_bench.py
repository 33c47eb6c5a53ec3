"""Sink benchmark (issue 33): `icelog sink` against the built-in archiver on the same records, and its freshness.

Run: .venv/bin/python bench/sink_bench.py [--records 10000000] [--rounds 2] [--seconds 60] [--rate-mb 5]
     .venv/bin/python bench/sink_bench.py --records 2000 --rounds 1 --seconds 1 --rate-mb 0.5 --out none   # a check run

A source broker with archiving off stands in for the external Kafka cluster (as tests/sink/test_sink.py does). One
run measures, on the same machine and moment:
  1. throughput: `--records` keyed records of 100 bytes (lz4, 4 partitions) produced to one source topic per
     round, the same records in each; then, per round, one forced pass of the sink over the topic (its tasks fetch
     from the source, read_committed, as `icelog sink --once` does) and one forced pass of the built-in archiver
     over the same topic (the source broker's own intake files, as `icelog archive --once` beside the broker
     does), alternated ABBA across rounds. Both run in this process on one warm Spark session (the archiver's
     default master, half the cores) into one fresh lake, so the JVM's start is in neither figure (as
     bench/archive_bench.py times its pass). records/s of each, and sink / built-in (target >= 0.8);
  2. freshness: `icelog sink` running continuously in a process of its own (default archive delays) while a
     steady `--rate-mb` MB/s goes to the source for `--seconds`; for every record, the time from its CreateTime
     (set as it is produced, before its acknowledgement) to the commit of the first snapshot of the sink's table
     holding it, read with pyiceberg, as bench/archive_bench.py measures built-in topics (targets p50 <= 2 s,
     p99 <= 5 s); the baseline, just before: the same produce to a topic of the source broker itself with
     `icelog archive` running beside it (the built-in topics' freshness at the same moment).
Figures go to bench/results/sink_bench.json (BENCHMARKS.md quotes them), with the load average around each part.
"""

from __future__ import annotations

import argparse
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

import yaml

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
from archive_bench import (  # noqa: E402
    PARTITIONS,
    RECORD_SIZE,
    create_topic,
    producer,
    steady_produce,
    values,
)

from icelog.archive.reconcile import OFFSETS_PROPERTY, decode_offsets  # noqa: E402
from icelog.config import Settings, load_settings  # noqa: E402
from tests.support.archive import ARCHIVE_ENV  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

START_TIMEOUT_S = 600  # the sink child's first pass includes its Spark start (minutes on a loaded machine)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def produce_keyed(bootstrap: str, topic: str, records: int, pool: list[bytes]) -> float:
    """`records` records with 12-byte keys and 100-byte values from `pool` (the same records for every topic):
    seconds taken."""
    prod = producer(bootstrap)
    return send_all(prod, records, lambda i: prod.produce(
        topic, key=b"key-%08d" % (i % 100_000_000), value=pool[i % len(pool)], partition=i % PARTITIONS))


def lake_settings(lake: Path, bootstrap: str, sinks: dict[str, str]) -> Settings:
    """The sink side's settings: a lake of its own (metadata store, catalog, warehouse) and sinks → topic."""
    return load_settings(data_dir=str(lake), sinks={
        name: {"bootstrap_servers": bootstrap, "topics": [topic]} for name, topic in sinks.items()})


def builtin_settings(source: BrokerProcess, lake: Settings) -> Settings:
    """The built-in archiver on the source broker's data dir (its intake and metadata), writing to `lake`'s
    catalog and warehouse so that one Spark session serves both."""
    # (The schemas come from the source broker's embedded registry, on its own free port.)
    settings = load_settings(data_dir=str(source.data_dir), registry_listen=f"127.0.0.1:{source.registry_port}")
    archive = settings.archive.model_copy(update={
        "default_kind": "iceberg", "catalog_uri": lake.catalog_uri, "warehouse": lake.warehouse})
    return settings.model_copy(update={"archive": archive})


def sink_pass(lake: Settings, name: str, spark: Any, records: int) -> float:
    """Seconds of one `icelog sink --once` pass of sink `name` (in this process, on `spark`)."""
    from icelog.sink.service import SinkService

    service = SinkService(lake, name)
    try:
        service.acquire(0)
        service.attach(spark)
        started = time.perf_counter()
        results = service.service.run_once(force=True)
        elapsed = time.perf_counter() - started
    finally:
        service.close()
    assert [(r.error, r.records) for r in results] == [("", records)], results
    return elapsed


def builtin_pass(settings: Settings, topic: str, spark: Any, records: int) -> float:
    """Seconds of one `icelog archive --once --topic T` pass (in this process, on `spark`)."""
    from icelog.archive.service import ArchiveService

    service = ArchiveService(settings, spark=spark)
    try:
        started = time.perf_counter()
        results = service.run_once(force=True, topics=[topic])
        elapsed = time.perf_counter() - started
    finally:
        service.close()
    assert [(r.error, r.records) for r in results] == [("", records)], results
    return elapsed


def throughput(source: BrokerProcess, work: Path, records: int, rounds: int) -> dict[str, Any]:
    """Sink against built-in passes over the same records, alternated (ABBA across rounds)."""
    from icelog.lake.spark import create_session

    pool = values(1000)
    warm = min(20_000, records)  # (no more than a round: a check run's small sizes stay small)
    topics = ["warm-up"] + [f"bench-sink-{n}" for n in range(1, rounds + 1)]
    names = {"warm-up": "warm", **{f"bench-sink-{n}": f"s{n}" for n in range(1, rounds + 1)}}  # sink → namespace
    produce_s = []
    for topic in topics:
        create_topic(source.bootstrap, topic, PARTITIONS)
        produce_s.append(produce_keyed(source.bootstrap, topic, warm if topic == "warm-up" else records, pool))
        print(f"produced {topic} in {produce_s[-1]:.1f} s", flush=True)
    lake = lake_settings(work / "lake", source.bootstrap, {names[t]: t for t in topics})
    builtin = builtin_settings(source, lake)
    spark = create_session(builtin, "icelog-sink-bench")
    out: dict[str, Any] = {"produce_records_s": round(records * rounds / sum(produce_s[1:])),
                           "sink_s": [], "builtin_s": [], "load_before": load()}
    try:
        sink_pass(lake, "warm", spark, warm)  # JIT, Python workers, the catalog: warm for both
        builtin_pass(builtin, "warm-up", spark, warm)
        for n, topic in enumerate(topics[1:]):
            order = ("builtin", "sink") if n % 2 == 0 else ("sink", "builtin")
            for which in order:
                if which == "sink":
                    seconds = sink_pass(lake, names[topic], spark, records)
                else:
                    seconds = builtin_pass(builtin, topic, spark, records)
                out[f"{which}_s"].append(round(seconds, 2))
                print(f"round {n + 1}: {which} {records / seconds:,.0f} records/s ({seconds:.1f} s), "
                      f"load {load()}", flush=True)
    finally:
        spark.stop()
    out["load_after"] = load()
    sink_rates = [records / s for s in out["sink_s"]]
    builtin_rates = [records / s for s in out["builtin_s"]]
    out["sink_records_s"] = [round(r) for r in sink_rates]
    out["builtin_records_s"] = [round(r) for r in builtin_rates]
    out["round_ratios"] = [round(s / b, 3) for s, b in zip(sink_rates, builtin_rates, strict=True)]
    out["sink_over_builtin"] = round(statistics.fmean(sink_rates) / statistics.fmean(builtin_rates), 3)
    return out


class _Snapshot:
    """A pyiceberg snapshot seen as _common.freshness_latencies reads one (the Java API's names)."""

    def __init__(self, snapshot: Any) -> None:
        self._snapshot = snapshot

    def timestampMillis(self) -> int:  # noqa: N802 - the Java API's name
        return int(self._snapshot.timestamp_ms)

    def summary(self) -> dict[str, str]:
        return dict(self._snapshot.summary.additional_properties) if self._snapshot.summary else {}


class _Snapshots:
    def __init__(self, table: Any) -> None:
        self._table = table

    def snapshots(self) -> list[_Snapshot]:
        return [_Snapshot(s) for s in self._table.snapshots()]


def lake_table(lake: Path, name: tuple[str, str]) -> Any:
    """The sink's table in `lake`, read with pyiceberg (None until the sink created its catalog and the table)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from sqlalchemy.exc import OperationalError

    if not (lake / "catalog.db").exists():  # the sink's JDBC catalog makes it: never create it here
        return None
    # Nor its tables: the JDBC catalog may have made the file and not yet its tables, and pyiceberg creating them
    # at the same moment failed the run ("table iceberg_tables already exists").
    catalog = SqlCatalog("lake", uri=f"sqlite:///{lake / 'catalog.db'}", warehouse=(lake / "warehouse").as_uri(),
                         init_catalog_tables="false")
    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError, OperationalError):  # (OperationalError: no catalog tables yet)
        return None


def table_offsets(lake: Path, name: tuple[str, str]) -> dict[int, int]:
    """The offsets map of the table's current snapshot ({} before the table or its first commit)."""
    table = lake_table(lake, name)
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None or snapshot.summary is None:
        return {}
    encoded = snapshot.summary.additional_properties.get(OFFSETS_PROPERTY)
    return decode_offsets(encoded) if encoded else {}


def latency_figures(latencies: list[float], sent_seconds: float, snapshots: int) -> dict[str, Any]:
    return {
        "records": len(latencies),
        "seconds": round(sent_seconds, 1),
        "achieved_mb_s": round(len(latencies) * RECORD_SIZE / sent_seconds / 1e6, 2),
        "snapshots": snapshots,
        "p50_s": round(percentile(latencies, 0.5), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "max_s": round(latencies[-1], 2),
        "mean_s": round(statistics.fmean(latencies), 2),
    }


def builtin_freshness(source: BrokerProcess, work: Path, seconds: float, rate_mb: float) -> dict[str, Any]:
    """The baseline: the same steady produce to a topic of the source broker itself with `icelog archive` running
    beside it (bench/archive_bench.py's freshness), into the throughput part's lake."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = "bench-builtin-fresh"
    admin = AdminClient({"bootstrap.servers": source.bootstrap})  # held: a collected client fails its futures
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"icelog.archive.kind": "iceberg"})])[topic].result(30)
    lake = lake_settings(work / "lake", source.bootstrap, {})
    env = {"ICELOG_ARCHIVE__DEFAULT_KIND": "none",  # only this topic: the others are archived, or the sink's
           "ICELOG_ARCHIVE__CATALOG_URI": lake.catalog_uri, "ICELOG_ARCHIVE__WAREHOUSE": lake.warehouse,
           "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{source.registry_port}"}
    prod = producer(source.bootstrap)
    settings = load_settings(data_dir=str(source.data_dir))
    with running_archiver(source.data_dir, settings.metadata_url, topic, prod, env, "archiver.log") as child:
        load_before = load()
        sent, _acks, elapsed = steady_produce(prod, topic, seconds, rate_mb)
        load_after = load()
        child.wait_caught_up(300)
    latencies, snapshots = freshness_latencies(_Snapshots(lake_table(work / "lake", ("icelog", topic))), sent)
    return {**latency_figures(latencies, elapsed, snapshots), "archiver_passes": pass_stats(child.log_path, topic),
            "load_before": load_before, "load_after": load_after}


def freshness(source: BrokerProcess, work: Path, seconds: float, rate_mb: float) -> dict[str, Any]:
    """`icelog sink` running continuously while `rate_mb` MB/s go to the source: CreateTime → snapshot commit."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, name = "bench-sink-fresh", "fresh"
    admin = AdminClient({"bootstrap.servers": source.bootstrap})  # the source's archiver leaves this topic alone
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"icelog.archive.kind": "none"})])[topic].result(30)
    lake = work / "fresh-lake"
    config = work / "fresh.yaml"
    config.write_text(yaml.safe_dump({"sinks": {name: {"bootstrap_servers": source.bootstrap, "topics": [topic]}}}))
    log_path = work / "sink.log"
    env = {**os.environ, "ICELOG_ARCHIVE__ENABLED": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "icelog", "--config", str(config), "sink", "--data-dir", str(lake)],
        stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115 - the child owns it
    )
    table_name = (name, topic)
    prod = producer(source.bootstrap)
    try:
        prod.produce(topic, value=b"warm-up", partition=0)  # the sink's first pass: its Spark is up
        prod.flush(30)
        started = time.monotonic()
        while not table_offsets(lake, table_name).get(0):
            if time.monotonic() - started > START_TIMEOUT_S or proc.poll() is not None:
                raise RuntimeError("the sink did not start:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        load_before = load()
        sent, acks, elapsed = steady_produce(prod, topic, seconds, rate_mb)
        load_after = load()
        probe = Consumer({"bootstrap.servers": source.bootstrap, "group.id": "sink-bench-probe"})
        ends = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
        probe.close()
        deadline = time.monotonic() + 300
        while table_offsets(lake, table_name) != ends:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the sink did not catch up:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
    latencies, snapshots = freshness_latencies(_Snapshots(lake_table(lake, table_name)), sent)
    return {**latency_figures(latencies, elapsed, snapshots), "sink_passes": pass_stats(log_path, topic),
            "produce_ack_p99_ms": round(percentile(sorted(acks), 0.99) * 1000, 1),
            "load_before": load_before, "load_after": load_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000, help="records per throughput round")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds (each: one sink, one built-in pass)")
    parser.add_argument("--seconds", type=float, default=60, help="steady produce of the freshness part")
    parser.add_argument("--rate-mb", type=float, default=5.0)
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--out", default="sink_bench.json", help="bench/results/<name>; none: print only")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="icelog-sink-bench-"))
    source = BrokerProcess(work / "source", env=ARCHIVE_ENV).start()  # archiving off: the external cluster
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records,
        "rounds": args.rounds,
        "record_bytes": RECORD_SIZE,
        "partitions": PARTITIONS,
    }
    try:
        results["throughput"] = throughput(source, work, args.records, args.rounds)
        print("throughput", results["throughput"], file=sys.stderr, flush=True)
        if not args.skip_freshness:
            results["builtin_freshness"] = builtin_freshness(source, work, args.seconds, args.rate_mb)
            print("built-in freshness", results["builtin_freshness"], file=sys.stderr, flush=True)
            results["freshness"] = freshness(source, work, args.seconds, args.rate_mb)
            print("freshness", results["freshness"], file=sys.stderr, flush=True)
            results["freshness_p50_sink_over_builtin"] = round(
                results["freshness"]["p50_s"] / results["builtin_freshness"]["p50_s"], 2)
    finally:
        source.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out == "none":  # a check run (tests/system/test_benches.py): print, keep no figures
        print(json.dumps(results, indent=2))
    else:
        write_results(args.out, results)


if __name__ == "__main__":
    main()
