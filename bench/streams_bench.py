"""Kafka Streams exactly-once throughput on icelog (issue 45): a word count with processing.guarantee=exactly_once_v2.

The application is tests/java/drivers/WordCount.java, the one tests/java/test_kafka_streams.py kills and restarts:
lines split into words, re-keyed by word (a repartition topic), counted in a RocksDB store (a changelog topic) with
the record cache off, so every count reaches the output topic. `--records` lines of `--words` words are produced
into a topic of `--partitions` partitions first; then the application starts (one JVM, one stream thread) and is
timed from its RUNNING state until its consumer group's committed offsets (transactional offset commits, under
exactly-once) reach the end of its input and of its repartition topic. Its figures: input lines per second, and
words per second (each word is a record through the repartition topic, the store's changelog and the output).

Baseline in the same run, alternated round by round: the same application with processing.guarantee=at_least_once
on the same broker (what exactly-once costs there). `--vs-kafka` adds Apache Kafka 4.1.1 (one KRaft node, the test
JVM options) running the exactly-once application on the same input, for icelog / Kafka. Each run checks its
output: as many committed output records as words, and every word's last count right.

    python bench/streams_bench.py [--records 200000] [--words 4] [--partitions 4] [--rounds 2] [--vs-kafka]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
from bench.broker_bench import create_topic  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.java import KafkaJava  # noqa: E402
from tests.support.kafka_broker import KafkaBroker  # noqa: E402

EOS, ALOS = "exactly_once_v2", "at_least_once"
VOCABULARY = 1000  # distinct words: the store's keys
WAIT_S = 600.0


def lines_of(records: int, words: int) -> list[str]:
    return [" ".join(f"w{(i * 7 + j * 131) % VOCABULARY}" for j in range(words)) for i in range(records)]


def produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all",
                            "queue.buffering.max.messages": 1_000_000})
    for i, line in enumerate(lines):
        producer.produce(topic, key=str(i), value=line)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("the input was not all acknowledged")


def committed(admin: AdminClient, group: str, topic: str, partitions: int) -> int:
    """The application's committed offsets on one of the topics it reads, summed (its group is its application id)."""
    asked = [ck.TopicPartition(topic, p) for p in range(partitions)]
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, asked)], request_timeout=10)
    answer = next(iter(futures.values())).result(15)
    return sum(max(tp.offset, 0) for tp in answer.topic_partitions)


def read_output(bootstrap: str, topic: str, partitions: int) -> tuple[int, dict[str, int]]:
    """How many committed records the output topic holds, and each word's last count."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "isolation.level": "read_committed",
                            "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    total, last, at_end = 0, {}, set()
    deadline = time.monotonic() + 120
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    at_end.add(msg.partition())
                    continue
                total += 1
                last[msg.key().decode()] = struct.unpack(">q", msg.value())[0]
    finally:
        consumer.close()
    return total, last


def wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def one_run(java: KafkaJava, bootstrap: str, source: str, name: str, guarantee: str, partitions: int,
            lines: int, expected: Counter[str], work: Path) -> dict[str, Any]:
    """Run the word count with `guarantee` over the whole input; its rate from RUNNING to every line committed."""
    sink, app_id = f"{name}-counts", f"{name}-app"
    words = sum(expected.values())
    create_topic(bootstrap, sink, partitions)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    log_path = work / f"{name}.log"
    with open(log_path, "wb") as log:
        app = subprocess.Popen(java.command("WordCount", bootstrap, app_id, source, sink, str(work / name), guarantee),
                               stdout=subprocess.PIPE, stderr=log)
        try:
            assert app.stdout is not None
            for raw in app.stdout:  # the driver prints its state changes
                if raw.strip() == b"STATE RUNNING":
                    break
                if raw.strip() in (b"STATE ERROR", b"STATE NOT_RUNNING"):
                    raise RuntimeError(f"{name} stopped: {log_path}")
            running = time.perf_counter()
            # Done when both sub-topologies have committed all they read: the lines, then every word through the
            # repartition topic (whose records the counting task turns into output in the same transaction).
            repartition = f"{app_id}-by-word-repartition"
            wait(lambda: committed(admin, app_id, source, partitions) >= lines
                 and committed(admin, app_id, repartition, partitions) >= words, f"{name} to commit its input")
            seconds = time.perf_counter() - running
        finally:
            app.terminate()
            try:
                app.wait(60)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()
    records, last = read_output(bootstrap, sink, partitions)
    return {
        "guarantee": guarantee, "seconds": round(seconds, 2),
        "lines_per_s": round(lines / seconds), "words_per_s": round(words / seconds),
        "output_exact": records == words and last == dict(expected),
        "output_records": records,
    }


def broker_runs(kind: str, java: KafkaJava, work: Path, plan: list[str], args: argparse.Namespace,
                lines: list[str], expected: Counter[str]) -> list[dict[str, Any]]:
    """Start `kind` (icelog or kafka), produce the input once, run the word count once per guarantee in `plan`."""
    server: BrokerProcess | KafkaBroker
    server = BrokerProcess(work / "icelog-data") if kind == "icelog" else KafkaBroker(work / "kafka")
    server.start()
    try:
        source = f"bench-streams-{kind}-lines"
        create_topic(server.bootstrap, source, args.partitions)
        produce(server.bootstrap, source, lines)
        out = []
        for i, guarantee in enumerate(plan):
            print(f"{kind} {guarantee}...", file=sys.stderr, flush=True)
            run = one_run(java, server.bootstrap, source, f"bench-streams-{kind}-{i}", guarantee, args.partitions,
                          len(lines), expected, work)
            out.append({"broker": kind, **run})
        return out
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000, help="input lines")
    parser.add_argument("--words", type=int, default=4, help="words a line")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each guarantee, alternated")
    parser.add_argument("--vs-kafka", action="store_true", help="also exactly-once on Apache Kafka 4.1.1")
    args = parser.parse_args()
    lines = lines_of(args.records, args.words)
    expected = Counter(word for line in lines for word in line.split())
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        work = Path(tmp)
        java = KafkaJava(work / "classes")
        plan = [g for _ in range(args.rounds) for g in (EOS, ALOS)]
        runs = broker_runs("icelog", java, work, plan, args, lines, expected)
        if args.vs_kafka:
            runs += broker_runs("kafka", java, work, [EOS] * args.rounds, args, lines, expected)

    def median(broker: str, guarantee: str) -> float:
        return statistics.median(r["lines_per_s"] for r in runs if (r["broker"], r["guarantee"]) == (broker, guarantee))

    eos, alos = median("icelog", EOS), median("icelog", ALOS)
    result: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "records": args.records, "words": args.words, "partitions": args.partitions, "rounds": args.rounds,
        "eos_lines_per_s": eos, "eos_words_per_s": round(eos * args.words),
        "alos_lines_per_s": alos, "eos_over_alos": round(eos / alos, 2),
        "every_output_exact": all(r["output_exact"] for r in runs),
    }
    if args.vs_kafka:
        kafka = median("kafka", EOS)
        result.update({"kafka_eos_lines_per_s": kafka, "eos_icelog_over_kafka": round(eos / kafka, 2)})
    result["runs"] = runs
    print(json.dumps(result, indent=2))
    if not result["every_output_exact"]:
        sys.exit("a run's output was not exact: see runs")


if __name__ == "__main__":
    main()
