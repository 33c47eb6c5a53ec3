"""Replay benchmark: `icelog replay` of an archived topic against plain produce of the same records.

Run: .venv/bin/python bench/replay_bench.py [--records 1000000] [--rounds 2] [--out replay_bench.json|none]

One broker (archiver off), a topic of 3 partitions holding `--records` records of about 200 bytes (keys from a pool
of 10,000, one in 20 without a key, one in 4 with two headers), archived by one pass of the real Spark archiver.
Then, alternated `--rounds` times, each into a new topic of 6 partitions:
  * replay: `icelog replay --table icelog.<topic> --to-topic …` as a user runs it (a child process: its start, the
    catalog, the pyiceberg scans, murmur2 placement and the transactions all count);
  * plain produce: the same records (read from the table once, beforehand, not timed) produced by one
    confluent-kafka producer with the same settings (idempotent, linger.ms 20, batch.size 1 MB), keys placed by
    librdkafka's `murmur2_random` partitioner, no transactions.
Figure: records/s of each; ratio replay / plain (medians). Target (issue 47): >= 0.5.
"""

from __future__ import annotations

import argparse
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

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import send_all, write_results  # noqa: E402

from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from icelog.replay.source import open_table, pin  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

TOPIC = "bench-replay-source"
SOURCE_PARTITIONS = 3
DESTINATION_PARTITIONS = 6
KEYS = 10_000


def produce_source(bootstrap: str, records: int) -> float:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000,
                        "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    filler = b"x" * 160

    def send(i: int) -> None:
        key = None if i % 20 == 0 else b"customer-%d" % (i % KEYS)
        headers = [("trace", b"%016x" % i), ("source", b"bench")] if i % 4 == 0 else None
        prod.produce(TOPIC, value=b"%d:" % i + filler, key=key, headers=headers, partition=i % SOURCE_PARTITIONS,
                     timestamp=1_700_000_000_000 + i)

    return send_all(prod, records, send)


def replay_run(broker: BrokerProcess, topic: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "icelog", "replay", "--data-dir", str(broker.data_dir), "--bootstrap",
         broker.bootstrap, "--table", f"icelog.{TOPIC}", "--to-topic", topic, "--partitions",
         str(DESTINATION_PARTITIONS)], capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started


def plain_run(broker: BrokerProcess, admin: AdminClient, topic: str, rows: list[Any]) -> float:
    admin.create_topics([NewTopic(topic, DESTINATION_PARTITIONS)])[topic].result(30)
    prod = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                        "enable.idempotence": True, "partitioner": "murmur2_random"})
    return send_all(prod, len(rows), lambda i: prod.produce(
        topic, rows[i].value, rows[i].key, timestamp=rows[i].timestamp_ms, headers=list(rows[i].headers)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="replay_bench.json", help="results file in bench/results (none: print)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icelog-replay-bench-"))
    broker = BrokerProcess(work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
                                               "ICELOG_ARCHIVE__ENABLED": "false"}).start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records, "source_partitions": SOURCE_PARTITIONS,
        "destination_partitions": DESTINATION_PARTITIONS,
    }
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, SOURCE_PARTITIONS, config={
            "icelog.archive.max.lag.bytes": str(1 << 40)})])[TOPIC].result(30)
        print(f"produced {args.records} records in {produce_source(broker.bootstrap, args.records):.1f}s",
              flush=True)
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        store = open_store(settings.metadata_url)
        from icelog.lake.catalog import pyiceberg_catalog_opener
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-replay-bench")
        try:
            assert [r.error for r in Archiver(settings, spark, store).run_pass(force=True, topics={TOPIC})] == [""]
        finally:
            spark.stop()
            store.close()
        opener = pyiceberg_catalog_opener(settings)
        assert opener is not None
        catalog = opener()
        assert catalog is not None
        source = pin(f"icelog.{TOPIC}", open_table(catalog, f"icelog.{TOPIC}"), None, None)
        rows = [r for p in range(source.partitions) for r in source.records(p)]
        assert len(rows) == args.records, len(rows)
        replay_s, plain_s = [], []
        for i in range(args.rounds):
            replay_s.append(replay_run(broker, f"replayed-{i}"))
            plain_s.append(plain_run(broker, admin, f"produced-{i}", rows))
            print(f"round {i}: replay {args.records / replay_s[-1]:,.0f}, plain produce "
                  f"{args.records / plain_s[-1]:,.0f} records/s", flush=True)
        results["replay_records_per_s"] = [round(args.records / s) for s in replay_s]
        results["plain_records_per_s"] = [round(args.records / s) for s in plain_s]
        results["replay_over_plain"] = round(statistics.median(plain_s) / statistics.median(replay_s), 2)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out == "none":
        import json

        print(json.dumps(results, indent=2))
    else:
        write_results(args.out, results)


if __name__ == "__main__":
    main()
