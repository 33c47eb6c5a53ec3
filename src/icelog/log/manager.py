"""The log manager: the one entry to the log for the broker, the wire and the coordinators. It assembles the
intake's storage (log/storage.py) and the log's jobs, each in a home of its own: the topics and their partition logs
(topic_logs.py), appends (appends.py), retention (retention.py), back-pressure (pressure.py) and producer-state
snapshots (snapshots.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping

from icelog.config import Settings
from icelog.errors import ConfigError
from icelog.log.appends import Appender, AppendResult
from icelog.log.backends import open_storage
from icelog.log.partition import PartitionLog
from icelog.log.pressure import Pressure
from icelog.log.retention import OnLoop, Retention, run_inline
from icelog.log.s3 import ObjectStorage
from icelog.log.snapshots import ProducerStates
from icelog.log.storage import IntakeStorage
from icelog.log.topic_logs import LogStore, OlderSources, TopicLogs, TopicState
from icelog.meta.store import ArchiveState, BrokerLease, ProducerSnapshot, TopicRecord
from icelog.records.batch import BatchHeader
from icelog.records.walk import MAX_UNCOMPRESSED_BYTES

__all__ = ["AppendResult", "LogManager", "LogStore", "TopicState"]


class LogManager:
    """Owns the intake storage and every partition log; all mutations go through here."""

    def __init__(self, settings: Settings, store: LogStore, storage: IntakeStorage | None = None) -> None:
        self.settings = settings
        self.store = store
        # The intake's backend (log/storage.py), from the settings unless handed one.
        self.storage = open_storage(settings, store) if storage is None else storage
        self.catalog = TopicLogs(settings, store, self.storage)
        self.pressure = Pressure(settings, store, self.storage, self.catalog)
        self.appender = Appender(self.catalog, self.storage, self.pressure)
        self.retention = Retention(settings, store, self.storage, self.catalog)
        self.producer_states = ProducerStates(settings, store, self.storage, self.catalog)
        self._snapshot_task: asyncio.Task[None] | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Recover the intake and load every topic; call before serving."""
        self.storage.recover()
        self.catalog.load()
        self.storage.release()
        self.producer_states.rebuild()
        # Back-pressure counts from the first request on (then refreshed in the background by the broker).
        self.pressure.apply(self.pressure.count_unarchived(self.store.archive_states()),
                            self.storage.capacity().free_bytes)

    def start(self) -> None:
        self.storage.start(self.appender.on_durable, self.appender.on_not_written)
        self._snapshot_task = asyncio.get_running_loop().create_task(self.producer_states.run(),
                                                                     name="producer-snapshots")

    async def close(self, before_store_closes: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop: appends queued become durable (or fail), producer state is snapshotted, then the store closes
        (after `before_store_closes`: a cluster's broker leaves the cluster there)."""
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        await self.storage.close()
        if self.storage.failed is None:
            self.producer_states.save_now()  # everything queued is durable now: the next start-up replays nothing
        if before_store_closes is not None:
            await before_store_closes()
        self.store.close()

    # -- a cluster's broker (cluster/controller.py) ---------------------------------------------------
    def join_cluster(self, lease: BrokerLease) -> None:
        """Serve as one broker of a cluster (before open()): partitions only while leading them, the intake's
        objects under this node's own ids and tail, and every commit fenced by the leaderships it holds."""
        if not isinstance(self.storage, ObjectStorage):
            raise ConfigError("several brokers need the intake on object storage (intake.url: s3://...)")
        self.storage.lease = lease
        self.catalog.clustered = True

    def take_partition(self, topic_id: uuid.UUID, partition: int) -> PartitionLog | None:
        """A partition's log as the store has it now, producer and transaction state rebuilt, ready to serve
        (any thread; `serve` it on the event loop). None: the topic is gone."""
        fresh = self.catalog.fresh_partition(topic_id, partition)
        if fresh is not None:
            self.producer_states.rebuild_partition(fresh, self.producer_states.snapshot_of(topic_id, partition))
        return fresh

    def serve(self, fresh: PartitionLog) -> bool:
        """Lead a partition taken with take_partition (event loop)."""
        return self.catalog.replace(fresh)

    def unserve(self, topic_id: uuid.UUID, partition: int) -> None:
        """Stop serving a partition another broker leads now (event loop): its requests get NOT_LEADER_OR_FOLLOWER,
        and its appends still in flight are fenced by the store."""
        part = self.catalog.partition_by_id(topic_id, partition)
        if part is not None:
            part.led = False
            part.wake_waiters()

    def sync_topics(self, records: list[TopicRecord]) -> list[str]:
        """Follow the topics other brokers create, grow, reconfigure and delete (event loop); the names of the
        topics deleted (or deleted and created again) elsewhere since the last look."""
        ids = {r.name: r.topic_id for r in records}
        gone = [name for name, state in self.catalog.topics.items() if ids.get(name) != state.record.topic_id]
        self.catalog.sync(records)
        return gone

    # -- what others set and read ----------------------------------------------------------------
    @property
    def topics(self) -> dict[str, TopicState]:
        return self.catalog.topics

    @property
    def older_sources(self) -> OlderSources | None:
        """The broker's older offset range sources (the Iceberg table) of a partition; set before open()."""
        return self.catalog.older_sources

    @older_sources.setter
    def older_sources(self, sources: OlderSources | None) -> None:
        self.catalog.older_sources = sources

    @property
    def txn_verifier(self) -> Callable[[str, int, int, int], None] | None:
        """Set by the transaction coordinator (appends.Appender.txn_verifier)."""
        return self.appender.txn_verifier

    @txn_verifier.setter
    def txn_verifier(self, verifier: Callable[[str, int, int, int], None] | None) -> None:
        self.appender.txn_verifier = verifier

    @property
    def space_refusal(self) -> str | None:
        """Why produce is refused for space now, or None."""
        return self.pressure.space_refusal

    # -- topics --------------------------------------------------------------------------------
    def get(self, name: str) -> TopicState | None:
        return self.catalog.get(name)

    def partition(self, topic: str, partition: int) -> tuple[TopicState, PartitionLog]:
        return self.catalog.partition(topic, partition)

    def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str | None], validate_only: bool = False
    ) -> TopicState | None:
        """Create a topic (Kafka's rules); raise KafkaApiError with the code a client expects."""
        return self.catalog.create_topic(name, partitions, configs, validate_only)

    def delete_topic(self, name: str) -> None:
        self.catalog.delete_topic(name)

    def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        self.catalog.add_partitions(name, total, validate_only)

    def alter_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str], validate_only: bool = False
    ) -> None:
        self.catalog.alter_configs(name, set_configs, delete_keys, validate_only)

    # -- back-pressure -------------------------------------------------------------------------
    def admission(self, topic: TopicState) -> int:
        """Throttle (ms) for a produce to `topic`, or a retriable refusal past a bound; O(1) (log/pressure.py)."""
        return self.pressure.admission(topic)

    def free_estimate(self, pending: int = 0) -> int | None:
        return self.pressure.free_estimate(pending)

    def count_unarchived(self, archived: Iterable[ArchiveState]) -> dict[uuid.UUID, int]:
        return self.pressure.count_unarchived(archived)

    def apply_pressure(
        self, unarchived: dict[uuid.UUID, int], free_bytes: int | None, written_before: int | None = None
    ) -> None:
        self.pressure.apply(unarchived, free_bytes, written_before)

    # -- appends -------------------------------------------------------------------------------
    @staticmethod
    def validate(topic: TopicState, records: bytes, inflation_limit: int = MAX_UNCOMPRESSED_BYTES) -> list[BatchHeader]:
        """The produced batches of `records` for `topic`, checked as Kafka checks them (any thread)."""
        return Appender.validate(topic, records, inflation_limit)

    def append(
        self, topic: TopicState, partition: PartitionLog, records: bytes, batches: list[BatchHeader] | None = None
    ) -> tuple[AppendResult, asyncio.Future[None]]:
        """Validate, assign offsets and queue batches; the future resolves when they are durable."""
        return self.appender.append(topic, partition, records, batches)

    def append_marker(
        self, partition: PartitionLog, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """Write a transaction commit/abort marker (a control batch) through the intake."""
        return self.appender.append_marker(partition, producer_id, producer_epoch, commit, coordinator_epoch)

    # -- retention and snapshots -----------------------------------------------------------------
    def enforce_retention(self, now_ms: int | None = None, on_loop: OnLoop = run_inline) -> int:
        """One retention pass (log/retention.py); how many chunks were dropped."""
        return self.retention.enforce(now_ms, on_loop)

    def snapshot_producer_state(self) -> list[ProducerSnapshot]:
        return self.producer_states.take()
