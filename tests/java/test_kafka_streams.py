"""Kafka Streams (4.1) with processing.guarantee=exactly_once_v2 on icelog: a word count (a repartition topic, a state
store and its changelog topic) killed with SIGKILL and restarted; its committed output is exact, each word's counts
1, 2, … n with none repeated or skipped.
"""

from __future__ import annotations

import struct
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.java import KafkaJava

WAIT_S = 180.0  # bounds each wait for output; a failing test then shows what did arrive


def produce_lines(bootstrap: str, topic: str, lines: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for line in lines:
        producer.produce(topic, value=line)
    assert producer.flush(30) == 0


def committed_counts(bootstrap: str, topic: str) -> dict[str, list[int]]:
    """Every committed count of the output topic, per word, in offset order (read_committed, to the end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    counts: dict[str, list[int]] = {}
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                at_end.add(msg.partition())
                continue
            counts.setdefault(msg.key().decode(), []).append(struct.unpack(">q", msg.value())[0])
    finally:
        consumer.close()
    return counts


def wait_for(bootstrap: str, topic: str, done: Callable[[dict[str, list[int]]], bool]) -> dict[str, list[int]]:
    """The committed counts once `done` says so (or WAIT_S has passed: the caller's assertion shows them)."""
    deadline = time.monotonic() + WAIT_S
    counts = committed_counts(bootstrap, topic)
    while not done(counts) and time.monotonic() < deadline:
        time.sleep(1)
        counts = committed_counts(bootstrap, topic)
    return counts


def test_word_count_exactly_once_v2_survives_sigkill(kafka_java: KafkaJava, broker: BrokerProcess,
                                                     topic_name: str, tmp_path: Path) -> None:
    source, sink = f"{topic_name}-lines", f"{topic_name}-counts"
    create_topic(broker.bootstrap, source, partitions=2)
    create_topic(broker.bootstrap, sink, partitions=2)
    first = [f"alpha beta w{i % 7}" for i in range(300)]
    second = [f"beta gamma w{i % 5}" for i in range(300)]
    produce_lines(broker.bootstrap, source, first)
    command = kafka_java.command("WordCount", broker.bootstrap, f"{topic_name}-app", source, sink,
                                 str(tmp_path / "state"))
    log = open(tmp_path / "streams.log", "ab")  # noqa: SIM115 - the JVMs write to it until they end
    app = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        seen = wait_for(broker.bootstrap, sink, lambda counts: bool(counts))
        assert seen, f"no committed output:\n{(tmp_path / 'streams.log').read_text()[-3000:]}"
        app.kill()  # SIGKILL: an open transaction is left behind, the state store has no checkpoint
        app.wait()
        produce_lines(broker.bootstrap, source, second)
        app = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        expected = Counter(word for line in first + second for word in line.split())
        counts = wait_for(broker.bootstrap, sink,
                          lambda got: {word: values[-1] for word, values in got.items()} == expected)
    finally:
        app.kill()
        app.wait()
        log.close()
    assert {word: values[-1] for word, values in counts.items()} == expected
    # Exactly once: every word's committed counts go up by one, none repeated or lost across the kill.
    assert all(values == list(range(1, expected[word] + 1)) for word, values in counts.items())
