"""Connections a hostile or buggy client opens and abandons cost the broker nothing once they are gone.

Raw sockets (kafka-python's protocol classes) so a test controls every byte; the broker is a real process,
and the test reads its descriptors, sockets and memory from /proc.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic

FetchTopic = FetchRequest.FetchTopic
FetchPartition = FetchTopic.FetchPartition
TCP_CLOSE_WAIT = "08"


def _frame(request: Any, correlation_id: int = 1) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="limits-test")
    return bytes(request.encode(header=True, framed=True))


def _long_poll(topic: str, max_wait_ms: int) -> bytes:
    return _frame(FetchRequest[12](
        max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        topics=[FetchTopic(topic=topic, partitions=[
            FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
        ])],
    ))


def _api_versions(sock: socket.socket) -> None:
    """One request/response round trip on a raw socket."""
    sock.sendall(_frame(ApiVersionsRequest[0]()))
    size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
    ApiVersionsResponse[0].decode(_recv_exactly(sock, size), header=True)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the broker closed the connection instead of answering"
        data += chunk
    return data


def _closed_by_broker(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _pid(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return broker.proc.pid


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _close_wait_sockets(port: int) -> int:
    """Sockets on the broker's listening port that the peer closed and the broker has not (CLOSE_WAIT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == TCP_CLOSE_WAIT:
                    count += 1
    return count


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _eventually(check: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _producer_round_trips(broker: BrokerProcess, topic: str) -> None:
    errors: list[KafkaError | None] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        errors.append(err)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "message.timeout.ms": 10_000})
    producer.produce(topic, b"still served", on_delivery=delivered)
    assert producer.flush(15) == 0
    assert errors == [None]


def test_abandoned_long_polls_are_released_at_once(fresh_broker: BrokerProcess, topic_name: str) -> None:
    broker = fresh_broker.start()
    create_topic(broker.bootstrap, topic_name)
    _producer_round_trips(broker, topic_name + "-warm")
    pid = _pid(broker)
    fds_before = _fd_count(pid)

    request = _long_poll(topic_name + "-empty", max_wait_ms=600_000)
    create_topic(broker.bootstrap, topic_name + "-empty")
    sockets = [socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(200)]
    for sock in sockets:
        sock.sendall(request)
    assert _eventually(lambda: _fd_count(pid) >= fds_before + 200, 10), "the broker did not accept the polls"
    for sock in sockets:
        sock.close()

    assert _eventually(lambda: _close_wait_sockets(broker.port) == 0, 3), (
        f"{_close_wait_sockets(broker.port)} sockets left in CLOSE_WAIT"
    )
    assert _eventually(lambda: _fd_count(pid) <= fds_before + 5, 3), (
        f"{_fd_count(pid) - fds_before} descriptors still held"
    )
    _producer_round_trips(broker, topic_name)
