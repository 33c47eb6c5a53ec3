"""A compression bomb is refused without stalling anyone (issue 29, case 1).

Produce requests whose few hundred kilobytes of gzip decompress past what librdkafka reads back (100 MB a
batch) or past what one request may make the broker decompress (MAX_REQUEST_INFLATION) are refused with
MESSAGE_TOO_LARGE and store nothing; while the broker works through them on its validation thread, an
innocent confluent-kafka producer keeps getting acknowledgements. Requests of one connection still append in
the order they were sent when a big one is checked off the event loop.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.hostile import (
    LIBRDKAFKA_LIMIT,
    InnocentProducer,
    gzip_batch,
    produce_frame,
    read_produce_response,
)

MESSAGE_TOO_LARGE = 10


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """Just past what librdkafka reads: ~100 KB of gzip."""
    return gzip_batch(LIBRDKAFKA_LIMIT + 1)


@pytest.fixture
def bombed(fresh_broker: BrokerProcess, topic_name: str) -> Iterator[tuple[BrokerProcess, str]]:
    broker = fresh_broker.start()
    create_topic(broker.bootstrap, topic_name, partitions=3)
    create_topic(broker.bootstrap, f"{topic_name}-innocent")
    yield broker, topic_name


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bomb-offsets"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        consumer.close()


def test_bomb_is_refused_while_an_innocent_producer_keeps_going(
    bombed: tuple[BrokerProcess, str], bomb: bytes
) -> None:
    broker, topic = bombed
    assert len(bomb) < 1 << 20, "the bomb fits max.message.bytes: only its inflation gives it away"
    with InnocentProducer(broker.bootstrap, f"{topic}-innocent") as innocent, socket.create_connection(
        ("127.0.0.1", broker.port), timeout=60
    ) as sock:
        time.sleep(0.5)
        sent = time.monotonic()
        # Three requests pipelined: one batch over librdkafka's limit per partition, each request ~300 KB.
        for correlation in (1, 2, 3):
            sock.sendall(produce_frame(topic, {0: bomb, 1: bomb, 2: bomb}, correlation))
        answers = [read_produce_response(sock) for _ in range(3)]
        answered = time.monotonic()
        time.sleep(0.2)
    codes = [p.error_code for answer in answers for p in answer.responses[0].partition_responses]
    assert codes == [MESSAGE_TOO_LARGE] * 9, codes
    assert not innocent.errors, innocent.errors
    during = [ack - send for send, ack in innocent.acks if send >= sent and ack <= answered]
    latencies = sorted(ack - send for send, ack in innocent.acks)
    print(f"bombs answered in {answered - sent:.2f} s; innocent acks during them: {len(during)}, "
          f"max latency {max(latencies) * 1000:.0f} ms over {len(latencies)} acks")
    # On the event loop the bombs would hold every other client until they were answered: no ack between.
    assert len(during) >= 5, f"only {len(during)} innocent acks while the bombs were checked"
    assert _end_offsets(broker.bootstrap, topic, 3) == [0, 0, 0], "a refused bomb stores nothing"


def test_one_request_may_inflate_only_so_far(bombed: tuple[BrokerProcess, str]) -> None:
    """Three batches of 95 MB each are each readable, but one request may not make the broker decompress them
    all: the partition past the request's budget is refused, the others are stored and read back."""
    broker, topic = bombed
    big = gzip_batch(95_000_000, first_value=b"big")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        sock.sendall(produce_frame(topic, {0: big, 1: big, 2: big}, 1))
        answer = read_produce_response(sock)
    codes = {p.index: p.error_code for p in answer.responses[0].partition_responses}
    assert codes == {0: 0, 1: 0, 2: MESSAGE_TOO_LARGE}, codes
    assert _end_offsets(broker.bootstrap, topic, 3) == [1, 1, 0]


def test_a_connections_requests_append_in_order(bombed: tuple[BrokerProcess, str]) -> None:
    """A big batch checked on the validation thread, then a small one checked at once, pipelined on one
    connection: they get offsets in the order they were sent, as from Kafka."""
    broker, topic = bombed
    big = gzip_batch(40_000_000, first_value=b"first")
    small = gzip_batch(10, first_value=b"second")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        sock.sendall(produce_frame(topic, {0: big}, 1) + produce_frame(topic, {0: small}, 2))
        first, second = (read_produce_response(sock).responses[0].partition_responses[0] for _ in range(2))
    assert (first.error_code, first.base_offset) == (0, 0)
    assert (second.error_code, second.base_offset) == (0, 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bomb-order",
                         "auto.offset.reset": "earliest", "fetch.max.bytes": 50_000_000,
                         "receive.message.max.bytes": LIBRDKAFKA_LIMIT})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                values.append(msg.value()[:6])
    finally:
        consumer.close()
    assert values == [b"first\x00", b"second"], "librdkafka reads both back, in the order they were sent"
