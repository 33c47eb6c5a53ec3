"""A confluent-kafka consume-transform-produce loop (offsets sent to the transaction) that a test drives step by step
over stdin, as a child process: librdkafka stays out of the test's own process while the test kills brokers.

usage: python eos_steps.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID

Commands, one a line; each answers one JSON line on stdout:
  step commit|abort   one transaction of the next records (up to 10): {"step": ..., "records": n, "positions": {...}}
  step hold           the same up to sendOffsetsToTransaction (TxnOffsetCommit answered), then waits
  end commit|abort    ends the held transaction: {"end": ..., "outcome": "committed" | "aborted"}
  drain TOTAL         committed transactions until the positions add up to TOTAL: {"drained": n}
  quit
An error answers {"error": text, "abortable": bool}. Progress goes to stderr; EOS_STEPS_DEBUG=eos,cgrp (librdkafka's
`debug` contexts) adds the clients' own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition


class Loop:
    def __init__(self, bootstrap: str, source: str, target: str, group: str, txn_id: str) -> None:
        self.target = target
        debug = {"debug": os.environ["EOS_STEPS_DEBUG"]} if os.environ.get("EOS_STEPS_DEBUG") else {}
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "isolation.level": "read_committed", "session.timeout.ms": 10000, **debug,
        })
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000, **debug})
        self.producer.init_transactions(60)
        self.consumer.subscribe([source])

    def _next(self, timeout: float = 30.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [m for m in self.consumer.consume(num_messages=10, timeout=0.5) if m.error() is None]
            if got:
                return got
        return []

    def positions(self) -> dict[int, int]:
        return {tp.partition: tp.offset for tp in self.consumer.position(self.consumer.assignment())}

    def step(self, hold: bool) -> dict[str, Any]:
        """Begin, produce the copies of the next records, send the offsets; commit unless held."""
        messages = self._next()
        say(f"{len(messages)} record(s) at {self.positions()}: begin")
        self.producer.begin_transaction()
        for m in messages:
            self.producer.produce(self.target, value=b"copy-" + m.value(), partition=m.partition())
        self.producer.flush(60)
        say("produced; sending the offsets")
        self.producer.send_offsets_to_transaction(self.consumer.position(self.consumer.assignment()),
                                                  self.consumer.consumer_group_metadata(), 60)
        say("offsets sent")
        return {"records": len(messages), "positions": self.positions()}

    def end(self, commit: bool) -> str:
        say("commit" if commit else "abort")
        if commit:
            self.producer.commit_transaction(120)
            return "committed"
        self.producer.abort_transaction(60)
        self.rewind()
        return "aborted"

    def rewind(self) -> None:
        """After an abort, back to the committed offsets (what was consumed is not done)."""
        for tp in self.consumer.committed(self.consumer.assignment(), 60):
            self.consumer.seek(tp if tp.offset >= 0 else TopicPartition(tp.topic, tp.partition, 0))

    def drain(self, total: int) -> int:
        transactions = 0
        while sum(max(offset, 0) for offset in self.positions().values()) < total:
            try:
                self.step(hold=False)
                self.end(True)
                transactions += 1
            except KafkaException as exc:
                say(f"failed: {exc}")
                if not exc.args[0].txn_requires_abort():
                    raise
                self.producer.abort_transaction(60)
                self.rewind()
        return transactions


def say(what: str) -> None:
    """A line of the loop's progress on stderr (the test keeps it in a log)."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def main() -> None:
    loop = Loop(*sys.argv[1:6])
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            if words[0] == "step":
                out: dict[str, Any] = {"step": words[1], **loop.step(hold=True)}
                if words[1] != "hold":
                    out["outcome"] = loop.end(words[1] == "commit")
            elif words[0] == "end":
                out = {"end": words[1], "outcome": loop.end(words[1] == "commit")}
            else:
                out = {"drained": loop.drain(int(words[1])), "positions": loop.positions()}
        except KafkaException as exc:
            out = {"error": str(exc), "abortable": exc.args[0].txn_requires_abort()}
        print(json.dumps(out), flush=True)
    loop.consumer.close()


if __name__ == "__main__":
    main()
