"""Producer-state snapshots: a partition's idempotence and transaction state at a log offset.

Kafka writes a producer-state snapshot file at log offsets and, at start-up, loads the latest one and
replays only the log after it. icelog does the same through the metadata store: a snapshot holds the
ProducerStateTable (each producer's epoch and last five batches' sequences) and the TxnIndex (open
transactions and aborted ranges) after every batch below `offset`; start-up replays only batches at or
past it. A snapshot is taken only when every offset the partition handed out is durable (nothing in
flight), so it never describes batches a crash could still lose.
"""

from __future__ import annotations

import json
import time

from icelog.log.producers import ProducerEntry, ProducerStateTable, SequencedBatch
from icelog.log.transactions import AbortedRange, TxnIndex

FORMAT_VERSION = 1


def encode_state(producers: ProducerStateTable, txns: TxnIndex) -> str:
    """The snapshot text of one partition's producer and transaction state."""
    return json.dumps(
        {
            "v": FORMAT_VERSION,
            "producers": [
                [pid, e.epoch, [[b.first_sequence, b.last_sequence, b.base_offset] for b in e.batches]]
                for pid, e in producers.entries.items()
            ],
            "open": [[pid, first] for pid, first in txns.open.items()],
            "aborted": [[r.producer_id, r.first_offset, r.last_offset] for r in txns.aborted],
        },
        separators=(",", ":"),
    )


def decode_state(text: str) -> tuple[ProducerStateTable, TxnIndex] | None:
    """The state a snapshot holds, or None if it is of an unknown format (then replay everything)."""
    data = json.loads(text)
    if data.get("v") != FORMAT_VERSION:
        return None
    producers = ProducerStateTable()
    for pid, epoch, batches in data["producers"]:
        entry = ProducerEntry(epoch)
        entry.batches.extend(SequencedBatch(first, last, base) for first, last, base in batches)
        producers.entries[pid] = entry
    txns = TxnIndex()
    now = time.monotonic()  # open transactions' timeouts count from this start-up, as after a replay
    for pid, first in data["open"]:
        txns.open[pid] = first
        txns.opened_at[pid] = now
    for pid, first, last in data["aborted"]:
        txns.aborted.append(AbortedRange(pid, first, last))
        txns._aborted_last.append(last)
    return producers, txns
