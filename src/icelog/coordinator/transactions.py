"""The transaction coordinator: producer ids, transactional ids and their transactions.

A transaction's life: InitProducerId (fences older epochs, aborts what they left open) -> AddPartitionsToTxn /
AddOffsetsToTxn -> produce + TxnOffsetCommit (to the group's coordinator: coordinator/txn_offsets.py) -> EndTxn.
EndTxn first records PrepareCommit/PrepareAbort in the metadata store, then writes a marker (control batch) to
every partition through the intake and one to each group's coordinator shard (its pending offsets committed or
dropped), then records CompleteCommit/CompleteAbort. A broker restart
finishes any Prepare* state it finds, and aborts open transactions nobody owns. Transactions open longer
than their timeout are aborted with a bumped epoch, so the late producer is fenced.

No transaction can pin a partition's last stable offset: a transactional batch is appended only if its
producer's Ongoing transaction includes the partition (Kafka >= 3.6 verification; else INVALID_TXN_STATE),
and any transaction open in a partition that no Ongoing transaction owns is aborted by the broker (at
start-up at once; while running after its transaction.timeout.ms, or transaction.max.timeout.ms when its
producer is unknown).

In a cluster (issue 46) each broker coordinates the transactional ids of the coordinator shards it leads
(cluster/view.coordinator_shard, Kafka's __transaction_state partitions): `take_shard` loads their state from the
store and finishes what their previous coordinator left in Prepare*, `drop_shard` forgets them, and every other
transactional id is answered NOT_COORDINATOR. A marker for a partition another broker leads goes to that leader as
WriteTxnMarkers (`RemoteMarkers`, client/markers.py), retried (leaders move) until every partition has it; so
does the marker of a group's coordinator shard another broker leads (partition `shard` of `__consumer_offsets`, as
Kafka sends it to the group coordinator); only then is the transaction recorded complete. A partition leader that
does not coordinate a producer's transactional id verifies its transactional batches from the store's record of that
id (`verify_remote`), cached per producer, epoch and partition until a marker ends the transaction there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from icelog.cluster.view import GROUP_SHARDS_ID, TXN_SHARDS_ID, ClusterView, coordinator_shard
from icelog.coordinator.groups import GroupCoordinator
from icelog.coordinator.txn_offsets import OFFSETS_TOPIC
from icelog.errors import ErrorCode, KafkaApiError
from icelog.faults import armed, fault_point
from icelog.log.manager import LogManager, TopicState
from icelog.log.partition import PartitionLog
from icelog.meta.store import BrokerLease, TransactionLog, TransactionRecord
from icelog.records.batch import BatchHeader

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000
MAX_EPOCH = 32767
SWEEP_INTERVAL_S = 0.5
PRODUCER_ID_EXPIRATION_S = 7 * 24 * 3600  # Kafka's transactional.id.expiration.ms default
EXPIRE_EVERY_S = 600
# Test hook (icelog.faults): complete transactions without their markers, as a lost WriteTxnMarkers left Kafka's
# hanging transactions behind; `kafka-transactions find-hanging` and `abort` are then what an operator has.
MARKERS_LOST_FAULT = "txn-markers-lost"
MARKER_RETRY_MAX_S = 1.0  # markers to a partition whose leader is moving: asked again after at most this
HANGING_RECHECK_S = 5.0  # a hanging candidate the store says is owned elsewhere: looked at again after this


class RemoteMarkers(Protocol):
    """WriteTxnMarkers to another broker of the cluster (client/markers.MarkerChannel)."""

    async def write(
        self, node: int, producer_id: int, producer_epoch: int, commit: bool, partitions: Sequence[tuple[str, int]],
        coordinator_epoch: int = 0,
    ) -> dict[tuple[str, int], int]:
        """Each partition's error code (0: the marker is written)."""
        ...

    def close(self) -> None: ...


