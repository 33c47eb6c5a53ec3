"""Hostile (or buggy) requests that decode but are not what Kafka's schema allows: each gets Kafka's answer (here a
closed connection, as Kafka's own parser refuses them), the broker keeps serving other clients, and its log gets at
most one bounded line for it: no traceback, no quote of the client's input (issue 29, cases 4 and 5).

Requests are built with kafka-python's protocol classes, whose encoder writes a -1 length for an array given as
None whatever the schema says, and sent on raw sockets.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.consumer import JoinGroupRequest, OffsetCommitRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from tests.support.broker import BrokerProcess

LOG_BYTES_PER_BAD_REQUEST = 2_000  # one warning line with at most ~200 quoted characters


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker of this module's own, so its log holds only what these requests caused."""
    proc = BrokerProcess(tmp_path_factory.mktemp("hostile") / "data").start()
    yield proc
    proc.stop()


def log_size(broker: BrokerProcess) -> int:
    return Path(broker.log_path).stat().st_size


def framed(request: Any) -> bytes:
    request.with_header(correlation_id=7, client_id="hostile-test")
    return bytes(request.encode(header=True, framed=True))


def metadata_v0_with_null_topics() -> bytes:
    """kafka-python turns topics=None into [] for v0, where the array is not nullable: patch the count to -1."""
    frame = framed(MetadataRequest[0](topics=[]))
    assert frame.endswith(struct.pack(">i", 0))
    return frame[:-4] + struct.pack(">i", -1)


def send_and_expect_close(broker: BrokerProcess, frame: bytes) -> None:
    """Send one request; the broker must close the connection without answering it."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=15) as sock:
        sock.sendall(frame)
        received = b""
        try:
            while chunk := sock.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
    assert received == b"", f"expected the broker to close the connection, got {len(received)} bytes"


def assert_produce_round_trips(broker: BrokerProcess, topic: str) -> None:
    """A fresh confluent-kafka producer gets a record acknowledged."""
    from confluent_kafka import Producer

    reports: list[Any] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 15_000})
    producer.produce(topic, b"still-alive", on_delivery=lambda err, msg: reports.append((err, msg)))
    producer.flush(20)
    assert len(reports) == 1 and reports[0][0] is None, reports


def assert_log_clean(broker: BrokerProcess, before: int) -> None:
    grown = log_size(broker) - before
    assert grown < LOG_BYTES_PER_BAD_REQUEST, f"log grew by {grown} bytes for one bad request"
    tail = Path(broker.log_path).read_bytes()[before:].decode(errors="replace")
    assert "Traceback" not in tail, tail
    assert " ERROR " not in tail and "ERROR:" not in tail, tail


Topic = CreateTopicsRequest.CreatableTopic
CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
ProduceTopic = ProduceRequest.TopicProduceData

# A -1 length where Kafka's schema has a non-nullable array, at the top level and inside an item.
NULL_ARRAYS: dict[str, Callable[[], bytes]] = {
    "CreateTopics.topics": lambda: framed(CreateTopicsRequest[5](topics=None, timeout_ms=1000, validate_only=False)),
    "CreateTopics.topics[].configs": lambda: framed(CreateTopicsRequest[5](
        topics=[Topic(name="hostile-configs", num_partitions=1, replication_factor=1, assignments=[], configs=None)],
        timeout_ms=1000, validate_only=False)),
    "DeleteTopics.topic_names": lambda: framed(DeleteTopicsRequest[3](topic_names=None, timeout_ms=1000)),
    "OffsetCommit.topics": lambda: framed(OffsetCommitRequest[8](
        group_id="hostile-group", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=None)),
    "OffsetCommit.topics[].partitions": lambda: framed(OffsetCommitRequest[8](
        group_id="hostile-group", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=[CommitTopic(name="hostile-topic", partitions=None)])),
    "JoinGroup.protocols": lambda: framed(JoinGroupRequest[6](
        group_id="hostile-group", session_timeout_ms=10_000, rebalance_timeout_ms=10_000, member_id="",
        group_instance_id=None, protocol_type="consumer", protocols=None)),
    "Metadata.topics-v0": metadata_v0_with_null_topics,
    "Produce.topic_data": lambda: framed(ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=1000, topic_data=None)),
    "Produce.topic_data[].partition_data": lambda: framed(ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[ProduceTopic(name="hostile-topic",
                                                                                   partition_data=None)])),
}


@pytest.mark.parametrize("case", sorted(NULL_ARRAYS))
def test_null_non_nullable_array_closes_quietly(hostile_broker: BrokerProcess, topic_name: str, case: str) -> None:
    before = log_size(hostile_broker)
    send_and_expect_close(hostile_broker, NULL_ARRAYS[case]())
    assert_produce_round_trips(hostile_broker, topic_name)
    assert_log_clean(hostile_broker, before)
    log_tail = Path(hostile_broker.log_path).read_bytes()[before:].decode(errors="replace")
    assert "is null, which Kafka's schema does not allow" in log_tail


def test_nullable_arrays_are_still_accepted(hostile_broker: BrokerProcess) -> None:
    """Metadata v1+ topics=None means "all topics" and is answered, not refused."""
    request = MetadataRequest[1](topics=None)
    request.with_header(correlation_id=3, client_id="hostile-test")
    with socket.create_connection(("127.0.0.1", hostile_broker.port), timeout=15) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        assert size > 0


def test_megabyte_of_invalid_utf8_in_a_topic_name_logs_one_bounded_line(
    hostile_broker: BrokerProcess, topic_name: str
) -> None:
    """Case 5: a 1 MB Metadata request whose topic name is 0xff bytes wrote 4 MB of log."""
    size = 1 << 20
    request = MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name="X" * size)],
                                 allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    request.with_header(correlation_id=5, client_id="hostile-test")
    frame = bytes(request.encode(header=True, framed=True)).replace(b"X" * size, b"\xff" * size)
    before = log_size(hostile_broker)
    with socket.create_connection(("127.0.0.1", hostile_broker.port), timeout=15) as sock:
        sock.sendall(frame)
        assert sock.recv(1 << 16) == b"", "expected the broker to close the connection"
    assert_produce_round_trips(hostile_broker, topic_name)
    assert log_size(hostile_broker) - before < 10_000
    assert_log_clean(hostile_broker, before)


def test_null_string_closes_with_one_bounded_line(hostile_broker: BrokerProcess, topic_name: str) -> None:
    """A null (-1) config name in CreateTopics, where Kafka's schema has a non-nullable string (a handler could
    not take it): the connection closes and the log gets one warning line, not a traceback."""
    config = Topic.CreatableTopicConfig(name=None, value="1")
    request = CreateTopicsRequest[5](
        topics=[Topic(name="hostile-null-config", num_partitions=1, replication_factor=1, assignments=[],
                      configs=[config])],
        timeout_ms=1000, validate_only=False)
    before = log_size(hostile_broker)
    send_and_expect_close(hostile_broker, framed(request))
    assert_produce_round_trips(hostile_broker, topic_name)
    assert_log_clean(hostile_broker, before)
    assert "topics[].configs[].name is null" in Path(hostile_broker.log_path).read_bytes()[before:].decode()
