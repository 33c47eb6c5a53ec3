"""Real Kafka clients against a real broker over TCP: librdkafka (confluent-kafka), kafka-python 3,
aiokafka and kcat. Records must come back byte for byte: key, value, headers, partition, offset, timestamp.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients_util import (
    ACKS,
    CLIENTS,
    CODECS,
    ConfluentClient,
    KcatClient,
    Rec,
    assert_codec_used,
    comparable,
    create_topic,
    expected_records,
    kcat,
    now_ms,
    sample_records,
    stored_batches,
)

CLIENT_NAMES = list(CLIENTS)


def produce_order_offsets(records: Sequence[Rec]) -> list[int]:
    """The offset each record gets, in the order they were produced (offsets count up per partition)."""
    counters: dict[int, int] = {}
    out = []
    for rec in records:
        out.append(counters.get(rec.partition, 0))
        counters[rec.partition] = out[-1] + 1
    return out


@pytest.mark.parametrize("acks", ACKS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_round_trip_every_codec_and_acks(
    broker: BrokerProcess, topic_name: str, client_name: str, codec: str, acks: str
) -> None:
    """Each client produces with each codec and acks level, then reads everything back from earliest."""
    client = CLIENTS[client_name]
    create_topic(broker.bootstrap, topic_name, partitions=2)
    records = sample_records(24, 2, kcat_producer=client_name == "kcat", seed=len(codec) + len(acks))
    before = now_ms()
    offsets = client.produce(broker.bootstrap, topic_name, records, codec=codec, acks=acks)
    after = now_ms()
    if acks != "0" and client_name != "kcat":  # acks=0 gets no response; kcat prints no offsets
        assert offsets == produce_order_offsets(records)

    got = client.consume(broker.bootstrap, topic_name, [0, 1], "earliest", len(records))

    expected = expected_records(records)
    assert comparable(got, timestamps=client.sets_timestamps) == comparable(
        expected, timestamps=client.sets_timestamps
    )
    if not client.sets_timestamps:  # the producer stamped its own clock (CreateTime)
        assert all(before <= r.timestamp <= after for r in got)
    assert not any(r.log_append_time for r in got)
    # Proves the codec was really used: librdkafka silently sends batches uncompressed when it thinks the
    # broker lacks support (e.g. lz4 needs FindCoordinator among the advertised APIs).
    assert_codec_used(broker.bootstrap, topic_name, [0, 1], codec)


# A different codec per producer, so the pairs also cross decompression implementations.
CROSS_CODEC = {"confluent": "zstd", "kafka-python": "lz4", "aiokafka": "snappy", "kcat": "gzip"}


@pytest.mark.parametrize(
    ("producer_name", "consumer_name"),
    [(p, c) for p in CLIENT_NAMES for c in CLIENT_NAMES if p != c],
)
def test_cross_client(broker: BrokerProcess, topic_name: str, producer_name: str, consumer_name: str) -> None:
    """What one client produced, every other client reads back identically."""
    producer, consumer = CLIENTS[producer_name], CLIENTS[consumer_name]
    create_topic(broker.bootstrap, topic_name, partitions=2)
    records = sample_records(20, 2, kcat_producer=producer_name == "kcat", seed=3)
    producer.produce(broker.bootstrap, topic_name, records, codec=CROSS_CODEC[producer_name], acks="all")

    got = consumer.consume(broker.bootstrap, topic_name, [0, 1], "earliest", len(records))

    timestamps = producer.sets_timestamps
    assert comparable(got, timestamps=timestamps) == comparable(
        expected_records(records), timestamps=timestamps
    )


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_consume_from_offset_earliest_and_latest(
    broker: BrokerProcess, topic_name: str, client_name: str
) -> None:
    """Assignment at a given offset (inside a compressed batch), at earliest and at latest."""
    client = CLIENTS[client_name]
    confluent = ConfluentClient()
    create_topic(broker.bootstrap, topic_name)
    first = sample_records(20, seed=5)
    confluent.produce(broker.bootstrap, topic_name, first, codec="zstd")  # one batch: offset 13 is inside it
    expected = expected_records(first)

    from_13 = client.consume(broker.bootstrap, topic_name, [0], 13, 7)
    assert comparable(from_13) == comparable(expected[13:])

    from_earliest = client.consume(broker.bootstrap, topic_name, [0], "earliest", 20)
    assert comparable(from_earliest) == comparable(expected)

    more = sample_records(5, seed=6)
    if isinstance(client, KcatClient):
        # kcat cannot tell when it has resolved "end", so check "end" yields nothing and -N counts from it.
        assert client._read(broker.bootstrap, topic_name, 0, "end", exit_at_end=True) == []
        confluent.produce(broker.bootstrap, topic_name, more)
        latest = client.tail(broker.bootstrap, topic_name, 0, 5)
    else:
        latest = client.consume(
            broker.bootstrap,
            topic_name,
            [0],
            "latest",
            5,
            then=lambda: confluent.produce(broker.bootstrap, topic_name, more),
        )
    assert comparable(latest) == comparable(expected_records(more, {0: 20}))


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_list_offsets_by_timestamp(broker: BrokerProcess, topic_name: str, client_name: str) -> None:
    """offsets_for_times answers the first offset whose timestamp >= target, even when timestamps go back."""
    client = CLIENTS[client_name]
    create_topic(broker.bootstrap, topic_name, partitions=2)  # partition 1 stays empty
    base = now_ms() - 30_000
    deltas = [0, 10, 20, 20, 15, 40, 50, 45, 60, 70]
    records = [Rec(0, b"k%d" % i, b"v%d" % i + b"x" * 300, (), base + d) for i, d in enumerate(deltas)]
    producer = ConfluentClient()
    # Three batches, so the search crosses batches; compressed, so the broker must decompress to look inside.
    for chunk, codec in ((records[:4], "gzip"), (records[4:7], "lz4"), (records[7:], "zstd")):
        producer.produce(broker.bootstrap, topic_name, chunk, codec=codec)
    assert {attrs & 0x07 for _, attrs in stored_batches(broker.bootstrap, topic_name, 0)} == {1, 3, 4}

    targets = [
        base - 1000,
        base,
        base + 1,
        base + 10,
        base + 12,
        base + 16,
        base + 20,
        base + 41,
        base + 46,
        base + 51,
        base + 70,
        base + 71,
    ]
    got = client.offsets_for_times(broker.bootstrap, topic_name, 0, targets)

    assert got == [0, 0, 1, 1, 2, 2, 2, 6, 6, 8, 9, None]
    assert client.watermarks(broker.bootstrap, topic_name, 0) == (0, 10)
    assert client.watermarks(broker.bootstrap, topic_name, 1) == (0, 0)
    assert client.offsets_for_times(broker.bootstrap, topic_name, 1, [0, base]) == [None, None]


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_log_append_time_topic(broker: BrokerProcess, topic_name: str, client_name: str) -> None:
    """On a LogAppendTime topic consumers see the broker's timestamp, not the producer's."""
    client = CLIENTS[client_name]
    create_topic(broker.bootstrap, topic_name, configs={"message.timestamp.type": "LogAppendTime"})
    producer_ts = 1_000_000_000_000  # 2001: obviously not the broker's clock
    records = sample_records(12, seed=7, base_ts=producer_ts)
    before = now_ms()
    ConfluentClient().produce(broker.bootstrap, topic_name, records, codec="lz4")
    after = now_ms()

    got = client.consume(broker.bootstrap, topic_name, [0], "earliest", len(records))

    assert comparable(got, timestamps=False) == comparable(expected_records(records), timestamps=False)
    assert all(before <= r.timestamp <= after for r in got), [r.timestamp for r in got]
    if isinstance(client, KcatClient):  # kcat's -f output has no timestamp type, its JSON output does
        lines = kcat(
            "-C", "-b", broker.bootstrap, "-t", topic_name, "-p", "0", "-e", "-q", "-J"
        ).stdout.splitlines()
        # Keys and values are binary, which kcat's JSON does not escape: pick the field out of the bytes.
        types = [m[1] if (m := re.search(rb'"tstype":"(\w+)"', line)) else None for line in lines]
        assert types == [b"logappend"] * len(records)
    else:
        assert all(r.log_append_time for r in got)
    # Timestamp look-ups use the broker's timestamps too.
    assert client.offsets_for_times(broker.bootstrap, topic_name, 0, [producer_ts, before, after + 1]) == [
        0,
        0,
        None,
    ]


def test_log_append_time_in_produce_response(broker: BrokerProcess, topic_name: str) -> None:
    """librdkafka's delivery report carries the broker's append time from the Produce response."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Producer

    create_topic(broker.bootstrap, topic_name, configs={"message.timestamp.type": "LogAppendTime"})
    reports: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    before = now_ms()
    producer.produce(
        topic_name,
        b"v",
        timestamp=1_000_000_000_000,
        on_delivery=lambda err, msg: reports.append(msg.timestamp()) if err is None else None,
    )
    assert producer.flush(30) == 0
    after = now_ms()
    assert len(reports) == 1
    ts_type, ts = reports[0]
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME
    assert before <= ts <= after


