"""Archive read path benchmark: the same data read over the Kafka protocol against read from the intake files.

Run: .venv/bin/python bench/archive_read_via_bench.py [--records 1000000] [--no-spark]

One run, one broker, topics holding the same records (100-byte values, lz4, 4 partitions):
  1. decode only, one Python process (no Spark): every planned archive of a topic decoded to Arrow rows,
     its batches read by pread from the intake files, then by Fetch requests over loopback (records/s);
  2. unless --no-spark: forced archive passes on Spark local[2], tasks reading files against tasks reading
     over Kafka, in ABBA order, the best of each (records/s; target: Kafka >= 0.8 x files);
  3. the same pass on a standalone cluster (a master and one worker with 2 cores, from pyspark's spark-class)
     against local[2], both reading over Kafka.
Figures go to bench/results/archive_read_via.json (BENCHMARKS.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402
from archive_bench import PARTITIONS, create_topic, produce_bulk  # noqa: E402

from icelog.archive.decode import decode_archive  # noqa: E402
from icelog.archive.intake_source import ChunkSource, KafkaFetch, source_of  # noqa: E402
from icelog.archive.plan import PlannedArchive, plan_partition  # noqa: E402
from icelog.client.properties import parse  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from icelog.table.config import archive_config  # noqa: E402
from tests.support.archive import ARCHIVE_ENV  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402


def planned(settings: Any, topic: str) -> list[PlannedArchive]:
    """The archives a forced pass would write now (the default max.bytes)."""
    store = open_store(settings.metadata_url)
    try:
        record = store.get_topic(topic)
        config = archive_config(topic, {}, {}, settings.archive)
        out: list[PlannedArchive] = []
        for part in store.partitions(record.topic_id):
            chunks = store.intake_chunks_after(record.topic_id, part.partition, 0, 1_000_000)
            out += plan_partition(chunks, 0, part.high_watermark, config, now_ms=0, force=True)
        return out
    finally:
        store.close()


def decode_rate(source: ChunkSource, archives: list[PlannedArchive]) -> float:
    started = time.perf_counter()
    rows = sum(batch.num_rows for archive in archives for batch in decode_archive(source, archive))
    return rows / (time.perf_counter() - started)


def timed_pass(settings: Any, spark: Any, store: Any, topic: str, records: int, read_via: str) -> float:
    """records/s of one forced archive pass of `topic`, its tasks reading `read_via`."""
    from icelog.archive.archiver import Archiver

    via = settings.model_copy(update={"archive": settings.archive.model_copy(update={"read_via": read_via})})
    archiver = Archiver(via, spark, store)
    started = time.perf_counter()
    [result] = archiver.run_pass(force=True, topics=[topic])
    elapsed = time.perf_counter() - started
    archiver.close()
    assert not result.error and result.records == records, result
    return records / elapsed


def session(settings: Any, master: str) -> tuple[Any, Any]:
    """Settings with `master`, and a Spark session on it."""
    from icelog.lake.spark import create_session

    on = settings.model_copy(update={"archive": settings.archive.model_copy(update={
        "spark_master": master,
        "spark_conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                       "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", "")}})})
    return on, create_session(on, "read-via-bench")


def archive_passes(broker: BrokerProcess, settings: Any, records: int, work: Path) -> dict[str, float]:
    """Archive passes of the same data: files against kafka on local[2] (ABBA order, the best of each), then
    local[2] against a standalone cluster of one worker with 2 cores (both reading over Kafka)."""
    from tests.support.spark_cluster import SparkCluster

    order = [("files", 1), ("kafka", 1), ("kafka", 2), ("files", 2), ("kafka", 3)]
    for name, n in [*order, ("cluster", 1), ("warm-up", 1), ("cluster-warm-up", 1)]:
        create_topic(broker.bootstrap, f"bench-via-{name}-{n}", PARTITIONS)
        produce_bulk(broker.bootstrap, f"bench-via-{name}-{n}", 20_000 if "warm-up" in name else records)
    out: dict[str, float] = {}
    store = open_store(settings.metadata_url)
    local, spark = session(settings, "local[2]")
    timed_pass(local, spark, store, "bench-via-warm-up-1", 20_000, "files")  # JIT, Python workers, the catalog
    for name, n in order[:4]:
        rate = timed_pass(local, spark, store, f"bench-via-{name}-{n}", records, name)
        out[f"archive_{name}_records_s"] = max(out.get(f"archive_{name}_records_s", 0.0), rate)
    out["archive_kafka_over_files"] = out["archive_kafka_records_s"] / out["archive_files_records_s"]
    spark.stop()
    cluster = SparkCluster(work / "spark", cores=2).start()
    try:
        remote, spark = session(settings, cluster.master_url)
        timed_pass(remote, spark, store, "bench-via-cluster-warm-up-1", 20_000, "kafka")
        out["cluster_kafka_records_s"] = timed_pass(remote, spark, store, "bench-via-cluster-1", records, "kafka")
        spark.stop()
    finally:
        cluster.stop()
    local, spark = session(settings, "local[2]")  # local[2] again, after the cluster: the same moment
    out["local_kafka_after_records_s"] = timed_pass(local, spark, store, "bench-via-kafka-3", records, "kafka")
    out["cluster_over_local"] = out["cluster_kafka_records_s"] / max(out["archive_kafka_records_s"],
                                                                     out["local_kafka_after_records_s"])
    spark.stop()
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--out", default="archive_read_via.json", help="bench/results/<name>; none: print only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icelog-read-via-"))
    broker = BrokerProcess(work / "data", env=ARCHIVE_ENV).start()
    results: dict[str, Any] = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "records": args.records,
                               "python": platform.python_version()}
    try:
        settings = load_settings(data_dir=str(broker.data_dir), listen=broker.bootstrap)
        create_topic(broker.bootstrap, "bench-via-decode", PARTITIONS)
        produce_bulk(broker.bootstrap, "bench-via-decode", args.records)
        files = source_of(broker.data_dir / "intake")
        archives = planned(settings, "bench-via-decode")
        kafka = KafkaFetch((broker.bootstrap,), parse({}), "bench-via-decode")
        decode_rate(files, archives[:1])  # warm up: imports, first-call costs, the page cache
        decode_rate(kafka, archives[:1])
        for _ in range(2):  # alternate, keep the best of each: the other helper shares this machine
            for name, source in (("files", files), ("kafka", kafka)):
                rate = decode_rate(source, archives)
                results[f"decode_{name}_records_s"] = max(results.get(f"decode_{name}_records_s", 0.0), rate)
        results["decode_kafka_over_files"] = results["decode_kafka_records_s"] / results["decode_files_records_s"]
        if not args.no_spark:
            results.update(archive_passes(broker, settings, args.records, work))
    finally:
        broker.stop()
    if args.out == "none":  # a check run (tests/system/test_benches.py): print, keep no figures
        print(json.dumps(results, indent=2))
    else:
        write_results(args.out, results)


if __name__ == "__main__":
    main()
