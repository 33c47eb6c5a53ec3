"""Reading a partition back as an application checking a log would: every record from an offset to the high
watermark, offsets contiguous, and the watermarks retried while a partition's leadership moves (a cluster)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition


def watermarks(consumer: Consumer, topic: str, partition: int, timeout_s: float = 30) -> tuple[int, int]:
    """The partition's low and high watermarks, retried on retriable errors (NOT_LEADER_OR_FOLLOWER while its
    leadership moves)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            return int(low), int(high)
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_partition(bootstrap: str, topic: str, partition: int, start: int = 0) -> tuple[list[bytes], int]:
    """Every record from `start` to the high watermark, checking offsets are contiguous and that nothing was
    deleted (the log starts at offset 0).

    Returns the values (index i is offset start + i) and the high watermark read at the beginning.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"{topic}-check", "enable.auto.commit": False,
        "enable.partition.eof": True, "fetch.wait.max.ms": 50,
    })
    try:
        low, high = watermarks(consumer, topic, partition)
        assert low == 0, "nothing was deleted, so the log starts at offset 0"
        values: list[bytes] = []
        if high <= start:
            return values, high
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + 60
        while start + len(values) < high:
            position = start + len(values)
            assert time.monotonic() < deadline, f"{topic}-{partition}: stuck at {position} < {high}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(message.error())
            assert message.offset() == position, (
                f"{topic}-{partition}: offset {message.offset()} after {position - 1} (a gap or a repeat)"
            )
            value = message.value()
            assert value is not None
            values.append(value)
        return values, high
    finally:
        consumer.close()


def read_committed(bootstrap: str, topic: str, partitions: int, expected: int, settle_s: float = 3.0,
                   timeout: float = 60.0) -> list[bytes]:
    """Every record of the topic a read_committed consumer gets: read until `expected` came and nothing more for
    `settle_s` (so that a record too many shows), or until `timeout`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline, last_new = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
                last_new = time.monotonic()
            elif len(values) >= expected and time.monotonic() - last_new > settle_s:
                break
    finally:
        consumer.close()
    return values
