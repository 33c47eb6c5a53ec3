"""A member of a consumer group run as a child process by tests/cluster/test_cluster_groups.py, so that a client
crash (librdkafka aborting on an answer it did not expect) fails the test with the child's stderr and exit signal
instead of killing the pytest worker.

usage: python failover_consumer.py BOOTSTRAP TOPIC GROUP PROTOCOL  (PROTOCOL: classic or consumer, i.e. KIP-848)

It processes a batch, then commits the batch's offsets synchronously, and writes each event to stdout as one JSON
line, stamped with time.monotonic() (CLOCK_MONOTONIC, comparable between the processes of one machine):
  {"at": t, "processed": [[partition, offset], ...]}
  {"at": t, "committed": [[partition, next offset], ...]}  (what the coordinator acknowledged)
  {"at": t, "failed_commit": "why"}
When its stdin closes it closes the consumer (a clean leave) and writes {"at": t, "closed": true} last.
Extra librdkafka settings may come as JSON in the environment variable FAILOVER_CONSUMER_CONFIG (`debug`, say).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


def emit(**event: Any) -> None:
    print(json.dumps({"at": time.monotonic(), **event}), flush=True)


def main() -> None:
    bootstrap, topic, group, protocol = sys.argv[1:5]
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 2000,
    }
    if protocol == "classic":
        config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    else:
        config["group.protocol"] = "consumer"
    config.update(json.loads(os.environ.get("FAILOVER_CONSUMER_CONFIG", "{}")))
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    consumer = Consumer(config)
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            batch = [m for m in consumer.consume(200, timeout=0.5) if m.error() is None]
            if not batch:
                continue
            done_here = [(int(m.partition() or 0), int(m.offset() or 0)) for m in batch]
            emit(processed=done_here)
            upto: dict[int, int] = {}
            for partition, offset in done_here:
                upto[partition] = max(upto.get(partition, 0), offset + 1)
            try:
                done = consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in upto.items()],
                                       asynchronous=False)
            except KafkaException as exc:
                emit(failed_commit=str(exc))
                continue
            acked = [[tp.partition, tp.offset] for tp in done or [] if tp.error is None]
            emit(committed=acked)
            refused = [f"{tp.partition}: {tp.error}" for tp in done or [] if tp.error is not None]
            if refused:
                emit(failed_commit="; ".join(refused))
    finally:
        consumer.close()
    emit(closed=True)


if __name__ == "__main__":
    main()
