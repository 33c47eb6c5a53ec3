"""A consumer-group member run as a child process by tests/coordinator/test_groups.py (so a test can SIGKILL it).

usage: python group_member.py KIND BOOTSTRAP TOPIC GROUP OUTFILE [INSTANCE_ID]
KIND is confluent, confluent-848 (librdkafka with group.protocol=consumer, KIP-848), kafka-python or aiokafka.
Every processed record is appended to OUTFILE as
"partition offset value" *before* its offset is committed (commit after processing). SIGTERM closes
the consumer cleanly (a clean LeaveGroup).
"""

from __future__ import annotations

import asyncio
import signal
import sys

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


def main() -> None:
    kind, bootstrap, topic, group, outfile = sys.argv[1:6]
    instance_id = sys.argv[6] if len(sys.argv) > 6 else None
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    out = open(outfile, "a", buffering=1)  # noqa: SIM115 (outlives this function: the child process writes to it)
    if kind in ("confluent", "confluent-848"):
        run_confluent(bootstrap, topic, group, instance_id, out, stop, kip848=kind == "confluent-848")
    elif kind == "kafka-python":
        run_kafka_python(bootstrap, topic, group, instance_id, out, stop)
    elif kind == "aiokafka":
        asyncio.run(run_aiokafka(bootstrap, topic, group, instance_id, out, stop))
    else:
        raise SystemExit(f"unknown client kind {kind}")
    out.write("# closed\n")


def run_confluent(bootstrap: str, topic: str, group: str, instance_id: str | None, out, stop,
                  kip848: bool = False) -> None:
    from confluent_kafka import Consumer, KafkaException

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "max.poll.interval.ms": 20000,
    }
    if kip848:  # the broker sets the session timeout and heartbeat interval (librdkafka refuses them here)
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS})
    if instance_id:
        conf["group.instance.id"] = instance_id
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    while not stop["now"]:
        messages = consumer.consume(num_messages=50, timeout=0.3)
        records = [m for m in messages if m.error() is None]
        for m in records:
            out.write(f"{m.partition()} {m.offset()} {m.value().decode()}\n")
        if records:
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                out.write(f"# commit failed: {exc}\n")
    consumer.close()


def run_kafka_python(bootstrap: str, topic: str, group: str, instance_id: str | None, out, stop) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=20000,
        group_instance_id=instance_id,
    )
    while not stop["now"]:
        batches = consumer.poll(300)
        count = 0
        for records in batches.values():
            for r in records:
                out.write(f"{r.partition} {r.offset} {r.value.decode()}\n")
                count += 1
        if count:
            try:
                consumer.commit()
            except KafkaError as exc:
                out.write(f"# commit failed: {exc}\n")
    consumer.close()


async def run_aiokafka(bootstrap: str, topic: str, group: str, instance_id: str | None, out, stop) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=20000,
        group_instance_id=instance_id,
    )
    await consumer.start()
    try:
        while not stop["now"]:
            batches = await consumer.getmany(timeout_ms=300)
            count = 0
            for records in batches.values():
                for r in records:
                    out.write(f"{r.partition} {r.offset} {r.value.decode()}\n")
                    count += 1
            if count:
                try:
                    await consumer.commit()
                except KafkaError as exc:
                    out.write(f"# commit failed: {exc}\n")
    finally:
        await consumer.stop()


if __name__ == "__main__":
    main()
