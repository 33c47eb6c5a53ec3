"""Metadata-store benchmark: what PostgreSQL metadata costs a producer's acknowledgements, against SQLite's.

Run: .venv/bin/python bench/meta_bench.py [--rounds 3] [--latency-seconds 8] [--mb-per-s 5] [--records 100000]

Two brokers run at once on this machine, alike but for `meta_url`: the embedded SQLite store, and a throwaway
PostgreSQL 15 server on loopback (tests/support/postgres.py: initdb, fsync and synchronous_commit on, as shipped).
Alternated round by round so drift on this shared machine hits both alike: confluent-kafka's ack latency at a
steady rate (bench/broker_bench.py's ack_latency: acks=all, lz4, 1 KiB records, linger 5 ms), then its produce
throughput. Every group commit indexes its frames in the store after the intake fdatasync; on PostgreSQL that
index commit is a durable round trip (SQLite's is not fsync'd: see docs/durability.md). Target (issue 32): ack
p99 PostgreSQL / SQLite <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
from bench.broker_bench import ack_latency, create_topic, produce_throughput  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.postgres import start_cluster  # noqa: E402

BACKENDS = ("sqlite", "postgresql")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs per backend")
    parser.add_argument("--latency-seconds", type=float, default=8)
    parser.add_argument("--mb-per-s", type=float, default=5.0, help="the steady produce rate of the latency runs")
    parser.add_argument("--records", type=int, default=100_000, help="records of each throughput run (0: none)")
    args = parser.parse_args()

    cluster = start_cluster()
    brokers: dict[str, BrokerProcess] = {}
    latency: dict[str, list[dict[str, float]]] = {b: [] for b in BACKENDS}
    throughput: dict[str, list[float]] = {b: [] for b in BACKENDS}
    try:
        with tempfile.TemporaryDirectory(prefix="icelog-meta-bench-") as tmp:
            for backend in BACKENDS:
                env = {"ICELOG_INTAKE__FSYNC": "true", "ICELOG_ARCHIVE__ENABLED": "false"}
                if backend == "postgresql":
                    env["ICELOG_META_URL"] = cluster.new_database("bench")
                brokers[backend] = BrokerProcess(Path(tmp) / backend, env=env).start()
                create_topic(brokers[backend].bootstrap, "bench", 6)
            for round_ in range(args.rounds):
                order = BACKENDS if round_ % 2 == 0 else BACKENDS[::-1]
                for backend in order:
                    print(f"round {round_ + 1}: ack latency on {backend}", file=sys.stderr, flush=True)
                    latency[backend].append(
                        ack_latency(brokers[backend].bootstrap, "bench", args.mb_per_s, args.latency_seconds))
                if args.records:
                    for backend in order:
                        print(f"round {round_ + 1}: throughput on {backend}", file=sys.stderr, flush=True)
                        result = produce_throughput(brokers[backend].bootstrap, "bench", args.records)
                        throughput[backend].append(result["mb_per_s"])
    finally:
        for broker in brokers.values():
            broker.stop()
        cluster.destroy()

    def median(backend: str, key: str) -> float:
        return statistics.median(run[key] for run in latency[backend])

    result = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "rounds": args.rounds, "latency_seconds": args.latency_seconds, "mb_per_s": args.mb_per_s,
        "ack_latency_ms": {b: {"p50": [round(r["p50_ms"], 2) for r in latency[b]],
                               "p99": [round(r["p99_ms"], 2) for r in latency[b]]} for b in BACKENDS},
        "ack_p50_ms": {b: round(median(b, "p50_ms"), 2) for b in BACKENDS},
        "ack_p99_ms": {b: round(median(b, "p99_ms"), 2) for b in BACKENDS},
        "ack_p50_ratio": median("postgresql", "p50_ms") / median("sqlite", "p50_ms"),
        "ack_p99_ratio": median("postgresql", "p99_ms") / median("sqlite", "p99_ms"),
        "produce_mb_per_s": throughput,
        "throughput_ratio": (statistics.median(throughput["postgresql"]) / statistics.median(throughput["sqlite"])
                             if args.records else None),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
