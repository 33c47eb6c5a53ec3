"""Producing a pinned table's records into a topic, exactly once across runs.

How a replay that is interrupted and run again neither loses nor duplicates a record:

* The order is fixed. Records are read source partition by source partition, each in offset order, and placed by
  `placement.Placement` (murmur2 of the key, round-robin counted in that order for null keys), so the records bound
  for destination partition d are one list, the same in every run of the same snapshot.
* A transactional producer (`transactional.id` `icelog-replay.<topic>`) writes them in transactions of
  `transaction_records`. Each transaction also commits, through `send_offsets_to_transaction`, the replay's own
  consumer group `icelog-replay.<topic>`: for each destination partition d the "offset" is how many of d's list
  are committed, and the metadata names the table, the snapshot and the partition count (the progress marker).
  Records and marker become visible together, or not at all.
* A run starts with `init_transactions`, which fences an earlier run that may still be writing and aborts its open
  transaction, reads the marker, replays the marker's snapshot and skips, per destination partition, the records the
  marker counts. Records of an aborted transaction stay in the log as aborted: consumers reading read_committed
  (librdkafka's default; the Java client's is read_uncommitted) never see them.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from icelog.errors import IcelogError
from icelog.faults import armed, fault_point, hold_point
from icelog.replay.placement import Placement
from icelog.replay.source import Header, PartitionRows, TableAt

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer

log = logging.getLogger(__name__)

DEFAULT_TRANSACTION_RECORDS = 200_000  # a commit waits for its records: fewer of them keep the producer busy
TIMEOUT_S = 30.0
MARKER_VERSION = 1


class ReplayError(IcelogError):
    """A replay cannot start or go on (the message says how to fix it)."""


def replay_group(topic: str) -> str:
    """The consumer group (and transactional id) of replays into `topic`: where their progress is committed."""
    return f"icelog-replay.{topic}"


@dataclass(frozen=True)
class Marker:
    """A replay's progress as committed with its last transaction."""

    table: str
    snapshot_id: int
    partitions: int
    done: bool
    counts: dict[int, int] = field(default_factory=dict)  # destination partition → records of its list committed

    def metadata(self) -> str:
        return json.dumps({"v": MARKER_VERSION, "table": self.table, "snapshot": self.snapshot_id,
                           "partitions": self.partitions, "done": self.done}, separators=(",", ":"))


@dataclass(frozen=True)
class Outcome:
    """What one run did."""

    records: int  # records of the snapshot (all destination partitions)
    produced: int  # produced by this run (the rest were committed by an earlier one)
    snapshot_id: int
    partitions: int
    already_done: bool = False


class ClientErrors:
    """What librdkafka reported about its connections (a failed login, a broker down): its own log lines are kept
    off the terminal, and an error a replay stops on names the last of these."""

    def __init__(self) -> None:
        self.errors: list[Any] = []
        self.logger = logging.getLogger("icelog.replay.librdkafka")
        self.logger.addHandler(logging.NullHandler())
        self.logger.propagate = False

    def __call__(self, error: Any) -> None:
        self.errors.append(error)
        del self.errors[:-10]

    def login_failed(self) -> bool:
        from confluent_kafka import KafkaError

        return any(e.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL) for e in self.errors)

    def last(self) -> str:
        return str(self.errors[-1].str()) if self.errors else "no answer"


def client_config(bootstrap: str, properties: Mapping[str, str], errors: ClientErrors) -> dict[str, Any]:
    """librdkafka's configuration: the bootstrap address and the broker's security settings."""
    return {**properties, "bootstrap.servers": bootstrap, "error_cb": errors, "logger": errors.logger}


