"""No accepted record stops archiving, whatever its timestamp, key, value or headers, on every write path at once.

Topics whose timestamp bounds are widened to Long.MAX (so the broker accepts what Kafka would) get records with
extreme and boundary timestamps (-1, 0, 1, the last millisecond of year 9999 and one past it, Iceberg's last
microsecond and one past it, Long.MAX), empty and null keys and values, huge headers, each its own batch and each
followed by an ordinary record, through kafka-python over TCP.
One pass of the real Spark archiver writes them on every path: the record layout raw (worker-written files) and
with Avro values, the table layout, a compacted topic's upsert table. Every record the table can hold is a row with
its timestamp; a batch holding a timestamp the table cannot hold is in the dead-letter table, byte for byte, with
its reason; the partition moves on. Timestamps below -1 are refused at produce (INVALID_TIMESTAMP).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kafka_errors

from icelog.archive.archiver import Archiver
from icelog.archive.decode import TABLE_MAX_TIMESTAMP_MS
from tests.support.archive import create_topic, table
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

LONG_MAX = (1 << 63) - 1
WIDE = {"message.timestamp.after.max.ms": str(LONG_MAX), "message.timestamp.before.max.ms": str(LONG_MAX)}
AVRO = {"type": "record", "name": "Tick", "namespace": "ts.avro", "fields": [{"name": "n", "type": "long"}]}
NOW = 1_795_000_000_000
ICEBERG_MAX_MS = LONG_MAX // 1000  # Iceberg's timestamp: microseconds in a long
# (timestamp, key, value, headers): each is its own batch, then an ordinary record
SPECIAL: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
    (-1, None, b"null-key", []),
    (0, b"", b"", []),
    (1, b"null-value", None, []),
    (TABLE_MAX_TIMESTAMP_MS, b"last-ms-of-9999", b"x", []),
    (TABLE_MAX_TIMESTAMP_MS + 1, b"year-10000", b"x", []),
    (ICEBERG_MAX_MS, b"iceberg-last-micro", b"x", []),
    (ICEBERG_MAX_MS + 1, b"past-iceberg", b"x", []),
    (LONG_MAX, b"long-max", b"x", []),
    (NOW, b"huge-headers", b"x", [(f"h{i}", bytes([i % 256]) * 2000) for i in range(200)]
     + [("big", b"\x00" * 300_000)]),
]
UNHOLDABLE = {TABLE_MAX_TIMESTAMP_MS + 1, ICEBERG_MAX_MS, ICEBERG_MAX_MS + 1, LONG_MAX}
PATHS = ("raw", "avro", "table", "upsert")


def topic_of(path: str) -> str:
    return f"ts-every-path-{path}"


def configs_of(path: str) -> dict[str, str]:
    extra = {"raw": {}, "avro": {"icelog.schema.value.on.parse.error": "pass"},
             "table": {"icelog.archive.layout": "table"},
             "upsert": {"icelog.archive.layout": "table", "cleanup.policy": "compact"}}[path]
    return {**WIDE, **extra}


Sent = dict[int, tuple[int, bytes | None, bytes | None]]  # offset → (timestamp, key, value)


def send_all(broker: BrokerProcess, path: str, round_: int) -> tuple[Sent, set[int]]:
    """Produce the special records (round 0) and ordinary ones; (what was stored, offsets of unholdable ones)."""
    topic = topic_of(path)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0, max_request_size=2_000_000,
                             compression_type="lz4")
    serialize = None
    if path == "avro":
        serialize = AvroSerializer(SchemaRegistryClient({"url": broker.registry_url}), json.dumps(AVRO))
    ctx = SerializationContext(topic, MessageField.VALUE)
    sent: Sent = {}
    unholdable: set[int] = set()

    def one(timestamp: int, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
        if path == "upsert" and key is None:
            key = b"null-key"  # a compacted topic refuses keyless records (INVALID_RECORD)
        offset = producer.send(topic, key=key, value=value, headers=headers, partition=0,
                               timestamp_ms=timestamp).get(60).offset
        sent[offset] = (timestamp, key, value)
        return offset

    try:
        specials = SPECIAL if round_ == 0 else []
        for i, (timestamp, key, value, headers) in enumerate(specials):
            offset = one(timestamp, key, value, headers)
            if timestamp in UNHOLDABLE:
                unholdable.add(offset)
            ordinary = serialize({"n": i}, ctx) if serialize else b"ordinary-%d" % i
            one(NOW + i, b"o%d-%d" % (round_, i), ordinary, [("i", b"%d" % i)])
        for i in range(5):
            ordinary = serialize({"n": 100 + i}, ctx) if serialize else b"later-%d" % i
            one(NOW + 100 + i, b"l%d-%d" % (round_, i), ordinary, [])
        for refused in (-2, -(1 << 63)):  # below -1: refused whatever the bounds, nothing stored
            with pytest.raises(kafka_errors.InvalidTimestampError):
                producer.send(topic, key=b"refused", value=b"x", partition=0, timestamp_ms=refused).get(60)
    finally:
        producer.close()
    return sent, unholdable


def consumed_timestamps(broker: BrokerProcess, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=10_000, max_partition_fetch_bytes=4_000_000)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    try:
        return {msg.offset: msg.timestamp for msg in consumer}
    finally:
        consumer.close()


def table_rows(spark: Any, path: str) -> dict[int, int]:
    """offset → event timestamp (µs) of every row."""
    name = table(topic_of(path))
    if path in ("raw", "avro"):
        query = f"SELECT kafka.offset AS o, unix_micros(kafka.event_timestamp) AS t FROM {name}"
    else:
        query = f"SELECT __offset AS o, unix_micros(__timestamp) AS t FROM {name}"
    return {row.o: row.t for row in spark.sql(query).collect()}


@pytest.fixture(scope="module")
def every_path(lake_broker: BrokerProcess) -> Iterator[dict[str, tuple[Sent, set[int]]]]:
    for path in PATHS:
        create_topic(lake_broker, topic_of(path), 1, configs_of(path))
    yield {path: send_all(lake_broker, path, 0) for path in PATHS}


def test_no_accepted_record_stops_archiving_on_any_path(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any,
    every_path: dict[str, tuple[Sent, set[int]]],
) -> None:
    for path, (sent, _unholdable) in every_path.items():  # the broker serves each as produced
        assert consumed_timestamps(lake_broker, topic_of(path)) == {o: t for o, (t, _k, _v) in sent.items()}, path

    results = lake_archiver.run_pass(force=True, topics={topic_of(p) for p in PATHS})
    assert [r.error for r in results] == [""] * len(PATHS), results

    for path, (sent, unholdable) in every_path.items():
        assert len(unholdable) == len(UNHOLDABLE)
        expected = {o: t * 1000 for o, (t, key, value) in sent.items() if o not in unholdable
                    and not (path == "upsert" and value is None)}  # a compacted topic's null value is a tombstone
        assert table_rows(lake_spark, path) == expected, path
        dlq = table(topic_of(path) + "__dlq")
        letters = lake_spark.sql(f"SELECT base_offset, last_offset, error FROM {dlq}").collect()
        assert sorted((r.base_offset, r.last_offset) for r in letters) == [(o, o) for o in sorted(unholdable)], path
        assert all("outside the years 1 to 9999" in r.error for r in letters), letters

    # The partitions moved on: later records archive, nothing is dead-lettered twice.
    later = {path: send_all(lake_broker, path, 1)[0] for path in PATHS}
    results = lake_archiver.run_pass(force=True, topics={topic_of(p) for p in PATHS})
    assert [(r.error, r.dead_letters) for r in results] == [("", 0)] * len(PATHS), results
    for path in PATHS:
        rows = table_rows(lake_spark, path)
        assert all(rows[o] == t * 1000 for o, (t, _k, _v) in later[path].items()), path
        dlq = table(topic_of(path) + "__dlq")
        assert len(lake_spark.sql(f"SELECT * FROM {dlq}").collect()) == len(UNHOLDABLE)


def pyiceberg_rows(table: Any) -> dict[int, int]:
    """offset → event timestamp (µs) of every row of a record-layout table, read with pyiceberg (no datetimes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kafka = table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").combine_chunks()
    offsets = pc.struct_field(kafka, "offset").to_pylist()
    micros = pc.struct_field(kafka, "event_timestamp").cast(pa.int64()).to_pylist()
    return dict(zip(offsets, micros, strict=True))


def expected_rows(sent: Sent, unholdable: set[int]) -> dict[int, int]:
    """What a record-layout table holds of `sent`: every record but the unholdable ones, its timestamp in µs."""
    return {o: t * 1000 for o, (t, _k, _v) in sent.items() if o not in unholdable}


def dead_letter_spans(table: Any) -> list[tuple[int, int]]:
    """(base offset, last offset) of a dead-letter table's rows, read with pyiceberg, after checking their reason."""
    rows = table.scan().to_arrow().to_pylist()
    assert all("outside the years 1 to 9999" in r["error"] for r in rows), rows
    return sorted((r["base_offset"], r["last_offset"]) for r in rows)
