"""Mutated requests of every API and version (tests/support/fuzz.py) against a real broker, for a bounded time:
afterwards the broker is alive, its log holds no traceback and no long quote of input, a fresh client still
produces and consumes, and its descriptors and memory are back near where they started (issue 29)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.fuzz import FUZZ_TOPIC, fuzz
from tests.support.hostile import gzip_batch, produce_frame, read_produce_response
from tests.support.proc import fd_count, rss_bytes

FUZZ_SECONDS = 40
SEED = 2029
MAX_LOG_LINE = 1_000  # one bounded line per bad request: no quote of unbounded input
MEMORY_SLACK = 256 << 20  # Python keeps freed arenas; a leak of what the fuzz sent would be far more




def _round_trip(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 20_000})
    reports: list[object] = []
    producer.produce(topic, b"after-the-fuzz", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(30)
    assert reports == [None], reports
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "after-fuzz", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None and msg.value() == b"after-the-fuzz":
                return
        raise AssertionError("the fresh consumer read nothing")
    finally:
        consumer.close()


def _start_validation_process(broker: BrokerProcess) -> None:
    """One batch too big to check on the event loop (wire/validator.py starts on first use)."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(produce_frame("after-fuzz", {0: gzip_batch(4 << 20, b"big")}, 1))
        answer = read_produce_response(sock).responses[0].partition_responses[0]
    assert answer.error_code == 0, answer


def test_fuzzed_requests_leave_the_broker_serving(fresh_broker: BrokerProcess) -> None:
    fresh_broker.env = {"ICELOG_CONNECTIONS_MAX_IDLE_MS": "5000"}
    broker = fresh_broker.start()
    assert broker.proc is not None
    pid = broker.proc.pid
    create_topic(broker.bootstrap, FUZZ_TOPIC, partitions=2)
    create_topic(broker.bootstrap, "after-fuzz")
    _start_validation_process(broker)  # its pipes are the broker's for good: counted before, not as a leak
    fds, rss = fd_count(pid), rss_bytes(pid)
    log_start = Path(broker.log_path).stat().st_size

    stats = fuzz("127.0.0.1", broker.port, SEED, FUZZ_SECONDS)
    print(f"fuzz: {stats.sent} requests, {stats.reconnects} reconnects, {stats.answered_bytes} bytes answered")

    assert broker.proc.poll() is None, "the broker died"
    assert stats.sent > 1_000, stats
    _round_trip(broker.bootstrap, "after-fuzz")
    deadline = time.monotonic() + 30
    while fd_count(pid) > fds + 10 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert fd_count(pid) <= fds + 10, f"descriptors {fds} before, {fd_count(pid)} after"
    assert rss_bytes(pid) <= rss + MEMORY_SLACK, f"memory {rss >> 20} MiB before, {rss_bytes(pid) >> 20} after"
    text = Path(broker.log_path).read_bytes()[log_start:].decode(errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 2000 : text.index("Traceback") + 3000]
    longest = max((len(line) for line in text.splitlines()), default=0)
    assert longest <= MAX_LOG_LINE, f"a log line of {longest} characters"
