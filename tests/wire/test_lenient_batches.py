"""What Kafka's broker accepts and repairs, icelog accepts and repairs: a produced v2 batch whose header
max timestamp is not its records' max (an older Go client, Sarama, writes -1 there).

Kafka's LogValidator recomputes every v2 batch's max timestamp from its records and rewrites the CRC; a
consumer that checks CRCs (librdkafka with check.crcs, kafka-python, the Java client) then reads the
batch, and timestamp look-ups find its records. The batches are written byte by byte
(`test_bad_input.raw_batch`: the CRC is right for what is sent), independently of the broker's code.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import crc32c
import pytest
from kafka.codec import gzip_encode, lz4_encode

from tests.support.broker import BrokerProcess
from tests.support.hand_records import record
from tests.wire.test_bad_input import (
    NONE,
    Connection,
    create_topics,
    fetch_partition,
    list_offset,
    produce,
    raw_batch,
    topic,
)

BASE_TS = int(time.time() * 1000) - 60_000  # a minute ago: inside any timestamp bound
DELTAS = [0, 30, 10]  # out of order within the batch: the max is the second record's
VALUES = [b"first", b"second", b"third"]
MAX_TS = BASE_TS + max(DELTAS)

ENCODERS = {0: lambda data: data, 1: gzip_encode, 3: lz4_encode}
# The header max timestamps producers send: Sarama's -1, one below the records' max (the first record's,
# as some clients write), one in the future. Kafka stores the records' max for each.
WRONG_MAX = {"minus-one": -1, "below-the-records": BASE_TS, "above-the-records": MAX_TS + 86_400_000}


def hand_batch(header_max_ts: int, codec: int = 0) -> bytes:
    """Three records with real timestamps in a batch whose header says `header_max_ts`, CRC right."""
    records = b"".join(record(i, value, ts_delta=d) for i, (value, d) in enumerate(zip(VALUES, DELTAS, strict=True)))
    return raw_batch(ENCODERS[codec](records), 3, attributes=codec, base_ts=BASE_TS, max_ts=header_max_ts)


def stored_headers(conn: Connection, name: str) -> list[tuple[int, int, int, bool]]:
    """(base offset, attributes, max timestamp, CRC right) of each stored batch, as a Fetch returns them."""
    data = bytes(fetch_partition(conn, name, 0).records or b"")
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base, length, _, _, crc, attributes = struct.unpack_from(">qiibIh", data, pos)
        (max_ts,) = struct.unpack_from(">q", data, pos + 35)
        out.append((base, attributes, max_ts, crc32c.crc32c(data[pos + 21 : pos + 12 + length]) == crc))
        pos += 12 + length
    return out


def consume_confluent(bootstrap: str, name: str, count: int) -> list[tuple[int, bytes, int, int]]:
    """(offset, value, timestamp type, timestamp) read by librdkafka with CRC checks on."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"lenient-{uuid.uuid4()}", "enable.auto.commit": False,
        "check.crcs": True, "fetch.wait.max.ms": 100,
    })
    out: list[tuple[int, bytes, int, int]] = []
    try:
        consumer.assign([TopicPartition(name, 0, 0)])
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or (msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            assert msg.error() is None, msg.error()  # a CRC mismatch is an error here (_BAD_MSG)
            ts_type, ts = msg.timestamp()
            out.append((msg.offset(), msg.value(), ts_type, ts))
        by_time = [consumer.offsets_for_times([TopicPartition(name, 0, t)], timeout=30)[0].offset
                   for t in (BASE_TS + 5, MAX_TS, MAX_TS + 1)]
    finally:
        consumer.close()
    return out + [(o, b"offsets_for_times", 0, 0) for o in by_time]


def consume_kafka_python(bootstrap: str, name: str, count: int) -> list[tuple[int, bytes, int, int]]:
    """(offset, value, timestamp type, timestamp) read by kafka-python (check_crcs=True, its default)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100,
                             check_crcs=True)
    tp = TopicPartition(name, 0)
    out: list[tuple[int, bytes, int, int]] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=200).values():
                out.extend((m.offset, m.value, m.timestamp_type, m.timestamp) for m in messages)
        found: list[Any] = [consumer.offsets_for_times({tp: t})[tp] for t in (BASE_TS + 5, MAX_TS, MAX_TS + 1)]
    finally:
        consumer.close()
    return out + [(-1 if f is None else f.offset, b"offsets_for_times", 0, 0) for f in found]


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["none", "gzip", "lz4"])
@pytest.mark.parametrize("header", sorted(WRONG_MAX))
def test_a_batch_whose_header_max_timestamp_is_wrong_is_stored_with_its_records_max(
    broker: BrokerProcess, topic_name: str, header: str, codec: int
) -> None:
    with Connection(broker) as conn:
        assert create_topics(conn, [topic(topic_name)])[topic_name].error_code == NONE

        result = produce(conn, topic_name, hand_batch(WRONG_MAX[header], codec))

        assert (result.error_code, result.base_offset) == (NONE, 0), result
        # Stored as Kafka stores it: CreateTime, the records' max timestamp, a CRC that matches.
        assert stored_headers(conn, topic_name) == [(0, codec, MAX_TS, True)]
        # Kafka's ListOffsets by timestamp: the first offset whose record is at least that late.
        assert [list_offset(conn, topic_name, t).offset for t in (BASE_TS + 5, MAX_TS, MAX_TS + 1)] == [1, 1, -1]

    create_time = 0  # kafka-python's timestamp type for CreateTime
    expected = [(i, v, create_time, BASE_TS + d) for i, (v, d) in enumerate(zip(VALUES, DELTAS, strict=True))]
    found = [(1, b"offsets_for_times", 0, 0), (1, b"offsets_for_times", 0, 0), (-1, b"offsets_for_times", 0, 0)]
    assert consume_kafka_python(broker.bootstrap, topic_name, 3) == expected + found
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    librdkafka = [(o, v, TIMESTAMP_CREATE_TIME, ts) for o, v, _, ts in expected]
    assert consume_confluent(broker.bootstrap, topic_name, 3) == librdkafka + found


def test_a_right_header_is_stored_byte_for_byte(broker: BrokerProcess, topic_name: str) -> None:
    """The repair touches only batches that need it: a batch with the right max is stored as sent."""
    sent = hand_batch(MAX_TS)
    with Connection(broker) as conn:
        assert create_topics(conn, [topic(topic_name)])[topic_name].error_code == NONE
        assert produce(conn, topic_name, sent).error_code == NONE
        assert bytes(fetch_partition(conn, topic_name, 0).records) == sent  # base offset 0, as sent


# -- the other rules of Kafka's produce validation that icelog had not followed --------------------------
LOG_APPEND_TIME_MARK = 0x08


def test_a_producers_log_append_time_mark_on_a_create_time_topic_is_cleared(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Kafka stores such a batch as CreateTime: consumers read each record's own timestamp."""
    with Connection(broker) as conn:
        assert create_topics(conn, [topic(topic_name)])[topic_name].error_code == NONE
        records = b"".join(record(i, v, ts_delta=d) for i, (v, d) in enumerate(zip(VALUES, DELTAS, strict=True)))
        sent = raw_batch(records, 3, attributes=LOG_APPEND_TIME_MARK, base_ts=BASE_TS, max_ts=MAX_TS + 5000)

        assert produce(conn, topic_name, sent).error_code == NONE

        assert stored_headers(conn, topic_name) == [(0, 0, MAX_TS, True)]
    expected = [(i, v, 0, BASE_TS + d) for i, (v, d) in enumerate(zip(VALUES, DELTAS, strict=True))]
    assert consume_kafka_python(broker.bootstrap, topic_name, 3)[:3] == expected


@pytest.mark.parametrize(("timestamp_type", "header_max"), [("LogAppendTime", MAX_TS), ("CreateTime", -1)],
                         ids=["log-append-time-topic", "no-timestamp"])
def test_a_producers_log_append_time_mark_is_refused_where_kafka_refuses_it(
    broker: BrokerProcess, topic_name: str, timestamp_type: str, header_max: int
) -> None:
    records = b"".join(record(i, v, ts_delta=-1 - BASE_TS if header_max < 0 else 0) for i, v in enumerate(VALUES))
    with Connection(broker) as conn:
        configs = {"message.timestamp.type": timestamp_type}
        assert create_topics(conn, [topic(topic_name, configs=configs)])[topic_name].error_code == NONE

        result = produce(conn, topic_name, raw_batch(records, 3, attributes=LOG_APPEND_TIME_MARK, base_ts=BASE_TS,
                                                      max_ts=header_max))

        assert result.error_code == 32, result  # INVALID_TIMESTAMP, every record named as Kafka names them
        assert [e.batch_index for e in result.record_errors] == [0, 1, 2]
        assert "LogAppendTime" in result.error_message
        assert list_offset(conn, topic_name, -1).offset == 0  # nothing stored


@pytest.mark.parametrize(("version", "expected"), [(6, 76), (7, NONE)])
def test_zstd_needs_produce_v7(broker: BrokerProcess, topic_name: str, version: int, expected: int) -> None:
    """Kafka's ProduceRequest.validateRecords: UNSUPPORTED_COMPRESSION_TYPE (76) for zstd before v7."""
    from kafka.codec import zstd_encode
    from kafka.protocol.producer import ProduceResponse

    from tests.wire.test_bad_input import produce_request

    records = b"".join(record(i, v) for i, v in enumerate(VALUES))
    with Connection(broker) as conn:
        assert create_topics(conn, [topic(topic_name)])[topic_name].error_code == NONE
        request = produce_request(topic_name, {0: raw_batch(zstd_encode(records), 3, attributes=4)}, version=version)

        result = conn.call(request, ProduceResponse).responses[0].partition_responses[0]

        assert result.error_code == expected, result
        assert list_offset(conn, topic_name, -1).offset == (3 if expected == NONE else 0)
