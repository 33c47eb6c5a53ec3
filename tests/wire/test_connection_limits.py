"""Connections a hostile or buggy client opens and abandons cost the broker nothing once they are gone.

Raw sockets (kafka-python's protocol classes) so a test controls every byte; the broker is a real process,
and the test reads its descriptors, sockets and memory from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic, recv_exactly
from tests.support.proc import fd_count, rss_bytes

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
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    ApiVersionsResponse[0].decode(recv_exactly(sock, size), header=True)



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
    fds_before = fd_count(pid)

    request = _long_poll(topic_name + "-empty", max_wait_ms=600_000)
    create_topic(broker.bootstrap, topic_name + "-empty")
    sockets = [socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(200)]
    for sock in sockets:
        sock.sendall(request)
    assert _eventually(lambda: fd_count(pid) >= fds_before + 200, 10), "the broker did not accept the polls"
    for sock in sockets:
        sock.close()

    assert _eventually(lambda: _close_wait_sockets(broker.port) == 0, 3), (
        f"{_close_wait_sockets(broker.port)} sockets left in CLOSE_WAIT"
    )
    assert _eventually(lambda: fd_count(pid) <= fds_before + 5, 3), (
        f"{fd_count(pid) - fds_before} descriptors still held"
    )
    _producer_round_trips(broker, topic_name)


def test_idle_connections_are_closed(fresh_broker: BrokerProcess, topic_name: str) -> None:
    fresh_broker.env = {"ICELOG_CONNECTIONS_MAX_IDLE_MS": "1500"}
    broker = fresh_broker.start()
    create_topic(broker.bootstrap, topic_name)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as idle, \
            socket.create_connection(("127.0.0.1", broker.port), timeout=10) as polling:
        _api_versions(idle)
        # a long poll in flight is not idleness: it is answered after its max_wait_ms, past the idle time
        polling.sendall(_long_poll(topic_name, max_wait_ms=2500))
        assert _closed_by_broker(idle, within_s=5), "an idle connection stayed open"
        size = struct.unpack(">i", recv_exactly(polling, 4))[0]
        assert len(recv_exactly(polling, size)) == size


def _served_connection(broker: BrokerProcess, within_s: float = 10) -> socket.socket:
    """A connection the broker serves. The start-up probe (BrokerProcess.start connects and closes) holds a slot
    until the broker reads its close, so a connection made just after may be the one past the limit: try again."""
    deadline = time.monotonic() + within_s
    while True:
        sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        try:
            _api_versions(sock)
            return sock
        except ConnectionError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("setting", ["max.connections", "max.connections.per.ip"])
def test_connections_are_limited(fresh_broker: BrokerProcess, setting: str) -> None:
    fresh_broker.env = {"ICELOG_" + setting.replace(".", "_").upper(): "5"}
    broker = fresh_broker.start()
    allowed = [_served_connection(broker) for _ in range(5)]
    extra = [socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(30)]
    assert all(_closed_by_broker(sock, within_s=5) for sock in extra), "a connection past the limit was served"
    for sock in extra:
        sock.close()
    allowed.pop().close()
    time.sleep(0.5)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as again:
        _api_versions(again)  # a freed slot is usable again
    for sock in allowed:
        _api_versions(sock)
        sock.close()
    refusals = [line for line in broker.log().splitlines() if f"{setting}=5" in line]
    assert 1 <= len(refusals) <= 2 and all(len(line) < 300 for line in refusals)


def test_queued_request_bytes_bound_memory(fresh_broker: BrokerProcess, topic_name: str) -> None:
    frame = 15 * 1024 * 1024
    fresh_broker.env = {"ICELOG_QUEUED_MAX_REQUEST_BYTES": str(16 * 1024 * 1024)}
    broker = fresh_broker.start()
    pid = _pid(broker)
    rss_before = rss_bytes(pid)
    chunk = struct.pack(">i", frame) + b"\0" * (frame - 1)  # all of a frame but its last byte
    clients = [socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(12)]
    for sock in clients:
        sock.setblocking(False)
    sent = [0] * len(clients)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and min(sent) < len(chunk):
        for index, sock in enumerate(clients):
            if sent[index] < len(chunk):
                with contextlib.suppress(BlockingIOError):  # this client is being held back: fine
                    sent[index] += sock.send(chunk[sent[index]:sent[index] + (1 << 20)])
        time.sleep(0.01)
    time.sleep(1)
    grown = rss_bytes(pid) - rss_before
    assert grown < 80 * 1024 * 1024, f"the broker grew by {grown >> 20} MiB holding partial requests"
    # one larger than the bound is refused by closing
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as big:
        big.sendall(struct.pack(">i", 17 * 1024 * 1024))
        assert _closed_by_broker(big, within_s=5)
    for sock in clients:
        sock.close()
    _producer_round_trips(broker, topic_name)


def test_pipelined_long_polls_are_released_when_the_client_leaves(fresh_broker: BrokerProcess, topic_name: str) -> None:
    """More long polls than a connection reads ahead: the broker stops reading it, but still sees it close."""
    broker = fresh_broker.start()
    create_topic(broker.bootstrap, topic_name)
    pid = _pid(broker)
    fds_before = fd_count(pid)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(_long_poll(topic_name, max_wait_ms=600_000) * 400)
        time.sleep(1)
    assert _eventually(lambda: _close_wait_sockets(broker.port) == 0, 3), "the socket was left in CLOSE_WAIT"
    assert _eventually(lambda: fd_count(pid) <= fds_before + 2, 3), "its descriptor is still held"
    _producer_round_trips(broker, topic_name)


def test_byte_budget_survives_cancelled_waiters() -> None:
    """A reader that leaves while waiting for queued.max.request.bytes neither leaks bytes nor breaks the queue."""
    from icelog.wire.byte_budget import ByteBudget

    async def scenario() -> None:
        budget = ByteBudget(10)
        await budget.acquire(8, object())
        leaving = asyncio.ensure_future(budget.acquire(5, object()))
        waiting = asyncio.ensure_future(budget.acquire(2, object()))
        await asyncio.sleep(0)
        leaving.cancel()  # cancelled while queued, released before it runs its cancellation
        budget.release(8)
        await asyncio.wait_for(waiting, 1)
        assert leaving.cancelled() and budget.used == 2
        granted_then_gone = asyncio.ensure_future(budget.acquire(9, object()))
        await asyncio.sleep(0)
        budget.release(2)  # grants it ...
        granted_then_gone.cancel()  # ... just before it resumes: it gives the bytes back
        await asyncio.sleep(0)
        assert budget.used == 0

    asyncio.run(scenario())


def test_byte_budget_lets_one_partly_read_request_finish() -> None:
    """Requests each holding part of the budget and waiting for more would wait for each other forever: one at a
    time (the oldest started) goes past the bound and finishes; one that has not started waits its turn."""
    from icelog.wire.byte_budget import ByteBudget

    async def scenario() -> None:
        budget = ByteBudget(10)
        first, second, fresh = object(), object(), object()
        await budget.acquire(5, first)
        await budget.acquire(5, second)  # the budget is full of two half-read requests
        unstarted = asyncio.ensure_future(budget.acquire(1, fresh))
        more_second = asyncio.ensure_future(budget.acquire(5, second, started=True))
        more_first = asyncio.ensure_future(budget.acquire(5, first, started=True))
        await asyncio.sleep(0)
        assert more_second.done() and not more_first.done() and not unstarted.done()  # the pass: second only
        assert budget.try_acquire(1, second)  # the pass holder never waits
        budget.read_whole(second)
        await asyncio.sleep(0)
        assert not more_first.done()  # the pass is free, but nobody else may pass the bound while ...
        budget.release(11)  # ... second is handled and gives its bytes back
        await asyncio.wait_for(asyncio.gather(more_first, unstarted), 1)
        assert budget.used == 5 + 5 + 1

    asyncio.run(scenario())
