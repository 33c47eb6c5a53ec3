"""Producer-state snapshots: a partition's idempotence and transaction state at a log offset.

Kafka writes a producer-state snapshot file at log offsets and, at start-up, loads the latest one and
replays only the log after it. icelog does the same through the metadata store: a snapshot holds the
ProducerStateTable (each producer's epoch and last five batches' sequences) and the TxnIndex (open
transactions and aborted ranges) after every batch below `offset`; start-up replays only batches at or
past it. A snapshot is taken only when every offset the partition handed out is durable (nothing in
flight), so it never describes batches a crash could still lose.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from icelog.config import Settings
from icelog.errors import log_retry
from icelog.log.partition import PartitionLog
from icelog.log.producers import ProducerEntry, ProducerStateTable, SequencedBatch, iter_stored_headers
from icelog.log.storage import ChunkReader
from icelog.log.topic_logs import LogStore, TopicLogs
from icelog.log.transactions import AbortedRange, TxnIndex, marker_type
from icelog.meta.store import ProducerSnapshot

log = logging.getLogger(__name__)

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


class ProducerStates:
    """Each partition's producer and transaction state across restarts: rebuilt at start-up from the latest
    snapshot and the intake after it, snapshotted in the background and at a clean stop."""

    def __init__(self, settings: Settings, store: LogStore, reader: ChunkReader, topics: TopicLogs) -> None:
        self.settings = settings
        self.store = store
        self.reader = reader
        self.topics = topics
        self._snapshot_offsets: dict[tuple[uuid.UUID, int], int] = {}  # last snapshot saved per partition

    def rebuild(self) -> None:
        """Load each partition's producer-state snapshot, then replay only the batches stored after it."""
        snapshots = {(s.topic_id, s.partition): s for s in self.store.producer_snapshots()}
        replayed = sum(self.rebuild_partition(part, snapshots.get((part.topic_id, part.partition)))
                       for part in self.topics.partitions() if part.led)
        log.info("producer state: %d snapshot(s) loaded, %d intake chunk(s) replayed", len(snapshots), replayed)

    def rebuild_partition(self, part: PartitionLog, snapshot: ProducerSnapshot | None) -> int:
        """One partition's state from its snapshot and the chunks after it (a partition not served yet: any
        thread); the chunks replayed."""
        since = 0
        replayed = 0
        # A snapshot past the high watermark cannot be (the index is re-derived from fsync'd
        # frames); should it happen, the intake is the truth: replay all of it.
        if snapshot is not None and snapshot.offset <= part.high_watermark:
            loaded = decode_state(snapshot.state)
            if loaded is not None:
                part.producers, part.txn_index = loaded
                part.txn_index.drop_before(part.log_start_offset)
                since = snapshot.offset
                self._snapshot_offsets[(part.topic_id, part.partition)] = since
        for chunk in part.chunks_from(since):
            if chunk.end_offset <= since:
                continue
            data = self.reader.read(chunk)
            headers = [h for h in iter_stored_headers(data) if h.base_offset >= since]
            part.producers.replay(headers)
            part.txn_index.replay(
                (h, marker_type(data, h.position) if h.is_control else None) for h in headers
            )
            replayed += 1
        return replayed

    def snapshot_of(self, topic_id: uuid.UUID, partition: int) -> ProducerSnapshot | None:
        """A partition's latest stored snapshot (any thread)."""
        return self.store.producer_snapshot(topic_id, partition)

    def take(self) -> list[ProducerSnapshot]:
        """Snapshots of partitions that moved since their last one and have nothing in flight (event loop)."""
        out = []
        for part in self.topics.partitions():
            key = (part.topic_id, part.partition)
            if not part.led:  # another broker's: its state here is stale, and must not replace the leader's
                continue
            if part.next_offset != part.high_watermark or self._snapshot_offsets.get(key) == part.high_watermark:
                continue  # appends in flight could still be lost; or nothing new since the last one
            out.append(ProducerSnapshot(part.topic_id, part.partition, part.high_watermark,
                                        encode_state(part.producers, part.txn_index)))
        return out

    def saved(self, snapshots: list[ProducerSnapshot]) -> None:
        for snapshot in snapshots:
            self._snapshot_offsets[(snapshot.topic_id, snapshot.partition)] = snapshot.offset

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.intake.producer_snapshot_interval_ms / 1000)
            try:
                snapshots = self.take()
                if snapshots:
                    await asyncio.to_thread(self.store.save_producer_snapshots, snapshots)
                    self.saved(snapshots)
            except Exception as exc:
                log_retry(log, "saving producer-state snapshots", exc)

    def save_now(self) -> None:
        """At a clean stop, everything queued durable: the next start-up replays nothing."""
        try:
            snapshots = self.take()
            self.store.save_producer_snapshots(snapshots)
            self.saved(snapshots)
        except Exception:
            log.exception("saving producer-state snapshots at shutdown failed (start-up will replay)")