def read_marker(consumer: Consumer, topic: str, partitions: int) -> Marker | None:
    """The progress a replay committed into `topic` (None: no replay has committed anything there)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise ReplayError(f"reading the replay's progress (group {replay_group(topic)}) failed: {exc}") from None
    found: Marker | None = None
    counts: dict[int, int] = {}
    for tp in committed:
        if tp.offset < 0 or not tp.metadata:
            continue
        try:
            meta = json.loads(tp.metadata)
            marker = Marker(str(meta["table"]), int(meta["snapshot"]), int(meta["partitions"]), bool(meta["done"]))
        except (ValueError, KeyError, TypeError):
            raise ReplayError(f"consumer group {replay_group(topic)} holds offsets that are no replay's progress; "
                              "delete the group (kafka-consumer-groups --delete --group "
                              f"{replay_group(topic)}) or replay into another topic") from None
        found = marker if found is None or (marker.done and not found.done) else found
        counts[tp.partition] = tp.offset
    if found is None:
        return None
    return Marker(found.table, found.snapshot_id, found.partitions, found.done, counts)


class Replay:
    """One run of a replay of `source` into `topic` (which exists with `partitions` partitions)."""

    def __init__(self, source: TableAt, topic: str, partitions: int, client: dict[str, Any],
                 transaction_records: int = DEFAULT_TRANSACTION_RECORDS,
                 progress: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.topic = topic
        self.partitions = partitions
        self.client = client
        self.transaction_records = max(1, transaction_records)
        self._say = progress or (lambda _line: None)

    def run(self, marker: Marker | None, consumer: Consumer) -> Outcome:
        """Produce what `marker` does not count yet, in transactions that commit the marker with the records."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer({
            "linger.ms": 20, "batch.size": 1_000_000, **self.client,
            "transactional.id": replay_group(self.topic), "enable.idempotence": True,
        })
        try:
            producer.init_transactions(TIMEOUT_S)
            return self._produce(producer, consumer, marker.counts if marker else {})
        except KafkaException as exc:
            raise ReplayError(f"producing into {self.topic} failed: {exc.args[0]}; run the same command again "
                              "to resume (nothing committed is produced twice)") from None
        finally:
            producer.flush(0)

    def _produce(self, producer: Producer, consumer: Consumer, committed: dict[int, int]) -> Outcome:
        import numpy as np
        from confluent_kafka import TopicPartition

        group = consumer.consumer_group_metadata()
        partitions = self.partitions
        placement = Placement(partitions)
        placed = np.zeros(partitions, np.int64)  # records of each destination list met so far
        skip = np.array([committed.get(d, 0) for d in range(partitions)], np.int64)  # ... committed by earlier runs
        total = produced = pending = 0
        topic = self.topic
        full = self.transaction_records
        # The kill -9 test's hook: a stop halfway through a transaction, once one was committed.
        half = full // 2 if armed("replay-held") else full

        def commit(counts: np.ndarray, done: bool) -> None:
            # A record that failed for good fails the commit (the transaction is then abortable): nothing partial.
            marker = Marker(self.source.name, self.source.snapshot_id, partitions, done).metadata()
            # What an earlier run committed stays committed, also where this run has not reached it yet (a
            # destination's skipped records further on in the source partition being produced).
            counts = np.maximum(counts, skip)
            offsets = [TopicPartition(topic, d, int(counts[d]), marker) for d in range(partitions)]
            producer.send_offsets_to_transaction(offsets, group, TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)

        producer.begin_transaction()
        for rows in _read_ahead(self.source):
            destinations = np.asarray(placement.place_all(rows.keys), np.int64)
            n = len(destinations)
            total += n
            columns: list[list[Any]] = [destinations.tolist(), rows.keys.to_pylist(), rows.values, rows.timestamps_ms,
                                        rows.headers]
            kept: np.ndarray | None = None  # the rows to produce, when earlier runs committed some of these
            if (skip > placed).any():
                keep = np.ones(n, bool)
                for d in np.flatnonzero(skip > placed).tolist():
                    keep[np.flatnonzero(destinations == d)[: int(skip[d] - placed[d])]] = False
                kept = np.flatnonzero(keep)
                columns = [[column[i] for i in kept.tolist()] for column in columns]
            todo = len(columns[0])
            done_rows = 0
            while done_rows < todo:
                stop = half if pending < half else full
                take = min(todo - done_rows, stop - pending)
                self._send(producer, *(column[done_rows:done_rows + take] for column in columns))
                done_rows += take
                pending += take
                produced += take
                if pending == half < full and produced > pending:
                    hold_point("replay-held", Path(tempfile.gettempdir()) / "icelog-replay-held.release")
                if pending < full:
                    continue
                if armed("replay-in-transaction"):
                    producer.flush(TIMEOUT_S)  # every record of the transaction in the log, then the kill
                    fault_point("replay-in-transaction")
                # The source rows up to the last one produced, skipped ones included, count as in the topic.
                through = done_rows if kept is None else int(kept[done_rows - 1]) + 1
                counts = placed + np.bincount(destinations[:through], minlength=partitions)
                commit(counts, done=False)
                fault_point("replay-committed")
                self._say(f"replayed {int(counts.sum())} records ({produced} produced by this run)")
                pending = 0
                producer.begin_transaction()
            placed += np.bincount(destinations, minlength=partitions)
        commit(placed, done=True)
        return Outcome(total, produced, self.source.snapshot_id, self.partitions)

    def _send(self, producer: Producer, destinations: list[int], keys: list[bytes | None],
              values: list[bytes | None], timestamps: list[int], headers: list[list[Header] | None]) -> None:
        """Produce one run of records (the replay's hot loop: nothing else per record)."""
        produce, topic = producer.produce, self.topic
        sent = cast("list[list[tuple[str, str | bytes | None]] | None]", headers)
        for d, key, value, timestamp, hdrs in zip(destinations, keys, values, timestamps, sent, strict=True):
            try:
                produce(topic, value, key, partition=d, timestamp=timestamp, headers=hdrs)
            except BufferError:  # the local queue is full: let librdkafka send, then once more
                while True:
                    producer.poll(0.05)
                    try:
                        produce(topic, value, key, partition=d, timestamp=timestamp, headers=hdrs)
                        break
                    except BufferError:
                        continue


def _read_ahead(source: TableAt) -> Iterator[PartitionRows]:
    """Each source partition's rows, the next one read on a thread while the current one is produced (the scan's
    Parquet decoding and sorting run in Arrow, outside the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="replay-read") as pool:
        ahead = pool.submit(source.rows, 0) if source.partitions else None
        for partition in range(source.partitions):
            assert ahead is not None
            rows = ahead.result()
            ahead = pool.submit(source.rows, partition + 1) if partition + 1 < source.partitions else None
            yield rows


def wait_for_topic(consumer: Consumer, topic: str, partitions: int, timeout_s: float = TIMEOUT_S) -> None:
    """Until Metadata shows the topic's partitions (a topic just created may not be in every broker's view)."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise ReplayError(f"topic {topic} did not show {partitions} partitions within {timeout_s:.0f} s")
        time.sleep(0.1)
