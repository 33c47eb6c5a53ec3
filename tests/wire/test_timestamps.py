"""Kafka 4's timestamp rules at produce, through real clients (librdkafka and kafka-python).

A CreateTime record more than `message.timestamp.after.max.ms` (default one hour) after the broker's clock, or more
than `message.timestamp.before.max.ms` (default: no bound) before it, fails its batch with INVALID_TIMESTAMP and
nothing of the batch is stored; both are topic configs and broker defaults (`topic_defaults`); a LogAppendTime
topic takes any timestamp and stamps the broker's clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from tests.support.broker import BrokerProcess

HOUR_MS = 3_600_000
LONG_MAX = (1 << 63) - 1


def now_ms() -> int:
    return int(time.time() * 1000)


def create(broker: BrokerProcess, topic: str, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config=configs or {})])[topic].result(30)


def produce_each(broker: BrokerProcess, topic: str, timestamps: list[int]) -> list[int | None]:
    """Each record its own batch (a flush after each) with librdkafka; the error code of each (None: stored)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.send.max.retries": 0, "linger.ms": 0})
    codes: list[int | None] = []
    for i, timestamp in enumerate(timestamps):
        got: list[Any] = []
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp=timestamp,
                         on_delivery=lambda err, _msg, got=got: got.append(err))
        assert producer.flush(30) == 0
        [err] = got
        codes.append(None if err is None else err.code())
    return codes


def consume(broker: BrokerProcess, topic: str) -> list[tuple[int, bytes, int, int]]:
    """(offset, value, timestamp type, timestamp) of every record a consumer reads from partition 0."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"ts-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    try:
        while True:
            msg = consumer.poll(30)
            assert msg is not None, "consumer timed out"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return out
            kind, timestamp = msg.timestamp()
            out.append((msg.offset(), msg.value(), kind, timestamp))
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def ts_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose default before-bound is one day (a broker default, `topic_defaults`)."""
    env = {"ICELOG_TOPIC_DEFAULTS": json.dumps({"message.timestamp.before.max.ms": str(24 * HOUR_MS)})}
    proc = BrokerProcess(tmp_path_factory.mktemp("ts") / "data", env=env).start()
    yield proc
    proc.stop()


def test_a_record_past_the_after_bound_fails_its_batch_and_nothing_of_it_is_stored(
    ts_broker: BrokerProcess, topic_name: str
) -> None:
    create(ts_broker, topic_name)
    now = now_ms()
    timestamps = [now, now + 2 * HOUR_MS, now + 30 * 60_000, now + (1 << 62), now - 2 * 24 * HOUR_MS,
                  now - HOUR_MS, now + 1]
    codes = produce_each(ts_broker, topic_name, timestamps)
    invalid = KafkaError.INVALID_TIMESTAMP
    assert codes == [None, invalid, None, invalid, invalid, None, None]
    read = consume(ts_broker, topic_name)
    assert [(offset, value, timestamp) for offset, value, _kind, timestamp in read] == [
        (0, b"v0", timestamps[0]), (1, b"v2", timestamps[2]), (2, b"v5", timestamps[5]), (3, b"v6", timestamps[6]),
    ]


def test_kafka_python_gets_invalid_timestamp(ts_broker: BrokerProcess, topic_name: str) -> None:
    create(ts_broker, topic_name)
    producer = KafkaProducer(bootstrap_servers=ts_broker.bootstrap, retries=0)
    try:
        future = producer.send(topic_name, b"future", timestamp_ms=now_ms() + 2 * HOUR_MS)
        with pytest.raises(kafka_errors.InvalidTimestampError):
            future.get(30)
        assert producer.send(topic_name, b"fine", timestamp_ms=now_ms()).get(30).offset == 0
    finally:
        producer.close()


def test_topic_configs_widen_and_narrow_the_bounds(ts_broker: BrokerProcess, topic_name: str) -> None:
    """Long.MAX bounds take any timestamp a record can carry; a topic's own bounds override the broker's; the
    configs are described with Kafka 4's defaults and refused when negative."""
    wide, narrow = f"{topic_name}-wide", f"{topic_name}-narrow"
    create(ts_broker, wide, {"message.timestamp.after.max.ms": str(LONG_MAX),
                             "message.timestamp.before.max.ms": str(LONG_MAX)})
    create(ts_broker, narrow, {"message.timestamp.after.max.ms": "60000"})
    now = now_ms()
    far = [now + (1 << 62), LONG_MAX, 1, now - 400 * 24 * HOUR_MS]  # (librdkafka reads 0 as "now")
    assert produce_each(ts_broker, wide, far) == [None] * 4
    assert [timestamp for _o, _v, _k, timestamp in consume(ts_broker, wide)] == far
    invalid = KafkaError.INVALID_TIMESTAMP
    assert produce_each(ts_broker, narrow, [now + 5 * 60_000, now, now - 2 * 24 * HOUR_MS]) == [invalid, None, invalid]

    admin = AdminClient({"bootstrap.servers": ts_broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, narrow)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["message.timestamp.after.max.ms"].value == "60000"
    assert configs["message.timestamp.before.max.ms"].value == str(24 * HOUR_MS)  # the broker's default
    plain = ConfigResource(ResourceType.TOPIC, wide)
    assert admin.describe_configs([plain])[plain].result(30)["message.timestamp.type"].value == "CreateTime"

    bad = ConfigResource(ResourceType.TOPIC, narrow, incremental_configs=[
        ConfigEntry("message.timestamp.after.max.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as refused:
        admin.incremental_alter_configs([bad])[bad].result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_a_log_append_time_topic_takes_any_timestamp_and_stamps_the_broker_clock(
    ts_broker: BrokerProcess, topic_name: str
) -> None:
    create(ts_broker, topic_name, {"message.timestamp.type": "LogAppendTime"})
    before = now_ms()
    assert produce_each(ts_broker, topic_name, [before + (1 << 62), before - 3 * 24 * HOUR_MS]) == [None, None]
    after = now_ms()
    read = consume(ts_broker, topic_name)
    assert len(read) == 2
    for _offset, _value, kind, timestamp in read:
        assert kind == 2  # TIMESTAMP_LOG_APPEND_TIME
        assert before - 1000 <= timestamp <= after + 1000


def test_kafka_4_defaults_without_broker_defaults(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    """On a broker without `topic_defaults`: one hour ahead at most, any age."""
    fresh_broker.start()
    create(fresh_broker, "defaults")
    now = now_ms()
    invalid = KafkaError.INVALID_TIMESTAMP
    assert produce_each(fresh_broker, "defaults", [now + 2 * HOUR_MS, now - 10 * 365 * 24 * HOUR_MS, 1]) == [
        invalid, None, None]
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, "defaults")
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["message.timestamp.after.max.ms"].value == str(HOUR_MS)
    assert configs["message.timestamp.before.max.ms"].value == str(LONG_MAX)
