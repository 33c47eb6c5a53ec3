"""Requests a hostile (or buggy) client sends, as raw frames: compression bombs, abandoned long polls, and what
a client that has not logged in can do (announced sizes, long credentials, silence); the innocent clients that
must keep being served meanwhile (tests/wire/test_compression_bomb.py, tests/security/test_prelogin_attacks.py,
bench/hostile_bench.py)."""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.wire import codec
from tests.support.clients_util import recv_exactly, request_frame

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
    """confluent-kafka, acks=all, one record at a time: the send and ack time of each (`conf`: how it logs in)."""

    def __init__(self, bootstrap: str, topic: str, conf: dict[str, str] | None = None) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, **(conf or {})})
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


# -- before the login ----------------------------------------------------------------------------------------------

def connect(port: int, ca: Path | None = None, timeout: float = 30.0) -> socket.socket:
    """A connection to a listener on 127.0.0.1; TLS (the handshake done) when `ca` is given."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if ca is None:
        return sock
    context = ssl.create_default_context(cafile=str(ca))
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the broker closes `sock` within `within_s` (0: whether it has already); whatever it sent before is
    read and dropped."""
    deadline = time.monotonic() + within_s
    while True:
        poller = select.poll()  # not select(): a flood's descriptors are past its 1,024
        poller.register(sock, select.POLLIN)
        if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            return False
        sock.settimeout(1)
        try:
            if sock.recv(1 << 16) == b"":
                return True
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return True
        except (TimeoutError, BlockingIOError):  # TLS: a record begun but not whole yet
            pass


def _answer(sock: socket.socket, key: int, version: int) -> Any:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return codec.response_class(key).decode(recv_exactly(sock, size)[4:], version=version)


def sasl_login(sock: socket.socket, mechanism: str, token: bytes) -> tuple[int, bytes]:
    """SaslHandshake v1 then one SaslAuthenticate v1 with `token`: (error code, server token)."""
    sock.sendall(request_frame(SaslHandshakeRequest(mechanism=mechanism), 1, 1))
    handshake = _answer(sock, ApiKey.SaslHandshake, 1)
    assert handshake.error_code == 0, handshake
    sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=token), 1, 2))
    answer = _answer(sock, ApiKey.SaslAuthenticate, 1)
    return int(answer.error_code), bytes(answer.auth_bytes)


def plain_token(user: str, password: str) -> bytes:
    return f"\0{user}\0{password}".encode()


def scram_first(user: str) -> bytes:
    """A SCRAM client-first message for `user` (long names make long messages)."""
    return f"n,,n={user},r={uuid.uuid4().hex}".encode()


class RoundTrips:
    """An authenticated producer (acks=all) and consumer on one partition, in a thread: each round trip produces
    a record and reads it back, again and again; `completed` counts them. Tests assert that round trips keep
    completing during an attack, never how long they take."""

    def __init__(self, conf: dict[str, str], topic: str) -> None:
        self.producer = Producer({**conf, "acks": "all", "linger.ms": 0, "enable.idempotence": False})
        self.consumer = Consumer({**conf, "group.id": f"round-trips-{uuid.uuid4().hex[:6]}",
                                  "enable.auto.commit": False})
        self.topic = topic
        self.completed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RoundTrips:
        self.consumer.assign([TopicPartition(self.topic, 0, 0)])
        self._thread.start()
        assert self.wait_for(self.completed + 1, 120), f"no first round trip: {self.errors[-3:]}"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(120)
        self.consumer.close()

    def _run(self) -> None:
        sent = 0
        while not self._stop.is_set():
            value = f"round-trip-{sent}".encode()
            reports: list[KafkaError | None] = []
            self.producer.produce(self.topic, value, partition=0, on_delivery=lambda err, _m, r=reports: r.append(err))
            self.producer.flush(60)
            if reports != [None]:
                self.errors.append(f"produce: {reports}")
                continue
            sent += 1
            deadline = time.monotonic() + 60
            while not self._stop.is_set() and time.monotonic() < deadline:
                msg = self.consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error() is not None:
                    self.errors.append(f"consume: {msg.error()}")
                elif msg.value() == value:
                    with self._progress:
                        self.completed += 1
                        self._progress.notify_all()
                    break

    def wait_for(self, count: int, within_s: float) -> bool:
        """Whether `count` round trips have completed within `within_s`."""
        with self._progress:
            return self._progress.wait_for(lambda: self.completed >= count, within_s)
