"""Several brokers (issue 46): failover time, three brokers against one, and object PUTs per broker.

Three icelog brokers over one PostgreSQL and one SeaweedFS bucket (tests/support/cluster.py), with the default
heartbeat settings (broker_heartbeat_interval_ms 1000, broker_session_timeout_ms 6000) unless --session-ms says:
- failover: an idempotent acks=all producer writes to 6 partitions without pause; the broker leading the most
  partitions is killed with -9 and the time from the kill to the first acknowledgement on each of its partitions
  (from the broker that took it) is measured; the broker is started again empty (data dir deleted) and the cluster
  settles before the next kill. p50 / p99 over --kills kills (target <= the session timeout + 2 s).
- three against one: the same produce (librdkafka, acks=all, lz4, 1 KiB records, 6 partitions) to the three
  brokers and to one broker over the same store and bucket, alternated for --rounds rounds; the ratio of the
  medians. Two cores cannot show scaling: this is a check that spreading costs nothing.
- object PUTs per second per broker during the three-broker produce (each broker's /metrics).

    python bench/failover_bench.py [--kills 5] [--records 200000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
import confluent_kafka as ck  # noqa: E402

from bench.broker_bench import create_topic, produce_throughput  # noqa: E402
from tests.support.cluster import BrokerCluster  # noqa: E402
from tests.support.postgres import start_cluster  # noqa: E402
from tests.support.seaweedfs import SeaweedFS  # noqa: E402

PARTITIONS = 6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def puts(cluster: BrokerCluster) -> dict[int, float]:
    """Each running broker's object PUTs so far (its /metrics)."""
    out: dict[int, float] = {}
    for n in cluster.alive():
        text = urllib.request.urlopen(cluster.brokers[n].metrics_url + "/metrics", timeout=10).read().decode()
        out[n] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("icelog_object_store_requests_total{") and 'kind="put"' in line)
    return out


class AckClock:
    """An idempotent producer writing round-robin without pause; remembers when each partition was last acked."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                     "linger.ms": 5, "message.timeout.ms": 120_000, "retry.backoff.ms": 20,
                                     "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                                     "topic.metadata.refresh.interval.ms": 500})
        self.last_ack: dict[int, float] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err: Any, msg: Any) -> None:
        if err is None:
            self.last_ack[msg.partition()] = time.monotonic()
        else:
            self.failed += 1

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.producer.produce(self.topic, b"x" * 200, partition=n % PARTITIONS, on_delivery=self._report)
                n += 1
            except BufferError:
                self.producer.poll(0.01)
            if n % 10 == 0:
                self.producer.poll(0.002)  # ~ a few thousand records a second: acks every few ms per partition

    def start(self) -> AckClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(120)


def failover(cluster: BrokerCluster, kills: int) -> list[float]:
    create_topic(cluster.bootstrap, "failover", PARTITIONS)
    times: list[float] = []
    clock = AckClock(cluster.bootstrap, "failover").start()
    try:
        for k in range(kills):
            leaders = cluster.wait_settled(("failover",), timeout=120)["failover"]
            time.sleep(2)  # steady acks on every partition
            victim = max(set(leaders.values()), key=list(leaders.values()).count)
            theirs = [p for p, n in leaders.items() if n == victim]
            killed = time.monotonic()
            cluster.brokers[victim].kill()
            deadline = killed + 120
            while not all(clock.last_ack.get(p, 0) > killed for p in theirs):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"acks did not resume on partitions {theirs} within 120 s")
                time.sleep(0.02)
            resumed = max(clock.last_ack[p] for p in theirs) - killed
            times.append(resumed)
            print(f"  kill {k + 1}: node {victim} ({len(theirs)} partitions): acks resumed after {resumed:.2f} s",
                  file=sys.stderr, flush=True)
            shutil.rmtree(cluster.brokers[victim].data_dir, ignore_errors=True)
            cluster.brokers[victim].start()
    finally:
        clock.stop()
    if clock.failed:
        raise RuntimeError(f"{clock.failed} records failed (a client should see only retriable errors)")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--session-ms", type=int, default=6000, help="broker_session_timeout_ms")
    args = parser.parse_args()
    env = {"ICELOG_BROKER_HEARTBEAT_INTERVAL_MS": "1000", "ICELOG_BROKER_SESSION_TIMEOUT_MS": str(args.session_ms),
           "ICELOG_INTAKE__COMMIT_INTERVAL_MS": "250"}  # the defaults, whatever tests/support/cluster.py sets
    root = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    postgres = start_cluster()
    store = SeaweedFS(root / "seaweedfs").start()
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {platform.system()}"}
    try:
        meta = postgres.new_database()
        three = BrokerCluster(root / "three", store, meta, 3, prefix="three", env=env).start()
        times = failover(three, args.kills)
        result["failover_s"] = {"p50": round(statistics.median(times), 2), "p99": round(percentile(times, 0.99), 2),
                                "all": [round(t, 2) for t in times], "target": (args.session_ms + 2000) / 1000}
        one = BrokerCluster(root / "one", store, postgres.new_database(), 1, prefix="one", env=env).start()
        rates: dict[str, list[float]] = {"three": [], "one": []}
        put_rates: list[dict[int, float]] = []
        for r in range(args.rounds):
            for name, cluster in (("three", three), ("one", one)) if r % 2 == 0 else (("one", one), ("three", three)):
                topic = f"tput-{name}-{r}"
                create_topic(cluster.bootstrap, topic, PARTITIONS)
                cluster.wait_settled((topic,), timeout=60)
                before = puts(cluster)
                run = produce_throughput(cluster.bootstrap, topic, args.records, reports="errors")
                after = puts(cluster)
                rates[name].append(run["mb_per_s"])
                if name == "three":
                    put_rates.append({n: round((after[n] - before.get(n, 0)) / run["seconds"], 1) for n in after})
                print(f"  round {r + 1} {name}: {run['mb_per_s']:.1f} MB/s", file=sys.stderr, flush=True)
        result["produce_mb_s"] = {k: [round(v, 1) for v in vs] for k, vs in rates.items()}
        result["three_over_one"] = round(statistics.median(rates["three"]) / statistics.median(rates["one"]), 2)
        result["puts_per_s_per_broker"] = put_rates
        three.stop()
        one.stop()
    finally:
        store.discard()  # (deleted below: no graceful stop to wait for)
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
