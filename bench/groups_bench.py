"""Group, idempotence and transaction benchmark.

Run: .venv/bin/python bench/groups_bench.py [--records 200000] [--txns 200]
Measures, in one run against one fresh broker (so the ratios hold on a shared, noisy machine):
- consumer-group rebalance time, 3 confluent-kafka members x 12 partitions: initial join, a member
  leaving (clean LeaveGroup) and a member joining, each until every partition is owned again;
- produce throughput with enable.idempotence on vs off (alternated, same records);
- transactional commit latency p50/p99 (commit_transaction of 10 records over 2 partitions), next to
  the baseline of a plain acks=all flush of the same 10 records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from tests.support.broker import BrokerProcess  # noqa: E402

PARTITIONS = 12


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep the handle alive until the result is in
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)


def _owned(consumers: list[ck.Consumer], assignments: dict[int, set[int]]) -> int:
    for i, consumer in enumerate(consumers):
        consumer.poll(0.02)
        assignments[i] = {tp.partition for tp in consumer.assignment()}
    return len(set().union(*assignments.values())) if assignments else 0


def _wait_owned(consumers: list[ck.Consumer], expect_each: bool) -> float:
    started = time.perf_counter()
    assignments: dict[int, set[int]] = {}
    while True:
        owned = _owned(consumers, assignments)
        if owned == PARTITIONS and (not expect_each or all(assignments.values())):
            return time.perf_counter() - started
        if time.perf_counter() - started > 120:
            raise RuntimeError(f"rebalance did not finish: {assignments}")


def _consumer(bootstrap: str, group: str) -> ck.Consumer:
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "auto.offset.reset": "earliest",
        }
    )
    return consumer


def rebalance_times(bootstrap: str, rounds: int) -> dict[str, float]:
    topic = "bench-groups"
    create_topic(bootstrap, topic, PARTITIONS)
    joins, leaves, adds = [], [], []
    for r in range(rounds):
        group = f"bench-{r}"
        members = [_consumer(bootstrap, group) for _ in range(3)]
        started = time.perf_counter()
        for m in members:
            m.subscribe([topic])
        _wait_owned(members, expect_each=True)
        joins.append(time.perf_counter() - started)
        leaving = members.pop()
        started = time.perf_counter()
        leaving.close()
        time.sleep(0.05)
        _wait_owned(members, expect_each=True)
        leaves.append(time.perf_counter() - started)
        newcomer = _consumer(bootstrap, group)
        started = time.perf_counter()
        newcomer.subscribe([topic])
        members.append(newcomer)
        _wait_owned(members, expect_each=True)
        adds.append(time.perf_counter() - started)
        for m in members:
            m.close()
    return {
        "initial_join_s_median": statistics.median(joins),
        "member_leaves_s_median": statistics.median(leaves),
        "member_joins_s_median": statistics.median(adds),
    }


def produce_rate(bootstrap: str, topic: str, records: int, idempotent: bool) -> float:
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": idempotent,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = b"x" * 512
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % 6)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records left unsent")
    return records / (time.perf_counter() - started)


def txn_latencies(bootstrap: str, txns: int) -> dict[str, float]:
    topic = "bench-txn"
    create_topic(bootstrap, topic, 2)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-txn", "linger.ms": 0})
    producer.init_transactions(30)
    commits, whole = [], []
    for _ in range(txns):
        started = time.perf_counter()
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, b"v" * 100, partition=i % 2)
        producer.flush(30)
        before_commit = time.perf_counter()
        producer.commit_transaction(30)
        done = time.perf_counter()
        commits.append((done - before_commit) * 1000)
        whole.append((done - started) * 1000)
    plain = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    flushes = []
    for _ in range(txns):
        started = time.perf_counter()
        for i in range(10):
            plain.produce(topic, b"v" * 100, partition=i % 2)
        plain.flush(30)
        flushes.append((time.perf_counter() - started) * 1000)

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    return {
        "commit_ms_p50": pct(commits, 0.5),
        "commit_ms_p99": pct(commits, 0.99),
        "whole_txn_ms_p50": pct(whole, 0.5),
        "whole_txn_ms_p99": pct(whole, 0.99),
        "baseline_plain_flush_ms_p50": pct(flushes, 0.5),
        "baseline_plain_flush_ms_p99": pct(flushes, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--txns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--initial-delay-ms",
        type=int,
        default=0,
        help="group.initial.rebalance.delay.ms of the broker (Kafka's default is 3000)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icelog-groups-bench-") as tmp:
        broker = BrokerProcess(
            Path(tmp) / "data", env={"ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": str(args.initial_delay_ms)}
        ).start()
        try:
            results: dict[str, object] = {"initial_rebalance_delay_ms": args.initial_delay_ms}
            print("rebalances ...", file=sys.stderr, flush=True)
            results["rebalance_3x12"] = rebalance_times(broker.bootstrap, args.rounds)
            print("produce, idempotence off/on ...", file=sys.stderr, flush=True)
            create_topic(broker.bootstrap, "bench-idem", 6)
            off, on = [], []
            for _ in range(2):  # alternate so drift on a shared machine hits both sides
                off.append(produce_rate(broker.bootstrap, "bench-idem", args.records // 2, False))
                on.append(produce_rate(broker.bootstrap, "bench-idem", args.records // 2, True))
            results["produce_records_per_s"] = {
                "idempotence_off": statistics.mean(off),
                "idempotence_on": statistics.mean(on),
                "ratio_on_over_off": statistics.mean(on) / statistics.mean(off),
            }
            print("transactions ...", file=sys.stderr, flush=True)
            results["transactions"] = txn_latencies(broker.bootstrap, args.txns)
        finally:
            broker.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
