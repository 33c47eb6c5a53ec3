"""Group, idempotence and transaction benchmark.

Run: .venv/bin/python bench/groups_bench.py [--records 200000] [--txns 200] [--only-protocols]
Measures, in one run against one fresh broker (so the ratios hold on a shared, noisy machine):
- from members joining to every member consuming, classic against KIP-848 (group.protocol=consumer), 3
  confluent-kafka members x 12 partitions, the protocols alternated round by round: three members starting
  together, and a third joining two that consume; p50 of each and KIP-848 / classic (the classic members heartbeat
  every --heartbeat-ms, and the broker gives KIP-848 members the same interval);
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


def _member(bootstrap: str, group: str, protocol: str, heartbeat_ms: int) -> ck.Consumer:
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                               "enable.auto.commit": False, "group.protocol": protocol}
    if protocol == "classic":  # KIP-848 members take both from the broker (librdkafka refuses them there)
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": heartbeat_ms})
    return ck.Consumer(conf)


def _until_all_consume(members: list[ck.Consumer], started: float) -> float:
    """Poll the members in turn until each has read a record and together they own every partition."""
    consumed = [False] * len(members)
    while True:
        for i, member in enumerate(members):
            message = member.poll(0.005)
            if message is not None and message.error() is None:
                consumed[i] = True
        if all(consumed):
            owned = [{tp.partition for tp in m.assignment()} for m in members]
            if all(owned) and len(set().union(*owned)) == PARTITIONS:
                return time.perf_counter() - started
        if time.perf_counter() - started > 120:
            assigned = [sorted(tp.partition for tp in m.assignment()) for m in members]
            raise RuntimeError(f"the members did not all consume within 120 s: read {consumed}, own {assigned}")


def join_to_consuming(bootstrap: str, rounds: int, heartbeat_ms: int) -> dict[str, object]:
    """Seconds from members joining to every member consuming, per protocol: three starting together, and a third
    joining two that consume."""
    topic = "bench-join"
    create_topic(bootstrap, topic, PARTITIONS)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(PARTITIONS * 2000):  # never drained: each member always has records to read
        producer.produce(topic, b"x" * 100, partition=i % PARTITIONS)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)
    times: dict[str, dict[str, list[float]]] = {p: {"start": [], "join": []} for p in ("classic", "consumer")}
    for r in range(rounds):
        for protocol in (("classic", "consumer") if r % 2 == 0 else ("consumer", "classic")):
            members = [_member(bootstrap, f"bench-{protocol}-start-{r}", protocol, heartbeat_ms) for _ in range(3)]
            started = time.perf_counter()
            for m in members:
                m.subscribe([topic])
            times[protocol]["start"].append(_until_all_consume(members, started))
            for m in members:
                m.close()
            members = [_member(bootstrap, f"bench-{protocol}-join-{r}", protocol, heartbeat_ms) for _ in range(2)]
            for m in members:
                m.subscribe([topic])
            _until_all_consume(members, time.perf_counter())
            # Settled: the members heartbeat as configured (librdkafka heartbeats from its own thread); not reading
            # meanwhile leaves them records to read after the join.
            time.sleep(2 * heartbeat_ms / 1000)
            members.append(_member(bootstrap, f"bench-{protocol}-join-{r}", protocol, heartbeat_ms))
            started = time.perf_counter()
            members[-1].subscribe([topic])
            times[protocol]["join"].append(_until_all_consume(members, started))
            for m in members:
                m.close()
    out: dict[str, object] = {"heartbeat_ms": heartbeat_ms, "rounds": rounds}
    for case in ("start", "join"):
        classic, consumer = (statistics.median(times[p][case]) for p in ("classic", "consumer"))
        out[case] = {"classic_s_p50": classic, "kip848_s_p50": consumer, "kip848_over_classic": consumer / classic,
                     "classic_s": times["classic"][case], "kip848_s": times["consumer"][case]}
    return out


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
    parser.add_argument("--heartbeat-ms", type=int, default=500,
                        help="both protocols' heartbeat interval (Kafka's defaults: 3000 classic, 5000 KIP-848)")
    parser.add_argument("--only-protocols", action="store_true",
                        help="only the classic / KIP-848 comparison (no rebalance, produce or transaction figures)")
    parser.add_argument(
        "--initial-delay-ms",
        type=int,
        default=0,
        help="group.initial.rebalance.delay.ms of the broker (Kafka's default is 3000)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icelog-groups-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", env={
            "ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": str(args.initial_delay_ms),
            "ICELOG_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(args.heartbeat_ms),
        }).start()
        try:
            results: dict[str, object] = {"initial_rebalance_delay_ms": args.initial_delay_ms}
            print("join to consuming, classic and KIP-848 ...", file=sys.stderr, flush=True)
            results["join_to_consuming_3x12"] = join_to_consuming(broker.bootstrap, args.rounds, args.heartbeat_ms)
            if args.only_protocols:
                print(json.dumps(results, indent=2))
                return
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
