"""icelog against Apache Kafka 4.1.1 on the same disk, in one run, alternated (issue 48 item 2).

Three brokers, each started fresh in every round, in rotating order:
- icelog: `icelog serve` with the embedded defaults (SQLite metadata, intake fsync'd before the ack), as
  tests/support/broker.BrokerProcess runs it: the archiver OFF and topics of kind none (no Spark in this run: a
  Spark start would dominate a run of a minute; the archiver's cost on the ack is archive_bench.py's figure).
- kafka-fsync: Kafka 4.1.1, one KRaft node, `log.flush.interval.messages=1` (each append fsync'd before the
  ack: icelog's guarantee).
- kafka-default: the same Kafka with its defaults (the OS flushes the page cache when it likes).
Kafka runs with kafka-server-start.sh's JVM options (1 GiB heap, G1).

Drivers, all of Kafka's own except librdkafka: org.apache.kafka.tools.ProducerPerformance
(kafka-producer-perf-test: acks=all, lz4, linger.ms=5, 1 KiB records, 6 partitions, unthrottled) for throughput
and ack latency p50/p99/p99.9; ConsumerPerformance for consume throughput; confluent-kafka (librdkafka) produce
throughput; EndToEndLatency (produce one record, consume it, acks=all) for end-to-end latency. The broker's
resident memory (VmRSS) after the produce, and its CPU seconds per GB produced (ProducerPerformance's run).

Ratios (medians over the rounds): icelog / kafka-fsync throughput (target >= 1.0) and ack p99 (<= 1.0),
icelog / kafka-default throughput (>= 0.7).

    python bench/vs_kafka_bench.py [--records 300000] [--rounds 2] [--e2e 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
from bench.broker_bench import create_topic, produce_throughput  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.java import kafka_jars_dir  # noqa: E402
from tests.support.kafka_broker import KafkaBroker, java_command  # noqa: E402

RECORD_SIZE = 1024
PRODUCER_PROPS = ["acks=all", "compression.type=lz4", "linger.ms=5"]
KINDS = ("icelog", "kafka-fsync", "kafka-default")
PERF_LINE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, ([\d.]+) ms max latency, "
    r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th")


def tool(main: str, *args: str, timeout: float = 600) -> str:
    command = [java_command(), "-Xmx512m", "-cp", str(kafka_jars_dir() / "*"), main, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{main} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def broker(kind: str, root: Path) -> Iterator[tuple[str, int]]:
    """(bootstrap, pid) of a fresh broker of `kind` whose data is under `root`."""
    if kind == "icelog":
        data = root / "data"
        data.mkdir(parents=True)
        # The Kafka broker's group.initial.rebalance.delay.ms is 0 (tests/support/kafka_broker.py, as Kafka's own
        # sample config): the same here, or each ConsumerPerformance run waits out icelog's 3 s default first.
        proc = BrokerProcess(data, env={"ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"},
                             extra_args=["--log-level", "warning"]).start()
        assert proc.proc is not None
        try:
            yield proc.bootstrap, proc.proc.pid
        finally:
            proc.stop()
        return
    extra = {"log.flush.interval.messages": "1"} if kind == "kafka-fsync" else {}
    kafka = KafkaBroker(root, extra={**extra, "num.partitions": "6"}, jvm=KafkaBroker.SERVER_JVM).start()
    try:
        yield kafka.bootstrap, kafka.pid
    finally:
        kafka.stop()


def producer_perf(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    out = tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
               "--record-size", str(RECORD_SIZE), "--throughput", "-1",
               "--producer-props", f"bootstrap.servers={bootstrap}", *PRODUCER_PROPS)
    matches = list(PERF_LINE.finditer(out))  # the last line is the whole run's summary
    if not matches:
        raise RuntimeError(f"no summary line from ProducerPerformance:\n{out[-2000:]}")
    sent, _rps, mbs, avg, _max, p50, _p95, p99, p999 = matches[-1].groups()
    if int(sent) != records:
        raise RuntimeError(f"ProducerPerformance sent {sent} of {records}")
    # ProducerPerformance's MB is 2^20 bytes; reported here in 10^6 like the other benches.
    return {"mb_per_s": float(mbs) * 1.048576, "ack_avg_ms": float(avg), "ack_p50_ms": float(p50),
            "ack_p99_ms": float(p99), "ack_p999_ms": float(p999)}


def consumer_perf(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    out = tool("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bootstrap, "--topic", topic,
               "--messages", str(records), "--timeout", "60000", "--group", f"perf-{time.monotonic_ns()}")
    lines = [line for line in out.splitlines() if line.strip() and not line.startswith("start.time")]
    cells = [c.strip() for c in lines[-1].split(",")]
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
    # fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec: MB.sec includes joining the group, fetch.MB.sec does not.
    return {"mb_per_s": float(cells[3]) * 1.048576, "records": float(cells[4]),
            "join_ms": float(cells[6]), "fetch_mb_per_s": float(cells[8]) * 1.048576}


def end_to_end(bootstrap: str, topic: str, count: int) -> dict[str, float]:
    out = tool("org.apache.kafka.tools.EndToEndLatency", bootstrap, topic, str(count), "all", str(RECORD_SIZE))
    avg = re.search(r"Avg latency: ([\d.]+) ms", out)
    pct = re.search(r"Percentiles: 50th = ([\d.]+), 99th = ([\d.]+), 99.9th = ([\d.]+)", out)
    if not avg or not pct:
        raise RuntimeError(f"no latency from EndToEndLatency:\n{out[-2000:]}")
    return {"avg_ms": float(avg.group(1)), "p50_ms": float(pct.group(1)), "p99_ms": float(pct.group(2)),
            "p999_ms": float(pct.group(3))}


def one(kind: str, root: Path, records: int, partitions: int, e2e: int) -> dict[str, Any]:
    print(f"{kind}...", file=sys.stderr, flush=True)
    with broker(kind, root) as (bootstrap, pid):
        create_topic(bootstrap, "perf", partitions)
        create_topic(bootstrap, "rdkafka", partitions)
        create_topic(bootstrap, "e2e", 1)
        idle_rss = rss_bytes(pid)
        cpu = cpu_seconds(pid)
        produced = producer_perf(bootstrap, "perf", records)
        produced["broker_cpu_s_per_gb"] = (cpu_seconds(pid) - cpu) / (records * RECORD_SIZE / 1e9)
        produced["broker_rss_mb"] = rss_bytes(pid) / 1e6
        produced["broker_idle_rss_mb"] = idle_rss / 1e6
        consumed = consumer_perf(bootstrap, "perf", records)
        rdkafka = produce_throughput(bootstrap, "rdkafka", records, reports="errors")
        latency = end_to_end(bootstrap, "e2e", e2e)
    return {"producer_perf": produced, "consumer_perf": consumed,
            "rdkafka_produce_mb_per_s": rdkafka["mb_per_s"], "end_to_end": latency}


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every number over the rounds, keeping the nesting."""
    first = rounds[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = median_of([r[key] for r in rounds])
        else:
            out[key] = round(statistics.median(r[key] for r in rounds), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000, help="1 KiB records per produce run")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2, help="each broker this many times, in rotating order")
    parser.add_argument("--e2e", type=int, default=2000, help="EndToEndLatency's round trips")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        for r in range(args.rounds):
            order = KINDS[r % 3:] + KINDS[:r % 3]
            for kind in order:
                results[kind].append(one(kind, Path(tmp) / f"{kind}-{r}", args.records, args.partitions, args.e2e))
    med = {kind: median_of(rounds) for kind, rounds in results.items()}
    ice, fsync, default = (med[k]["producer_perf"] for k in KINDS)
    print(json.dumps({
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records, "record_size": RECORD_SIZE, "partitions": args.partitions, "rounds": args.rounds,
        "icelog_archiver": "off (topics of kind none)",
        "ratios": {
            "throughput_icelog_over_kafka_fsync": round(ice["mb_per_s"] / fsync["mb_per_s"], 2),
            "ack_p99_icelog_over_kafka_fsync": round(ice["ack_p99_ms"] / max(fsync["ack_p99_ms"], 1), 2),
            "throughput_icelog_over_kafka_default": round(ice["mb_per_s"] / default["mb_per_s"], 2),
            "rdkafka_icelog_over_kafka_fsync": round(
                med["icelog"]["rdkafka_produce_mb_per_s"] / med["kafka-fsync"]["rdkafka_produce_mb_per_s"], 2),
            "consume_icelog_over_kafka_default": round(
                med["icelog"]["consumer_perf"]["mb_per_s"] / med["kafka-default"]["consumer_perf"]["mb_per_s"], 2),
            "consume_fetch_icelog_over_kafka_default": round(
                med["icelog"]["consumer_perf"]["fetch_mb_per_s"]
                / med["kafka-default"]["consumer_perf"]["fetch_mb_per_s"], 2),
        },
        **med,
    }, indent=2))


if __name__ == "__main__":
    main()
