"""Read-back benchmark: kcat consuming from the Iceberg table against kcat consuming from the intake.

Run: .venv/bin/python bench/readback_bench.py [--records 1000000] [--seeks 50]
     .venv/bin/python bench/readback_bench.py --records 10000000 --seek-only   # seeks in a 10 M-record partition

One run, one broker, one partition of `--records` records of 1 KiB (lz4 from confluent-kafka):
  1. kcat reads them all from the intake (the topic keeps its intake: icelog.intake.retention.ms -1);
  2. one archive pass writes the table (the real Spark archiver, default archive size), then the topic's
     icelog.intake.retention.ms is set to 0 and the intake is trimmed;
  3. kcat reads the same records from the table: cold (batches built from Parquet) and again (the LRU
     of built batches, `archive.readback_cache_bytes`, holds what fits);
  4. first-record latency of `--seeks` seeks to random offsets in the table range (a confluent-kafka
     consumer assigned at the offset; time from assign to the first record), p50 / p95.
Targets (issue 9): table >= 100 MB/s and >= 0.3 x intake; seek p50 <= 50 ms (on 10 M records).

With `--on s3` the intake and the warehouse are in a bucket (SeaweedFS's `weed mini` on the same cores,
tests/support/seaweedfs.py): the pass archives from the S3 intake and kcat reads the table on S3; `--on s3-intake`
keeps only the intake there. `--on both` runs the three set-ups one after the other and reports, against local,
the archive pass from the S3 intake (tables local, and tables on S3) and the cold read of the table on S3 (issue 44:
archive from the S3 intake >= 0.8 of local, read-back from a table on S3 >= 100 MB/s).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import send_all, write_results  # noqa: E402

from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.seaweedfs import BUCKET, SeaweedFS  # noqa: E402

RECORD_SIZE = 1024
TOPIC = "bench-readback"


def produce(bootstrap: str, records: int) -> float:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5,
                        "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
                        "queue.buffering.max.messages": 2_000_000})
    filler = bytes(RECORD_SIZE // 2)
    return send_all(prod, records, lambda i: prod.produce(
        TOPIC, value=os.urandom(RECORD_SIZE // 2) + filler, key=b"%d" % i, partition=0))


def kcat_read(bootstrap: str, records: int) -> float:
    """Seconds for kcat to read `records` records of partition 0 from offset 0 (output to /dev/null)."""
    start = time.perf_counter()
    subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", TOPIC, "-p", "0", "-o", "beginning", "-c", str(records),
                    "-q", "-f", "%o\\n", "-X", "fetch.message.max.bytes=8388608"],
                   check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return time.perf_counter() - start


def warm_up(bootstrap: str, admin: AdminClient, archiver: Archiver) -> None:
    """One small pass first (another topic), so that the timed pass pays no JVM or Python-worker start."""
    admin.create_topics([NewTopic("warm-up", 1, 1)])["warm-up"].result(30)
    prod = ck.Producer({"bootstrap.servers": bootstrap})
    for i in range(1000):
        prod.produce("warm-up", value=b"%d" % i)
    assert prod.flush(30) == 0
    assert [r.error for r in archiver.run_pass(force=True, topics={"warm-up"})] == [""]


def seek_latencies(bootstrap: str, records: int, seeks: int) -> list[float]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-seek", "enable.auto.commit": False,
                            "fetch.wait.max.ms": 100})
    rnd = random.Random(1)
    out = []
    try:
        for _ in range(seeks):
            offset = rnd.randrange(records)
            start = time.perf_counter()
            consumer.assign([ck.TopicPartition(TOPIC, 0, offset)])
            while True:
                msg = consumer.poll(30)
                assert msg is not None and msg.error() is None, msg and msg.error()
                if msg.offset() >= offset:
                    break
            out.append(time.perf_counter() - start)
            assert msg.offset() == offset, (msg.offset(), offset)
            consumer.unassign()
    finally:
        consumer.close()
    return out


def measure(args: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """One broker on `env`: produce, read from the intake, archive, trim, read from the table, seek."""
    work.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
                                               "ICELOG_ARCHIVE__ENABLED": "false",
                                               "ICELOG_RETENTION_CHECK_INTERVAL_MS": "200", **env}).start()
    mb = args.records * RECORD_SIZE / 1e6
    results: dict[str, Any] = {}
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={
            "icelog.intake.retention.ms": "-1",
            "icelog.archive.max.lag.bytes": str(1 << 40),  # no archiver runs while producing: no back-pressure
        })])[TOPIC].result(30)
        print(f"produced {args.records} records in {produce(broker.bootstrap, args.records):.1f}s", flush=True)
        if not args.seek_only:
            intake_s = kcat_read(broker.bootstrap, args.records)
            results["intake_mb_s"] = round(mb / intake_s, 1)
            print("intake", results["intake_mb_s"], "MB/s", flush=True)

        overrides: dict[str, Any] = {}
        if env:  # the archiver of this process reads the same bucket
            overrides = {"intake": {"url": env["ICELOG_INTAKE__URL"]}}
            if "ICELOG_ARCHIVE__WAREHOUSE" in env:
                overrides["archive"] = {"warehouse": env["ICELOG_ARCHIVE__WAREHOUSE"]}
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}",
                                 **overrides)
        store = open_store(settings.metadata_url)
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-readback-bench")
        warm_up(broker.bootstrap, admin, Archiver(settings, spark, store))
        start = time.perf_counter()
        assert [r.error for r in Archiver(settings, spark, store).run_pass(force=True, topics={TOPIC})] == [""]
        results["archive_s"] = round(time.perf_counter() - start, 1)
        results["archive_mb_s"] = round(mb / results["archive_s"], 1)
        files = spark.sql(f"SELECT count(*) AS n FROM lake.icelog.`{TOPIC}`.files").collect()[0].n
        results["table_files"] = files
        spark.stop()
        resource = ConfigResource("topic", TOPIC, set_config={"icelog.intake.retention.ms": "0"})
        admin.alter_configs([resource])[resource].result(30)
        topic_id = store.get_topic(TOPIC).topic_id
        deadline = time.monotonic() + 120
        while store.partitions(topic_id)[0].log_start_offset < args.records:
            assert time.monotonic() < deadline, "the intake was not trimmed"
            time.sleep(0.2)
        store.close()

        if not args.seek_only:
            cold = kcat_read(broker.bootstrap, args.records)
            again = kcat_read(broker.bootstrap, args.records)
            results["table_cold_mb_s"] = round(mb / cold, 1)
            results["table_again_mb_s"] = round(mb / again, 1)
            results["table_vs_intake"] = round(intake_s / cold, 2)
            print("table", results["table_cold_mb_s"], results["table_again_mb_s"], "MB/s", flush=True)
        lat = seek_latencies(broker.bootstrap, args.records, args.seeks)
        results["seek_first_record_ms"] = {
            "p50": round(statistics.median(lat) * 1000, 1),
            "p95": round(sorted(lat)[int(len(lat) * 0.95) - 1] * 1000, 1),
            "max": round(max(lat) * 1000, 1),
        }
        print("seek", results["seek_first_record_ms"], flush=True)
    finally:
        broker.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seeks", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the broker's data directory and log")
    parser.add_argument("--seek-only", action="store_true", help="skip the kcat reads (a large partition's seeks)")
    parser.add_argument("--on", choices=("local", "s3", "s3-intake", "both"), default="local",
                        help="where the intake and the warehouse are: the data dir, both in a bucket, only the "
                        "intake in a bucket, or each of these in turn")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icelog-readback-bench-"))
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records, "record_bytes": RECORD_SIZE,
    }
    # S3 first: the JVM outlives a stopped session, and jars it loaded (S3A's) are the ones the next session has.
    kinds = ["s3", "s3-intake", "local"] if args.on == "both" else [args.on]
    # One store for both S3 set-ups: Spark's Python workers outlive a session too, with the environment they
    # started with (the store's endpoint).
    store = SeaweedFS(work / "seaweedfs").start() if args.on != "local" else None
    try:
        if store is not None:
            os.environ.update(store.env())  # this process's Spark and pyiceberg reach the bucket
        for kind in kinds:
            key = kind if len(kinds) > 1 else "figures"
            env = {}
            if store is not None and kind != "local":
                env = {**store.env(), "ICELOG_INTAKE__URL": f"s3://{BUCKET}/intake-{kind}"}
                if kind == "s3":
                    env["ICELOG_ARCHIVE__WAREHOUSE"] = f"s3://{BUCKET}/warehouse"
            results[key] = measure(args, work / kind, env)
        if len(kinds) > 1 and not args.seek_only:
            local, s3, s3_intake = results["local"], results["s3"], results["s3-intake"]
            results["s3_vs_local"] = {
                "archive_from_s3_intake": round(local["archive_s"] / s3_intake["archive_s"], 2),
                "archive_s3_intake_to_s3_table": round(local["archive_s"] / s3["archive_s"], 2),
                "table_cold": round(s3["table_cold_mb_s"] / local["table_cold_mb_s"], 2)}
        else:
            results.update(results.pop("figures"))
    finally:
        if store is not None:
            store.stop()
        if args.keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    suffix = "_seek" if args.seek_only else "" if args.on == "local" else f"_{args.on}"
    write_results(f"readback_bench{suffix}.json", results)


if __name__ == "__main__":
    main()
