"""Requests a hostile (or buggy) client sends, as raw frames: compression bombs and abandoned long polls
(tests/wire/test_compression_bomb.py, bench/hostile_bench.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.support.clients_util import recv_exactly

CODEC_GZIP = 1
LIBRDKAFKA_LIMIT = 100_000_000  # receive.message.max.bytes: what librdkafka's decompression reads


def gzip_batch(value_size: int, first_value: bytes = b"") -> bytes:
    """One gzip batch of one record whose value is `first_value` then zero bytes, `value_size` in all (a few
    hundred KB compressed for 100 MB)."""
    builder = DefaultRecordBatchBuilder(2, CODEC_GZIP, 0, -1, -1, -1, value_size + (1 << 20))
    value = first_value + b"\x00" * (value_size - len(first_value))
    builder.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce_frame(topic: str, batches: dict[int, bytes], correlation_id: int) -> bytes:
    """A framed Produce v8 (acks=all) of one batch per partition."""
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=records)
            for p, records in batches.items()
        ])
    ])
    request.API_VERSION = 8
    request.with_header(correlation_id=correlation_id, client_id="hostile")
    return bytes(request.encode(version=8, header=True, framed=True))


def long_poll_frame(topic: str, max_wait_ms: int, partitions: int = 1) -> bytes:
    """A framed Fetch v12 from offset 0 of `partitions` partitions that waits up to `max_wait_ms` for data."""
    fetch_topic = FetchRequest.FetchTopic
    request = FetchRequest[12](
        max_wait_ms=max_wait_ms, min_bytes=1 << 30, max_bytes=1 << 20, isolation_level=0,
        topics=[fetch_topic(topic=topic, partitions=[
            fetch_topic.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
            for p in range(partitions)
        ])],
    )
    request.with_header(correlation_id=1, client_id="hostile")
    return bytes(request.encode(header=True, framed=True))


def read_produce_response(sock: socket.socket) -> Any:
    """The next Produce v8 response on `sock`."""
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return ProduceResponse.decode(recv_exactly(sock, size), version=8, header=True)


class InnocentProducer:
    """confluent-kafka, acks=all, one record at a time: the send and ack time of each."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
        self.acks: list[tuple[float, float]] = []
        self.errors: list[KafkaError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()

            def delivered(err: KafkaError | None, _msg: Message, sent: float = sent) -> None:
                if err is not None:
                    self.errors.append(err)
                else:
                    self.acks.append((sent, time.monotonic()))

            self.producer.produce(self.topic, b"innocent", on_delivery=delivered)
            self.producer.flush(30)

    def __enter__(self) -> InnocentProducer:
        self.producer.produce(self.topic, b"warm-up")  # metadata and connection before the attack
        assert self.producer.flush(30) == 0
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def latencies_ms(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """Sorted ack latencies of the records sent in [since, until]."""
        return sorted((ack - sent) * 1000 for sent, ack in self.acks if since <= sent <= until)
