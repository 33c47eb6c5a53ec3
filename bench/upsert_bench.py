"""Upsert benchmark: one archive pass into a primary-key table against a plain append and Spark MERGE INTO.

Run: .venv/bin/python bench/upsert_bench.py [--seed 200000] [--batch 100000] [--updates 0.1]

One run, same machine and moment (a real broker, confluent-kafka producing, the real archiver):
  1. three table-layout topics get the same `--seed` records (distinct keys): `append` (plain),
     `upsert` (cleanup.policy=compact) and `merge` (compact too: the MERGE baseline's target), archived;
  2. the same batch of `--batch` records (`--updates` of them update seeded keys, the rest are new) goes to
     each; one archive pass of `append` and of `upsert` is timed (ratio append time / upsert time; target
     >= 0.5);
  3. baseline: the batch's rows (read from the append table) MERGE INTO the `merge` table with Spark SQL
     (merge-on-read: Spark writes DVs too); ratio MERGE time / upsert time (target >= 3).
Not measured yet: the same batch into a 1 M-row and a 10 M-row table (cost independent of table size).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import BrokerProcess  # noqa: E402

from icelog.config import load_settings  # noqa: E402
from icelog.lake.spark import create_session  # noqa: E402
from icelog.meta.store import open_store  # noqa: E402
from icelog.pipeline.archiver import Archiver  # noqa: E402

PARTITIONS = 4
ENV = {"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_ARCHIVE__ENABLED": "false"}


def produce(bootstrap: str, topic: str, keys: list[int], tag: str) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for n, key in enumerate(keys):
        producer.produce(topic, key=f"k{key:09d}".encode(), value=(f"{tag}{key}-".encode() * 20)[:100])
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def timed_pass(archiver: Archiver, topic: str) -> float:
    start = time.perf_counter()
    [result] = archiver.run_pass(force=True, topics=[topic])
    elapsed = time.perf_counter() - start
    assert not result.error, result.error
    print(f"  {topic}: {result.records} records in {elapsed:.1f} s", flush=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--updates", type=float, default=0.1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("icelog.pipeline.upsert").setLevel(logging.INFO)  # where an upsert pass's time goes
    workdir = Path(tempfile.mkdtemp(prefix="upsert-bench-"))
    broker = BrokerProcess(workdir / "data", env=ENV).start()
    try:
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen="off")
        spark = create_session(settings, "upsert-bench")
        store = open_store(settings.metadata_url)
        archiver = Archiver(settings, spark, store)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        configs = {"append": {"icelog.archive.layout": "table"},
                   "upsert": {"icelog.archive.layout": "table", "cleanup.policy": "compact"},
                   "merge": {"icelog.archive.layout": "table", "cleanup.policy": "compact"}}
        for topic, config in configs.items():
            admin.create_topics([NewTopic(topic, PARTITIONS, config=config)])[topic].result(30)
        seed = list(range(args.seed))
        updated = max(1, int(args.batch * args.updates))
        batch = list(range(0, args.seed, max(1, args.seed // updated)))[:updated]
        batch += list(range(args.seed, args.seed + args.batch - len(batch)))
        print(f"seed {args.seed} keys, batch {len(batch)} records ({updated} updates)", flush=True)
        for topic in configs:
            produce(broker.bootstrap, topic, seed, "a")
            timed_pass(archiver, topic)
        for topic in configs:
            produce(broker.bootstrap, topic, batch, "b")
        append_s = timed_pass(archiver, "append")
        upsert_s = timed_pass(archiver, "upsert")
        spark.sql("SELECT * FROM icelog.append WHERE substring(__value, 1, 1) = X'62'"
                  ).createOrReplaceTempView("batch_rows")
        start = time.perf_counter()
        spark.sql("MERGE INTO icelog.merge t USING batch_rows s ON t.__key = s.__key "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").collect()
        merge_s = time.perf_counter() - start
        print(f"  MERGE INTO: {merge_s:.1f} s", flush=True)
        counts = {t: spark.sql(f"SELECT count(*) AS n FROM icelog.{t}").collect()[0].n for t in configs}
        print(f"rows: {counts} (upsert and merge must be equal)")
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
        print(f"upsert/append throughput ratio: {append_s / upsert_s:.2f} (target >= 0.5)")
        print(f"MERGE time / upsert time: {merge_s / upsert_s:.2f} (target >= 3)")
        store.close()
        spark.stop()
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
