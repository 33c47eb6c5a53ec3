"""An exactly-once copy job (consume -> transform -> produce, offsets in the transaction), run as a child
process by tests/coordinator/test_transactions.py so the test can SIGKILL it mid-way and start it again.

usage: python copy_job.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID
"""

from __future__ import annotations

import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer


def main() -> None:
    bootstrap, source, target, group, txn_id = sys.argv[1:6]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    consumer.subscribe([source])
    while not stop["now"]:
        messages = [m for m in consumer.consume(num_messages=10, timeout=0.5) if m.error() is None]
        if not messages:
            continue
        producer.begin_transaction()
        for m in messages:
            producer.produce(target, key=m.key(), value=b"copy-" + m.value(), partition=m.partition())
        producer.flush(30)
        time.sleep(0.05)  # widen the window in which a kill lands inside an open transaction
        try:
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
        except KafkaException as exc:
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction(30)
                _rewind(consumer)
                continue
            raise
        print(f"committed {len(messages)}", flush=True)
    consumer.close()


def _rewind(consumer: Consumer) -> None:
    """After an abort, go back to the committed offsets (what was consumed is not done)."""
    committed = consumer.committed(consumer.assignment(), 30)
    for tp in committed:
        if tp.offset >= 0:
            consumer.seek(tp)


if __name__ == "__main__":
    main()