class TxnState(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


# A transaction in these states will get its markers from the coordinator: never abort it as hanging
# (a Prepare* one is being completed right now, its markers are on their way).
_OWNING = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass
class TxnMetadata:
    """One transactional id in memory."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)  # AddOffsetsToTxn's (their offsets wait at their coordinator)
    started: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def record(self) -> TransactionRecord:
        return TransactionRecord(
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state.value,
            tuple(sorted(self.partitions)),
            tuple(sorted(self.groups)),
        )

    def marker_targets(self) -> set[tuple[str, int]]:
        """What the markers go to: every partition, and each group's coordinator shard (`__consumer_offsets`)."""
        return self.partitions | {(OFFSETS_TOPIC, coordinator_shard(g)) for g in self.groups}


def _fenced(version: int, fenced_since: int) -> ErrorCode:
    # PRODUCER_FENCED (KIP-588) only for request versions that know it; older ones get INVALID_PRODUCER_EPOCH.
    return ErrorCode.PRODUCER_FENCED if version >= fenced_since else ErrorCode.INVALID_PRODUCER_EPOCH


class TransactionCoordinator:
    """Every transactional id of this broker (event loop thread only)."""

    def __init__(
        self, store: TransactionLog, logs: LogManager, groups: GroupCoordinator, max_timeout_ms: int = 900000
    ) -> None:
        self.store = store
        self.logs = logs
        self.groups = groups
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMetadata] = {}
        self.by_pid: dict[int, TxnMetadata] = {}  # producer id -> its transactional id's metadata
        self._next_pid = 0
        self._pid_limit = 0
        self._sweeper: asyncio.Task[None] | None = None
        # Transaction state writes fsync: one thread keeps them off the event loop and in order.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txn-state")
        logs.txn_verifier = self.verify_append
        # A cluster's broker (txn_shards.TxnShards): the coordinator shards it serves, the view, the other brokers.
        self.shards: set[int] | None = None  # None: a broker alone coordinates every transactional id
        self.cluster_view: Callable[[], ClusterView | None] = lambda: None
        self.remote_markers: RemoteMarkers | None = None
        self.shard_lease: BrokerLease | None = None
        # Transactional batches verified from the store: (producer id, topic, partition) -> (epoch, the partition
        # log verified on, until when); dropped by a marker of that producer there.
        self._verified: dict[tuple[int, str, int], tuple[int, PartitionLog, float]] = {}
        self._hanging_checked: dict[int, float] = {}  # producer id -> when the store last said it is owned
        self._completions: set[asyncio.Task[None]] = set()

    # -- a cluster's broker (coordinator/txn_shards.py sets it up) -------------------------------------
    def coordinates(self, transactional_id: str) -> bool:
        return self.shards is None or coordinator_shard(transactional_id) in self.shards

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._completions.add(task)
        task.add_done_callback(self._completions.discard)

    async def finish(self, meta: TxnMetadata) -> None:
        """Complete a Prepare* transaction whose lock the caller took (released here)."""
        try:
            log.info("completing transaction %s left in %s", meta.transactional_id, meta.state.value)
            await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
        except KafkaApiError as exc:
            log.info("transaction %s left for its new coordinator: %s", meta.transactional_id, exc.message)
        except Exception:
            log.exception("completing transaction %s failed; will retry", meta.transactional_id)
        finally:
            meta.lock.release()

    # -- life cycle ----------------------------------------------------------------------------
    def load(self) -> None:
        if self.shards is not None:  # a cluster's broker: each shard taken loads its own (take_shard)
            return
        now = time.monotonic()
        for rec in self.store.transactions():
            self.txns[rec.transactional_id] = self.by_pid[rec.producer_id] = meta_of(rec, now)

    async def recover(self) -> None:
        """Finish transactions a crash left in Prepare*, abort open transactions without an owner."""
        for meta in list(self.txns.values()):
            if meta.lock.locked():  # being completed (a shard taken)
                continue
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("completing transaction %s left in %s", meta.transactional_id, meta.state.value)
                await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
            elif meta.state == TxnState.ONGOING:
                meta.started = time.monotonic()
        # Nobody can ever end these (no Ongoing transaction includes the partition): abort them now.
        await self.abort_hanging(lambda _pid, _opened: True)

    def _owns(self, producer_id: int, tp: tuple[str, int], states: Iterable[TxnState] = _OWNING) -> bool:
        """Whether a transaction of this producer in one of `states` includes the partition."""
        meta = self.by_pid.get(producer_id)
        return (
            meta is not None and meta.producer_id == producer_id and meta.state in states
            and tp in meta.partitions
        )

    async def abort_hanging(self, due: Callable[[int, float], bool]) -> int:
        """Abort (broker-written marker) open partition transactions no Ongoing transaction owns, if `due`.

        `due(producer_id, opened_monotonic)` decides; returns how many were aborted.
        """
        candidates = []
        for topic in list(self.logs.topics.values()):
            for part in topic.partitions:
                if not part.led:  # (a cluster's broker: another leads it, and looks after it)
                    continue
                for pid, opened in list(part.txn_index.opened_at.items()):
                    if self._owns(pid, (topic.name, part.partition)) or not due(pid, opened):
                        continue
                    candidates.append((topic, part, pid))
        if self.shards is not None and candidates:
            candidates = await self._unowned(candidates)
        markers = []
        for topic, part, pid in candidates:
            entry = part.producers.entries.get(pid)
            meta = self.by_pid.get(pid)
            epoch = max(entry.epoch if entry is not None else 0, meta.producer_epoch if meta else 0)
            log.warning(
                "aborting a hanging transaction of producer %d in %s-%d (no open transaction owns it)",
                pid,
                topic.name,
                part.partition,
            )
            markers.append(self.append_marker(topic.name, part, pid, epoch, commit=False))
        if markers:
            await asyncio.gather(*markers)
        return len(markers)

    async def _unowned(
        self, candidates: list[tuple[TopicState, PartitionLog, int]]
    ) -> list[tuple[TopicState, PartitionLog, int]]:
        """Of the open transactions no id coordinated here owns, those no id coordinated elsewhere owns either (the
        store says: Ongoing or Prepare* with the partition); each producer asked about at most every few seconds."""
        now = time.monotonic()
        unknown = [c for c in candidates if c[2] not in self.by_pid]
        if not unknown:
            return candidates
        if all(now - self._hanging_checked.get(pid, -HANGING_RECHECK_S) < HANGING_RECHECK_S for _, _, pid in unknown):
            return [c for c in candidates if c[2] in self.by_pid]
        by_pid = {rec.producer_id: rec for rec in await asyncio.to_thread(self.store.transactions)}
        owning = {s.value for s in _OWNING}
        out = []
        for topic, part, pid in candidates:
            if not part.led or pid not in part.txn_index.opened_at or self._owns(pid, (topic.name, part.partition)):
                continue  # (changed while the store was read)
            rec = by_pid.get(pid) if pid not in self.by_pid else None
            if rec is not None and rec.state in owning and (topic.name, part.partition) in rec.partitions:
                self._hanging_checked[pid] = now  # its coordinator (elsewhere) ends it
                continue
            out.append((topic, part, pid))
        return out

    def _hanging_due(self, now: float) -> Callable[[int, float], bool]:
        def due(pid: int, opened: float) -> bool:
            meta = self.by_pid.get(pid)
            timeout_ms = meta.timeout_ms if meta is not None else self.max_timeout_ms
            return now - opened > timeout_ms / 1000

        return due

    def verify_append(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> None:
        """Refuse a transactional batch unless the producer's Ongoing transaction includes the partition.

        Raises INVALID_PRODUCER_EPOCH for a fenced epoch, INVALID_TXN_STATE otherwise (Kafka >= 3.6).
        """
        meta = self.by_pid.get(producer_id)
        if meta is None and self.shards is not None:  # coordinated elsewhere: verified from the store first
            if not self._verified_here(producer_id, producer_epoch, topic, partition):
                raise KafkaApiError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"partition {topic}-{partition} was not added to a transaction of producer {producer_id} "
                    f"epoch {producer_epoch} (AddPartitionsToTxn first)",
                )
            return
        if meta is not None and meta.producer_id != producer_id:  # an exhausted id, replaced by a new one
            meta = None
        if meta is not None and producer_epoch < meta.producer_epoch:
            raise KafkaApiError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} epoch {producer_epoch} is fenced by epoch {meta.producer_epoch}",
            )
        if (
            meta is None or meta.producer_epoch != producer_epoch
            or not self._owns(producer_id, (topic, partition), (TxnState.ONGOING,))
        ):
            raise KafkaApiError(
                ErrorCode.INVALID_TXN_STATE,
                f"partition {topic}-{partition} was not added to a transaction of producer {producer_id} "
                f"epoch {producer_epoch} (AddPartitionsToTxn first)",
            )

    def _verified_here(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> bool:
        held = self._verified.get((producer_id, topic, partition))
        if held is None:
            return False
        epoch, part, until = held
        if epoch != producer_epoch or time.monotonic() > until:
            return False
        state = self.logs.get(topic)
        return state is not None and partition < len(state.partitions) and state.partitions[partition] is part

    async def verify_remote(
        self, transactional_id: str | None, topic: str, part: PartitionLog, batches: Iterable[BatchHeader]
    ) -> None:
        """Before a produce appends: verify its transactional batches whose transactional id another broker
        coordinates, from that id's record in the store (the coordinator stores AddPartitionsToTxn before it
        answers it), so that verify_append can answer from memory. Raises what verify_append would."""
        if self.shards is None or transactional_id is None:
            return
        for pid, epoch in {(b.producer_id, b.producer_epoch) for b in batches if b.is_transactional}:
            if pid in self.by_pid or self._verified_here(pid, epoch, topic, part.partition):
                continue
            rec = await asyncio.to_thread(self.store.transaction, transactional_id)
            if rec is not None and rec.producer_id == pid and epoch < rec.producer_epoch:
                raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH,
                                    f"producer {pid} epoch {epoch} is fenced by epoch {rec.producer_epoch}")
            if (rec is None or rec.producer_id != pid or rec.producer_epoch != epoch
                    or rec.state != TxnState.ONGOING.value or (topic, part.partition) not in rec.partitions):
                raise KafkaApiError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"partition {topic}-{part.partition} was not added to a transaction of producer {pid} "
                    f"epoch {epoch} (AddPartitionsToTxn first)",
                )
            self._verified[(pid, topic, part.partition)] = (epoch, part, time.monotonic() + rec.timeout_ms / 1000)

    def append_marker(
        self, topic: str, part: PartitionLog, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """A marker on a partition this broker leads (the transaction there ends: its verification is dropped)."""
        self._verified.pop((producer_id, topic, part.partition), None)
        return self.logs.append_marker(part, producer_id, producer_epoch, commit, coordinator_epoch)

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="txn-sweeper")

    async def stop(self) -> None:
        tasks = [t for t in (self._sweeper, *self._completions) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.remote_markers is not None:
            self.remote_markers.close()
        self._writer.shutdown(wait=True)

    def allocate_producer_id(self) -> int:
        """The next producer id of the current block; a new block is stored durably before any id is used."""
        if self._next_pid >= self._pid_limit:
            self._next_pid = self.store.allocate_producer_ids(PRODUCER_ID_BLOCK)
            self._pid_limit = self._next_pid + PRODUCER_ID_BLOCK
            fault_point("producer-ids-stored")
        pid = self._next_pid
        self._next_pid += 1
        return pid

    # -- requests ------------------------------------------------------------------------------
    async def init_producer_id(
        self,
        transactional_id: str | None,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
        version: int,
    ) -> tuple[ErrorCode, int, int]:
        """InitProducerId: a fresh id for idempotence, or the transactional id's producer with a new epoch."""
        if not transactional_id:
            return ErrorCode.NONE, self.allocate_producer_id(), 0
        if not self.coordinates(transactional_id):
            return ErrorCode.NOT_COORDINATOR, -1, -1
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = TxnMetadata(transactional_id, self.allocate_producer_id(), 0, timeout_ms)
            self.txns[transactional_id] = self.by_pid[meta.producer_id] = meta
            await self._save(meta)
            return ErrorCode.NONE, meta.producer_id, 0
        async with meta.lock:
            if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
                return _fenced(version, 4), -1, -1
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
            if meta.producer_epoch >= MAX_EPOCH - 1:
                meta.producer_id, meta.producer_epoch = self.allocate_producer_id(), -1
                self.by_pid[meta.producer_id] = meta
            meta.producer_epoch += 1
            meta.timeout_ms = timeout_ms
            if meta.state == TxnState.ONGOING:
                log.info(
                    "transactional id %s re-initialised: aborting its open transaction", transactional_id
                )
                await self._complete(meta, commit=False)
            meta.state = TxnState.EMPTY
            await self._save(meta)
            return ErrorCode.NONE, meta.producer_id, meta.producer_epoch

    async def _save(self, meta: TxnMetadata) -> None:
        """Store a transaction's state durably (fsync) on the writer thread, in the order asked."""
        if self.txns.get(meta.transactional_id) is not meta:  # its shard moved to another broker meanwhile
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR, f"{meta.transactional_id!r} is coordinated elsewhere now")
        record = meta.record()  # the state now, whatever changes while the write is queued
        fence = None if self.shard_lease is None else (
            self.shard_lease, (TXN_SHARDS_ID, coordinator_shard(meta.transactional_id)))
        saved = await asyncio.get_running_loop().run_in_executor(
            self._writer, self.store.save_transaction, record, fence)
        if not saved:  # another broker took the shard (this one was paused, or cut off): it coordinates the id now
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR, f"{meta.transactional_id!r} is coordinated elsewhere now")

    def _check(
        self, transactional_id: str, producer_id: int, producer_epoch: int, version: int, fenced_since: int
    ) -> TxnMetadata:
        if not self.coordinates(transactional_id):
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR, f"{transactional_id!r} is coordinated by another broker")
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise KafkaApiError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"{transactional_id!r} has another producer"
            )
        if producer_epoch < meta.producer_epoch:
            raise KafkaApiError(_fenced(version, fenced_since), f"epoch {producer_epoch} is fenced")
        if producer_epoch > meta.producer_epoch:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH, f"epoch {producer_epoch} is not current")
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is completing")
        return meta

    def _begin(self, meta: TxnMetadata) -> None:
        if meta.state != TxnState.ONGOING:
            meta.state = TxnState.ONGOING
            meta.started = time.monotonic()

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[tuple[str, int]],
        version: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        wanted = list(partitions)
        try:
            meta = self._check(transactional_id, producer_id, producer_epoch, version, 2)
        except KafkaApiError as exc:
            return {tp: exc.code for tp in wanted}
        async with meta.lock:
            unknown = {tp for tp in wanted if not self._exists(tp)}
            if unknown:
                return {
                    tp: (
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        if tp in unknown
                        else ErrorCode.OPERATION_NOT_ATTEMPTED
                    )
                    for tp in wanted
                }
            if not set(wanted) <= meta.partitions or meta.state != TxnState.ONGOING:
                self._begin(meta)
                meta.partitions.update(wanted)
                await self._save(meta)
            return {tp: ErrorCode.NONE for tp in wanted}

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, version: int
    ) -> ErrorCode:
        try:
            meta = self._check(transactional_id, producer_id, producer_epoch, version, 2)
        except KafkaApiError as exc:
            return exc.code
        async with meta.lock:
            if group_id not in meta.groups or meta.state != TxnState.ONGOING:
                self._begin(meta)
                meta.groups.add(group_id)
                await self._save(meta)  # (before the answer: the group's coordinator verifies TxnOffsetCommit by it)
            return ErrorCode.NONE

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, version: int
    ) -> ErrorCode:
        meta = self.txns.get(transactional_id)
        if meta is not None and meta.lock.locked():
            async with meta.lock:  # wait for a completion in flight (e.g. a timeout abort)
                pass
        try:
            meta = self._check(transactional_id, producer_id, producer_epoch, version, 2)
        except KafkaApiError as exc:
            return exc.code
        async with meta.lock:
            if meta.producer_epoch != producer_epoch:
                return _fenced(version, 2)
            if meta.state == TxnState.ONGOING:
                await self._complete(meta, commit)
                return ErrorCode.NONE
            if meta.state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
                return ErrorCode.NONE  # a retry of the EndTxn that completed it
            return ErrorCode.INVALID_TXN_STATE

    # -- completion ----------------------------------------------------------------------------
    async def _complete(self, meta: TxnMetadata, commit: bool) -> None:
        """Prepare -> markers on every partition and group coordinator shard -> Complete (caller holds the lock)."""
        meta.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self._save(meta)
        fault_point("txn-prepared")
        if not armed(MARKERS_LOST_FAULT):
            await self._write_markers(meta, commit)
        meta.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        meta.partitions.clear()
        meta.groups.clear()
        await self._save(meta)
        fault_point("txn-completed")
        log.debug("transaction %s %s", meta.transactional_id, "committed" if commit else "aborted")

    async def _write_markers(self, meta: TxnMetadata, commit: bool) -> None:
        """A marker on every partition of the transaction: through the intake where this broker leads it, else as
        WriteTxnMarkers to its leader; what failed (a leader moving, a broker down) is asked again, with the
        cluster view of then, until every partition has its marker (Kafka's TransactionMarkerChannelManager). A
        group's coordinator shard gets one the same way: its offsets completed here when this broker leads the shard
        too, else by WriteTxnMarkers for (`__consumer_offsets`, shard) to the broker leading it."""
        pending = {tp for tp in meta.marker_targets() if tp[0] == OFFSETS_TOPIC or self._exists(tp)}
        pause, attempts = 0.05, 0
        while pending:
            attempts += 1
            local: list[tuple[tuple[str, int], asyncio.Future[None]]] = []
            remote: dict[int, list[tuple[str, int]]] = {}
            view = self.cluster_view()
            for tp in sorted(pending):
                if tp[0] == OFFSETS_TOPIC:
                    if self.groups.serves_shard(tp[1]):
                        local.append((tp, asyncio.ensure_future(self.groups.txn_offsets.complete(
                            tp[1], meta.producer_id, meta.producer_epoch, commit))))
                    elif view is not None:
                        node = view.leader((GROUP_SHARDS_ID, tp[1]))[0]
                        if node >= 0 and node != view.node_id:  # (this broker's own: it takes it at its heartbeat)
                            remote.setdefault(node, []).append(tp)
                    continue
                state = self.logs.get(tp[0])
                if state is None or tp[1] >= len(state.partitions):
                    pending.discard(tp)  # deleted meanwhile: nothing to mark
                    continue
                part = state.partitions[tp[1]]
                if self.remote_markers is None or part.led:
                    _, part = self.logs.partition(*tp)  # (a broker alone: raises what it raised before)
                    local.append((tp, self.append_marker(tp[0], part, meta.producer_id, meta.producer_epoch, commit)))
                elif view is not None:
                    node = view.leader((part.topic_id, tp[1]))[0]
                    if node >= 0 and node != view.node_id:  # (this broker's own: it takes it at its heartbeat)
                        remote.setdefault(node, []).append(tp)
            failed: dict[tuple[str, int], str] = {}
            for tp, done in local:
                try:
                    await done
                except KafkaApiError as exc:
                    if self.remote_markers is None:
                        raise
                    failed[tp] = exc.code.name
                else:
                    pending.discard(tp)
            if remote:
                assert self.remote_markers is not None
                answers = await asyncio.gather(*(
                    self.remote_markers.write(node, meta.producer_id, meta.producer_epoch, commit, tps)
                    for node, tps in remote.items()))
                for (node, _), codes in zip(remote.items(), answers, strict=True):
                    for tp, code in codes.items():
                        if code == ErrorCode.NONE:
                            pending.discard(tp)
                        elif code == ErrorCode.INVALID_PRODUCER_EPOCH:
                            # The partition has a newer epoch of this producer: this transaction ended there.
                            log.warning("%s-%d has a newer epoch of producer %d than %d: no marker needed",
                                        tp[0], tp[1], meta.producer_id, meta.producer_epoch)
                            pending.discard(tp)
                        else:
                            failed[tp] = f"{_code_name(code)} from broker {node}"
            if not pending:
                break
            if self.txns.get(meta.transactional_id) is not meta:
                raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                    f"{meta.transactional_id!r} is coordinated elsewhere now (its markers too)")
            if attempts in (3, 30) or attempts % 300 == 0:
                log.warning("transaction %s: markers not written yet on %s (%s); retrying", meta.transactional_id,
                            ", ".join(f"{t}-{p}" for t, p in sorted(pending)),
                            "; ".join(f"{t}-{p}: {why}" for (t, p), why in sorted(failed.items())) or "no leader")
            await asyncio.sleep(pause)
            pause = min(pause * 2, MARKER_RETRY_MAX_S)

    def _exists(self, tp: tuple[str, int]) -> bool:
        state = self.logs.get(tp[0])
        return state is not None and 0 <= tp[1] < len(state.partitions)

    def expire_producers(self) -> int:
        """Drop the sequence state of producers idle for a week (kept: those with an open transaction)."""
        dropped = 0
        for topic in self.logs.topics.values():
            for part in topic.partitions:
                dropped += part.producers.expire(PRODUCER_ID_EXPIRATION_S, keep=part.txn_index.open)
        return dropped

    async def _sweep(self) -> None:
        last_expiry = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            if now - last_expiry > EXPIRE_EVERY_S:
                last_expiry = now
                if dropped := self.expire_producers():
                    log.info("forgot the sequence state of %d idle producer(s)", dropped)
            for key, (_, _, until) in list(self._verified.items()):
                if now > until:
                    del self._verified[key]
            for pid, when in list(self._hanging_checked.items()):
                if now - when > HANGING_RECHECK_S:
                    del self._hanging_checked[pid]
            for meta in list(self.txns.values()):
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) and not meta.lock.locked():
                    await meta.lock.acquire()  # a completion that failed (the store, say): again
                    self.spawn(self.finish(meta))
                    continue
                if meta.state != TxnState.ONGOING or now - meta.started <= meta.timeout_ms / 1000:
                    continue
                try:
                    async with meta.lock:
                        if meta.state != TxnState.ONGOING:
                            continue
                        log.info(
                            "transaction %s passed its %d ms timeout: aborting it",
                            meta.transactional_id,
                            meta.timeout_ms,
                        )
                        meta.producer_epoch += 1  # fences the producer that left it open
                        await self._complete(meta, commit=False)
                except KafkaApiError as exc:
                    log.info("aborting timed-out transaction %s: %s", meta.transactional_id, exc.message)
                except Exception:
                    log.exception(
                        "aborting timed-out transaction %s failed; will retry", meta.transactional_id
                    )
            try:
                await self.abort_hanging(self._hanging_due(now))
            except Exception:
                log.exception("aborting hanging transactions failed; will retry")


def meta_of(rec: TransactionRecord, now: float) -> TxnMetadata:
    """A transactional id's state as the store has it (an open transaction's clock starts now)."""
    return TxnMetadata(
        rec.transactional_id, rec.producer_id, rec.producer_epoch, rec.timeout_ms, TxnState(rec.state),
        set(rec.partitions), set(rec.groups), now,
    )


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
