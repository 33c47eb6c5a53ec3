"""The intake on object storage against local files, in one run: ack latency at a steady rate, produce throughput,
and object PUTs per second with 1, 12 and 120 partitions (one PUT per commit interval, whatever the partitions);
last, the store's own PUT throughput (8 MiB objects, as many at once as the intake PUTs), the ceiling S3 produce is
bound by.

Run: .venv/bin/python bench/s3_intake_bench.py [--records 200000] [--mb-per-s 10] [--latency-seconds 15]
       [--commit-interval-ms 250] [--in-flight 5,1000000]
The store is a local SeaweedFS (`weed mini`, tests/support/seaweedfs.py) on the same 2 cores: a PUT costs a loopback
round trip and SeaweedFS's own CPU, not a network's latency, so the S3 figures here are a floor on latency and a
ceiling on cost per record; the commit interval dominates the ack latency either way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
from bench.broker_bench import ack_latency, create_topic, produce_throughput  # noqa: E402
from icelog.log.s3 import PUTS_IN_FLIGHT, ObjectStore  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.seaweedfs import BUCKET, SeaweedFS  # noqa: E402


def metric(broker: BrokerProcess, name: str) -> float:
    """The sum of a metric's samples (every label) on the broker's /metrics."""
    text = requests.get(f"{broker.metrics_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def puts_per_second(broker: BrokerProcess, partitions: int, seconds: float, mb_per_s: float) -> dict[str, float]:
    """Object PUTs per second while producing `mb_per_s` spread over `partitions` partitions."""
    topic = f"puts-{partitions}"
    create_topic(broker.bootstrap, topic, partitions)
    before = metric(broker, 'icelog_object_store_requests_total{kind="put"}')
    started = time.monotonic()
    latency = ack_latency(broker.bootstrap, topic, mb_per_s, seconds)
    elapsed = time.monotonic() - started
    puts = metric(broker, 'icelog_object_store_requests_total{kind="put"}') - before
    return {"partitions": partitions, "puts_per_s": round(puts / elapsed, 2), "p99_ms": round(latency["p99_ms"], 1)}


def store_put_throughput(store: SeaweedFS, objects: int = 16) -> dict[str, float]:
    """The store's own ceiling: 8 MiB objects PUT by icelog's object client, PUTS_IN_FLIGHT at once (what the
    intake does at full speed), with nothing else running. Produce on S3 cannot beat it."""
    os.environ.update(store.env())
    objects_client = ObjectStore(f"s3://{BUCKET}/ceiling-{int(time.time())}")
    body = os.urandom(8 * 1024 * 1024)
    started = time.perf_counter()
    with ThreadPoolExecutor(PUTS_IN_FLIGHT) as pool:
        list(pool.map(lambda i: objects_client.put(i, body), range(objects)))
    seconds = time.perf_counter() - started
    return {"mb_per_s": round(objects * len(body) / seconds / 1e6, 1), "in_flight": PUTS_IN_FLIGHT}


def run(kind: str, root: Path, store: SeaweedFS, args: argparse.Namespace) -> dict[str, object]:
    env = {"ICELOG_ARCHIVE__ENABLED": "false", "ICELOG_ARCHIVE__DEFAULT_KIND": "none"}
    if kind == "s3":
        env |= {**store.env(), "ICELOG_INTAKE__URL": f"s3://{BUCKET}/bench-{int(time.time())}",
                "ICELOG_INTAKE__COMMIT_INTERVAL_MS": str(args.commit_interval_ms)}
    data = root / kind
    data.mkdir()
    broker = BrokerProcess(data, env=env, extra_args=["--log-level", "warning"]).start()
    try:
        create_topic(broker.bootstrap, "latency", 6)
        print(f"{kind}: ack latency at {args.mb_per_s} MB/s...", file=sys.stderr)
        latencies = [{"in_flight": n, **ack_latency(broker.bootstrap, "latency", args.mb_per_s, args.latency_seconds,
                                                    {"max.in.flight.requests.per.connection": str(n)})}
                     for n in args.in_flight]
        create_topic(broker.bootstrap, "throughput", 6)
        print(f"{kind}: produce throughput...", file=sys.stderr)
        produced = produce_throughput(broker.bootstrap, "throughput", args.records, reports="errors")
        out: dict[str, object] = {
            "ack_ms": [{"in_flight": int(x["in_flight"]), "p50": round(x["p50_ms"], 1), "p99": round(x["p99_ms"], 1)}
                       for x in latencies],
            "produce_mb_per_s": round(produced["mb_per_s"], 1),
        }
        if kind == "s3":
            print("s3: PUTs per second with 1, 12 and 120 partitions...", file=sys.stderr)
            out["puts"] = [puts_per_second(broker, n, args.latency_seconds / 2, 1) for n in (1, 12, 120)]
        return out
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--mb-per-s", type=float, default=10)
    parser.add_argument("--latency-seconds", type=float, default=15)
    parser.add_argument("--commit-interval-ms", type=int, default=250)
    parser.add_argument("--in-flight", type=lambda v: [int(n) for n in v.split(",")], default=[5, 1_000_000],
                        help="the latency producer's max.in.flight.requests.per.connection, one measurement each "
                        "(5: the cap of an idempotent producer, librdkafka's and the Java client's; 1000000: "
                        "librdkafka's default without idempotence). With 5, at most five requests wait for an "
                        "object, so at 10 MB/s records queue in the client behind one interval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        root = Path(tmp)
        store = SeaweedFS(root / "seaweedfs").start()
        try:
            local = run("local", root, store, args)
            s3 = run("s3", root, store, args)
            print("the store's own PUT throughput...", file=sys.stderr)
            ceiling = store_put_throughput(store)
        finally:
            store.discard()  # (in the temporary directory: no graceful stop to wait for)
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "commit_interval_ms": args.commit_interval_ms, "local": local, "s3": s3,
        "store_put_ceiling": ceiling,
        "s3_produce_vs_local": round(float(s3["produce_mb_per_s"]) / float(local["produce_mb_per_s"]), 2),  # type: ignore[arg-type]
        "s3_produce_vs_store_ceiling": round(float(s3["produce_mb_per_s"]) / ceiling["mb_per_s"], 2),  # type: ignore[arg-type]
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