@pytest.mark.parametrize("consumer_name", ["confluent", "kafka-python", "aiokafka"])
def test_null_header_value(broker: BrokerProcess, topic_name: str, consumer_name: str) -> None:
    """A header whose value is null (not empty) survives the trip (kcat cannot express it)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    producer.produce(topic_name, b"v", key=b"k", partition=0, headers=[("null", None), ("empty", b"")])
    assert producer.flush(30) == 0  # the topic is auto-created by the Metadata request

    (got,) = CLIENTS[consumer_name].consume(broker.bootstrap, topic_name, [0], "earliest", 1)

    assert (got.offset, got.key, got.value, list(got.headers)) == (
        0,
        b"k",
        b"v",
        [("null", None), ("empty", b"")],
    )


@pytest.mark.parametrize("consumer_name", CLIENT_NAMES)
def test_record_larger_than_fetch_sizes(broker: BrokerProcess, topic_name: str, consumer_name: str) -> None:
    """A 2 MB record (over the clients' 1 MB per-partition fetch size) is still served whole (KIP-74)."""
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name, configs={"max.message.bytes": "3000000"})
    big = random.Random(11).randbytes(2_000_000)  # incompressible
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "message.max.bytes": 3_000_000, "enable.idempotence": False}
    )
    errors: list[object] = []
    for key, value in ((b"big", big), (b"small", b"after")):
        producer.produce(
            topic_name, value, key=key, partition=0, on_delivery=lambda err, msg: errors.append(err)
        )
    assert producer.flush(30) == 0 and errors == [None, None]

    got = CLIENTS[consumer_name].consume(broker.bootstrap, topic_name, [0], "earliest", 2)

    assert [(r.offset, r.key, r.value) for r in got] == [(0, b"big", big), (1, b"small", b"after")]
