"""Live scan benchmark: `icelog.live.scan` with a tenth of the rows in the tail against a table-only scan of the
same rows (issue 47: ≤ 1.3x).

Run: .venv/bin/python bench/live_scan_bench.py [--records 1000000] [--rounds 3]
     .venv/bin/python bench/live_scan_bench.py --records 10000000    # the issue's size: 10 M, 1 M in the tail

One broker (its archiver off), one topic of `--partitions` partitions, `--records` records of `--record-size` bytes
(keys, lz4 from confluent-kafka):
  1. the first (1 - `--tail`) of them are produced and archived by one pass of the real Spark archiver, then the
     rest are produced: the tail;
  2. one untimed live scan (imports, the catalog's first open), then `--rounds` live scans (the table's snapshot
     through pyiceberg plus the tail decoded from the intake by the archiver's decoder, on a thread of its own while
     the table's rows are read), each batch counted as it arrives;
  3. a second pass archives the tail; then `--rounds` table-only scans of the same rows (pyiceberg's batch reader
     at the new snapshot, the baseline) alternated with live scans of it (an empty tail: the live read's own cost).
The figure is live (with the tail) / table-only, medians of the rounds. Results: bench/results/live_scan.json (or
--out none).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import send_all, write_results  # noqa: E402

from icelog import live  # noqa: E402
from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.live.cut import load_table  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

TOPIC = "bench-live"


def produce(bootstrap: str, first: int, count: int, partitions: int, size: int) -> float:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5,
                        "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
                        "queue.buffering.max.messages": 2_000_000})
    filler = bytes(size // 2)
    return send_all(prod, count, lambda i: prod.produce(
        TOPIC, value=os.urandom(size - size // 2) + filler, key=b"k%d" % (first + i),
        partition=(first + i) % partitions))


def counted(batches: Iterable[Any]) -> tuple[int, float]:
    """Rows of the batches, read to the end, and the seconds it took (planning included)."""
    started = time.perf_counter()
    rows = sum(batch.num_rows for batch in batches)
    return rows, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tail", type=float, default=0.1, help="the share of the records in the tail")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="live_scan.json", help="file under bench/results, or none")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="icelog-live-bench-"))
    broker = BrokerProcess(work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
                                               "ICELOG_ARCHIVE__ENABLED": "false"}).start()
    tail = int(args.records * args.tail)
    head = args.records - tail
    results: dict[str, Any] = {"records": args.records, "tail_records": tail, "partitions": args.partitions,
                               "record_size": args.record_size, "python": platform.python_version()}
    spark = None
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config={
            "icelog.intake.retention.ms": "-1", "icelog.archive.max.lag.bytes": str(1 << 40)})])[TOPIC].result(30)
        results["produce_head_s"] = round(produce(broker.bootstrap, 0, head, args.partitions, args.record_size), 1)
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        store = open_store(settings.metadata_url)
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-live-bench")
        archiver = Archiver(settings, spark, store)
        started = time.perf_counter()
        assert [r.records for r in archiver.run_pass(force=True, topics={TOPIC})] == [head]
        results["archive_head_s"] = round(time.perf_counter() - started, 1)
        results["produce_tail_s"] = round(produce(broker.bootstrap, head, tail, args.partitions, args.record_size), 1)
        print(f"table {head} records, tail {tail}", flush=True)

        data_dir = str(broker.data_dir)
        counted(live.scan(TOPIC, data_dir=data_dir))  # one untimed read first: imports, the catalog's first open
        live_s = []
        for _ in range(args.rounds):
            rows, seconds = counted(live.scan(TOPIC, data_dir=data_dir))
            assert rows == args.records, rows
            live_s.append(seconds)
            print(f"live scan (table + tail): {seconds:.2f} s", flush=True)

        started = time.perf_counter()
        assert [r.records for r in archiver.run_pass(force=True, topics={TOPIC})] == [tail]
        results["archive_tail_s"] = round(time.perf_counter() - started, 1)
        table_s, empty_tail_s = [], []
        for _ in range(args.rounds):
            table = load_table(settings, "icelog", TOPIC)
            assert table is not None
            rows, seconds = counted(table.scan().to_arrow_batch_reader())
            assert rows == args.records, rows
            table_s.append(seconds)
            rows, seconds = counted(live.scan(TOPIC, data_dir=data_dir))
            assert rows == args.records, rows
            empty_tail_s.append(seconds)
            print(f"table-only scan: {table_s[-1]:.2f} s; live scan, empty tail: {seconds:.2f} s", flush=True)
        store.close()

        live_median, table_median = statistics.median(live_s), statistics.median(table_s)
        results.update({
            "live_s": [round(s, 3) for s in live_s],
            "table_only_s": [round(s, 3) for s in table_s],
            "live_empty_tail_s": [round(s, 3) for s in empty_tail_s],
            "live_rows_per_s": round(args.records / live_median),
            "table_only_rows_per_s": round(args.records / table_median),
            "live_over_table_only": round(live_median / table_median, 2),
            "live_empty_tail_over_table_only": round(statistics.median(empty_tail_s) / table_median, 2),
            "target": "live / table-only <= 1.3",
        })
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        if args.keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.out == "none":
        import json

        print(json.dumps(results, indent=2))
    else:
        write_results(args.out, results)


if __name__ == "__main__":
    main()
