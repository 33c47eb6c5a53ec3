"""Live scan benchmark: `icelog.live.scan` with a tenth of the rows in the tail against a table-only scan of the
same rows (issue 47: ≤ 1.3x).

Run: .venv/bin/python bench/live_scan_bench.py [--records 1000000] [--rounds 3]
     .venv/bin/python bench/live_scan_bench.py --records 10000000    # the issue's size: 10 M, 1 M in the tail

One broker (its archiver off) and two topics of `--partitions` partitions holding the same `--records` records of
`--record-size` bytes (keys; values from a seeded pool; lz4 from confluent-kafka):
  1. `live`: the first (1 - `--tail`) of the records are produced and archived by one pass of the real Spark
     archiver, then the rest are produced: its tail;
     `table`: all of the records are produced and archived by one pass: the same rows, all in the table;
  2. one untimed read of each (imports, the catalog's first open), then `--rounds` rounds, each of: a live scan of
     `live` (the table's snapshot through pyiceberg plus the tail decoded from the intake by the archiver's decoder,
     on a thread of its own while the table's rows are read), a table-only scan of `table` (pyiceberg's batch
     reader: the baseline), and a live scan of `table` (an empty tail: the live read's own cost). Each batch is
     counted as it arrives. Alternating the three in every round keeps a shared machine's load swings out of the
     ratio.
The figure is live (with the tail) / table-only, medians of the rounds. Results: bench/results/live_scan.json (or
--out none).
"""

from __future__ import annotations

import argparse
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
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

LIVE, TABLE = "bench-live", "bench-table"
POOL = 4096  # distinct values, picked by record number: both topics get the same bytes


def produce(bootstrap: str, topic: str, first: int, count: int, partitions: int, values: list[bytes]) -> float:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5,
                        "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
                        "queue.buffering.max.messages": 2_000_000})
    return send_all(prod, count, lambda i: prod.produce(
        topic, value=values[(first + i) % POOL], key=b"k%d" % (first + i), partition=(first + i) % partitions))


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
    seeded = random.Random(47)
    values = [seeded.randbytes(args.record_size - args.record_size // 2) + bytes(args.record_size // 2)
              for _ in range(POOL)]
    results: dict[str, Any] = {"records": args.records, "tail_records": tail, "partitions": args.partitions,
                               "record_size": args.record_size, "python": platform.python_version()}
    spark = None
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for topic in (LIVE, TABLE):
            admin.create_topics([NewTopic(topic, args.partitions, 1, config={
                "icelog.intake.retention.ms": "-1", "icelog.archive.max.lag.bytes": str(1 << 40)})])[topic].result(30)
        results["produce_s"] = round(produce(broker.bootstrap, TABLE, 0, args.records, args.partitions, values), 1)
        produce(broker.bootstrap, LIVE, 0, head, args.partitions, values)
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        store = open_store(settings.metadata_url)
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-live-bench")
        archiver = Archiver(settings, spark, store)
        started = time.perf_counter()
        passed = {r.topic: r.records for r in archiver.run_pass(force=True, topics={LIVE, TABLE})}
        assert passed == {LIVE: head, TABLE: args.records}, passed
        results["archive_s"] = round(time.perf_counter() - started, 1)
        archiver.close()
        store.close()
        spark.stop()
        spark = None
        produce(broker.bootstrap, LIVE, head, tail, args.partitions, values)
        print(f"{LIVE}: table {head} records, tail {tail}; {TABLE}: table {args.records} records", flush=True)

        data_dir = str(broker.data_dir)

        def table_only() -> Iterable[Any]:
            table = load_table(settings, "icelog", TABLE)
            assert table is not None
            return table.scan().to_arrow_batch_reader()

        reads: dict[str, Callable[[], Iterable[Any]]] = {
            "live": lambda: live.scan(LIVE, data_dir=data_dir),
            "table_only": table_only,
            "live_empty_tail": lambda: live.scan(TABLE, data_dir=data_dir),
        }
        for read in reads.values():  # untimed: imports, the catalog's first open
            counted(read())
        seconds: dict[str, list[float]] = {name: [] for name in reads}
        for _ in range(args.rounds):
            for name, read in reads.items():
                rows, took = counted(read())
                assert rows == args.records, (name, rows)
                seconds[name].append(took)
            print("  ".join(f"{name} {s[-1]:.2f} s" for name, s in seconds.items()), flush=True)

        medians = {name: statistics.median(s) for name, s in seconds.items()}
        results.update({
            **{f"{name}_s": [round(x, 3) for x in s] for name, s in seconds.items()},
            "live_rows_per_s": round(args.records / medians["live"]),
            "table_only_rows_per_s": round(args.records / medians["table_only"]),
            "live_over_table_only": round(medians["live"] / medians["table_only"], 2),
            "live_empty_tail_over_table_only": round(medians["live_empty_tail"] / medians["table_only"], 2),
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
