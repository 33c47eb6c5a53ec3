"""Upsert benchmark: one archive pass into primary-key tables of 1 M and 10 M rows, against a plain append and
Spark MERGE INTO of the same batch.

Run: .venv/bin/python bench/upsert_bench.py [--sizes 1000000,10000000] [--batch 100000] [--updates 0.1] [--rounds 3]

One run, same machine and moment (a real broker, confluent-kafka producing, the real archiver):
  1. per size N, a compacted table-layout topic (4 partitions) whose table holds N rows of distinct keys, as
     if N records had been archived and then trimmed from the intake: the archiver creates the table from one
     record per partition, Spark appends the N rows (bucket, offset, key, value as the archiver writes them;
     the offsets map in the snapshot summary), the broker's partitions are moved past them (log start = high
     watermark = the table's offsets: the only direct store edit, with the broker stopped), and one archive
     pass of one record per partition builds the primary-key index from the table (it follows the seed's
     APPEND snapshot from its added files; timed, reported; its records replace the first pass's, so the
     deletion-vector writer is warm before the timed passes, as in a running archiver);
  2. a warm-up round, then `--rounds` times, the same batch of `--batch` records (`--updates` of them update
     seeded keys, others each round; the rest new keys) goes to each topic and to a plain `append` topic; one
     archive pass each is timed: append time / upsert time (target >= 0.5) and the upsert times of the two
     sizes (target <= 1.5x apart);
     (before the timed passes and each MERGE, os.sync(): no write-back of the seed or of the last MERGE
     throttles the next timed writer);
  3. baseline, in the same round: a branch of each upsert table (made at its pre-batch snapshot, before the
     warm-up round) takes the batch's rows (read from the upsert table and cached before timing: MERGE does not
     pay for decoding) by Spark SQL `MERGE INTO` (merge-on-read: Spark writes DVs too); MERGE time / upsert
     time (target >= 3). Both hold equal rows after each round.
The warm-up round is the same work as a timed one, so that the first large pass and the first large MERGE in
the process (up to 0.4 s slower: first large writes in the workers and the JVM) are not what the ratios measure;
its ratios are printed next to the rounds' and not counted.
While the tables are set up (minutes at 10 M rows), a thread does the archive service's idle duty, as a running
archiver's polls do: it keeps Spark's Python workers alive (lake/warm_workers.py; without it round 1 ran in
workers Spark had replaced after 60 s idle, ~0.4 s slower).
Each ratio is reported per round and as the median of the rounds (one pass or one MERGE swings by a third on a
shared machine).
The archiver logs every upsert pass's stage times (icelog.archive.upsert at INFO).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.archive.reconcile import (  # noqa: E402
    COMMIT_USER_PROPERTY,
    OFFSETS_PROPERTY,
    TOPIC_ID_PROPERTY,
    encode_offsets,
)
from icelog.config import load_settings  # noqa: E402
from icelog.lake.spark import create_session  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

PARTITIONS = 4
ENV = {"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", "ICELOG_ARCHIVE__ENABLED": "false"}
COMPACT = {"icelog.archive.layout": "table", "cleanup.policy": "compact"}


def produce(bootstrap: str, topic: str, keys: list[int], tag: str, partition: int | None = None) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for n, key in enumerate(keys):
        value = (f"{tag}{key}-".encode() * 20)[:100]
        if partition is None:
            producer.produce(topic, key=f"k{key:09d}".encode(), value=value)
        else:
            producer.produce(topic, key=f"k{key:09d}".encode(), value=value, partition=partition)
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


@contextlib.contextmanager
def idle_polls(archiver: Archiver) -> Iterator[None]:
    """What ArchiveService's polls do while nothing is due: keep the Python workers alive (every second, as the
    service polls; a ping runs only when a pool has been idle 45 s)."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            archiver.python_workers.poll()

    thread = threading.Thread(target=poll, name="idle-polls", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def jvm_gc_seconds(spark: Any) -> float:
    """The driver JVM's (and so, in local mode, the executors') collection time so far."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return sum(bean.getCollectionTime() for bean in beans) / 1000


def timed_pass(archiver: Archiver, topic: str) -> float:
    gc = jvm_gc_seconds(archiver.spark)
    start = time.perf_counter()
    [result] = archiver.run_pass(force=True, topics=[topic])
    elapsed = time.perf_counter() - start
    assert not result.error, result.error
    gc = jvm_gc_seconds(archiver.spark) - gc
    print(f"  {topic}: {result.records} records in {elapsed:.1f} s (JVM GC {gc:.2f} s)", flush=True)
    return elapsed


def seed_rows(spark: Any, table: str, size: int, first_offset: int) -> dict[int, int]:
    """Append `size` rows of distinct keys k000000000.. as the archiver writes them; returns the offsets map.

    Row i goes to bucket i % 4 at offset first_offset + i // 4; each Spark task writes its rows in offset
    order, one file per bucket (no shuffle), like archive passes do.
    """
    from pyspark.sql import functions as F

    per_bucket = -(-size // PARTITIONS)
    ids = spark.range(0, size, 1, max(4, size // 250_000))
    known = {
        "__key": F.concat(F.lit("k"), F.lpad(F.col("id").cast("string"), 9, "0")).cast("binary"),
        "__value": F.substring(F.repeat(F.concat(F.lit("a"), F.col("id").cast("string"), F.lit("-")), 20), 1, 100
                               ).cast("binary"),
        "__bucket": (F.col("id") % PARTITIONS).cast("int"),
        "__offset": (F.col("id") / PARTITIONS).cast("long") + first_offset,
        "__batch_start": (F.col("id") / PARTITIONS).cast("long") + first_offset,
        "__timestamp": F.current_timestamp(),
    }
    fields = spark.table(table).schema.fields
    rows = ids.select(*[known.get(f.name, F.lit(None).cast(f.dataType)).alias(f.name) for f in fields])
    offsets = {p: first_offset + per_bucket for p in range(PARTITIONS)}
    summary = dict(spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1"
                             ).collect()[0].summary)
    summary[OFFSETS_PROPERTY] = encode_offsets(offsets)
    writer = rows.writeTo(table).option("use-table-distribution-and-ordering", "false").option("fanout-enabled", "true")
    for name in (OFFSETS_PROPERTY, TOPIC_ID_PROPERTY, COMMIT_USER_PROPERTY):
        if name in summary:
            writer = writer.option(f"snapshot-property.{name}", summary[name])
    writer.append()
    return offsets


def move_partitions(broker: BrokerProcess, metadata_path: str, topic: str, offsets: dict[int, int]) -> None:
    """With the broker stopped: the topic's partitions start (and end) at the table's offsets."""
    broker.stop()
    with sqlite3.connect(metadata_path) as conn:
        [(topic_id,)] = conn.execute("SELECT topic_id FROM topics WHERE name = ?", (topic,)).fetchall()
        for partition, offset in offsets.items():
            conn.execute("DELETE FROM intake_chunks WHERE topic_id = ? AND partition = ?", (topic_id, partition))
            conn.execute("UPDATE partitions SET log_start_offset = ?, high_watermark = ?, intake_chunks = 0, "
                         "intake_bytes = 0 WHERE topic_id = ? AND partition = ?", (offset, offset, topic_id, partition))
    broker.start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--updates", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3, help="batches, each timed; ratios are the medians")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 6:  # round tags b..h, the warm-up round's last; the seed's rows use a, i and w
        parser.error("--rounds must be between 1 and 6")
    sizes = [int(s) for s in args.sizes.split(",")]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("icelog.archive.upsert").setLevel(logging.INFO)  # where an upsert pass's time goes
    workdir = Path(tempfile.mkdtemp(prefix="upsert-bench-"))
    broker = BrokerProcess(workdir / "data", env=ENV).start()
    try:
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen="off")
        spark = create_session(settings, "upsert-bench")
        store = open_store(settings.metadata_url)
        archiver = Archiver(settings, spark, store)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topics = {"append": {"icelog.archive.layout": "table"}, **{f"up{n}": COMPACT for n in sizes}}
        for topic, config in topics.items():
            admin.create_topics([NewTopic(topic, PARTITIONS, config=config)])[topic].result(30)
        big = max(sizes)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        with idle_polls(archiver):  # the set-up's minutes, as a running archiver sees them
            for n in sizes:  # seed: one record per partition creates the table, then Spark appends n rows
                topic, table = f"up{n}", f"lake.icelog.up{n}"
                for p in range(PARTITIONS):
                    produce(broker.bootstrap, topic, [big + 10_000_000 + p], "i", partition=p)
                timed_pass(archiver, topic)
                start = time.perf_counter()
                offsets = seed_rows(spark, table, n, 1)
                print(f"  {topic}: {n} rows seeded by Spark in {time.perf_counter() - start:.1f} s", flush=True)
                move_partitions(broker, settings.metadata_url.removeprefix("sqlite:///"), topic, offsets)
                for p in range(PARTITIONS):  # the first pass after the seed builds the index from the table; it
                    # replaces the first pass's rows, so the deletion-vector writer is warm before the timed passes
                    produce(broker.bootstrap, topic, [big + 10_000_000 + p], "w", partition=p)
                index_s = timed_pass(archiver, topic)
                print(f"  {topic}: pass with the index build from {n} rows: {index_s:.1f} s", flush=True)
                spark.sql(f"ALTER TABLE {table} CREATE BRANCH merge_base")
            produce(broker.bootstrap, "append", [big + 30_000_000], "i")
            timed_pass(archiver, "append")

        updated = max(1, int(args.batch * args.updates))
        step = max(1, min(sizes) // updated)

        def run_round(label: str, index: int) -> dict[str, Any]:
            """One batch (updates of seeded keys, others each round, and new keys; values start with its tag)
            to every topic: the timed passes, then the same rows MERGEd into each table's branch."""
            tag = chr(ord("b") + index)
            new_keys = big + index * args.batch
            batch = list(range(index, min(sizes), step))[:updated]
            batch += range(new_keys, new_keys + args.batch - updated)
            print(f"{label}: batch {len(batch)} records ({updated} updates of seeded keys), "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            for topic in topics:
                produce(broker.bootstrap, topic, batch, tag)
            # Each round's timings start with nothing left to write back (the 10 M seed is ~1 GB of Parquet, a
            # MERGE rewrites files): write-back throttles whichever writer comes next, the pass or the MERGE.
            synced = time.perf_counter()
            os.sync()
            print(f"  sync: {time.perf_counter() - synced:.1f} s", flush=True)
            append_s = timed_pass(archiver, "append")
            upsert_s = {n: timed_pass(archiver, f"up{n}") for n in sizes}
            merge_s: dict[int, float] = {}
            for n in sizes:
                table = f"lake.icelog.up{n}"
                source = spark.table(table).where(f"substring(__value, 1, 1) = X'{ord(tag):02x}'").cache()
                assert source.count() == len(batch)
                source.createOrReplaceTempView("batch_rows")
                os.sync()  # as before the passes
                gc = jvm_gc_seconds(spark)
                start = time.perf_counter()
                spark.sql(f"MERGE INTO {table}.branch_merge_base t USING batch_rows s ON t.__key = s.__key "
                          "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").collect()
                merge_s[n] = time.perf_counter() - start
                source.unpersist()
                print(f"  MERGE INTO the {n}-row table's branch: {merge_s[n]:.1f} s "
                      f"(JVM GC {jvm_gc_seconds(spark) - gc:.2f} s)", flush=True)
                rows = spark.sql(f"SELECT count(*) AS n FROM {table}").collect()[0].n
                merged = spark.sql(f"SELECT count(*) AS n FROM {table} VERSION AS OF 'merge_base'").collect()[0].n
                print(f"  rows: upsert table {rows}, MERGE branch {merged} (must be equal)", flush=True)
                assert rows == merged
            return {"append": append_s, "upsert": upsert_s, "merge": merge_s}

        # A warm-up round first, the same work as a timed one: the first 100 k-row pass in a process was up to
        # 0.4 s slower (the workers' and the JVM's first large writes; set-up wrote a few rows at a time), and a
        # MERGE's first large one too. Its ratios are printed, not counted: the targets are about an archiver
        # that is already running.
        warm_up = run_round("warm-up round (not counted)", args.rounds)
        rounds = [run_round(f"round {r + 1}", r) for r in range(args.rounds)]
        small, large = min(sizes), max(sizes)

        def ratios(name: str, of_round: Callable[[dict[str, Any]], float]) -> str:
            values = [of_round(r) for r in rounds]
            each = " / ".join(f"{v:.2f}" for v in values)
            return f"{name}: median {statistics.median(values):.2f} (rounds: {each}; warm-up {of_round(warm_up):.2f})"

        print(ratios(f"upsert/append throughput ratio ({small}-row table)",
                     lambda r: r["append"] / r["upsert"][small]) + " (target >= 0.5)")
        if large != small:
            print(ratios(f"upsert time {large} rows / {small} rows",
                         lambda r: r["upsert"][large] / r["upsert"][small]) + " (target <= 1.5)")
        for n in sizes:
            print(ratios(f"MERGE time / upsert time ({n}-row table)",
                         lambda r, n=n: r["merge"][n] / r["upsert"][n]) + " (target >= 3)")
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        store.close()
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # ~1 GB at 10 M rows


if __name__ == "__main__":
    main()
