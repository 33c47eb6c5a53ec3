"""The transaction coordinator: producer ids, transactional ids and their transactions.

A transaction's life: InitProducerId (fences older epochs, aborts what they left open) -> AddPartitionsToTxn /
AddOffsetsToTxn -> produce + TxnOffsetCommit -> EndTxn. EndTxn first records PrepareCommit/PrepareAbort in
the metadata store, then writes a marker (control batch) to every partition through the intake, then
commits the transaction's consumer offsets, then records CompleteCommit/CompleteAbort. A broker restart
finishes any Prepare* state it finds, and aborts open transactions nobody owns. Transactions open longer
than their timeout are aborted with a bumped epoch, so the late producer is fenced.

No transaction can pin a partition's last stable offset: a transactional batch is appended only if its
producer's Ongoing transaction includes the partition (Kafka >= 3.6 verification; else INVALID_TXN_STATE),
and any transaction open in a partition that no Ongoing transaction owns is aborted by the broker (at
start-up at once; while running after its transaction.timeout.ms, or transaction.max.timeout.ms when its
producer is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from icelog.coordinator.groups import GroupCoordinator
from icelog.errors import ErrorCode, KafkaApiError
from icelog.faults import armed, fault_point
from icelog.log.manager import LogManager
from icelog.meta.store import GroupOffsets, TransactionLog, TransactionRecord

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000
MAX_EPOCH = 32767
SWEEP_INTERVAL_S = 0.5
PRODUCER_ID_EXPIRATION_S = 7 * 24 * 3600  # Kafka's transactional.id.expiration.ms default
EXPIRE_EVERY_S = 600
# Test hook (icelog.faults): complete transactions without their markers, as a lost WriteTxnMarkers left Kafka's
# hanging transactions behind; `kafka-transactions find-hanging` and `abort` are then what an operator has.
MARKERS_LOST_FAULT = "txn-markers-lost"


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
    pending_offsets: dict[str, GroupOffsets] = field(default_factory=dict)
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
            {g: dict(o) for g, o in self.pending_offsets.items()},
        )


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
        self._by_pid: dict[int, TxnMetadata] = {}  # producer id -> its transactional id's metadata
        self._next_pid = 0
        self._pid_limit = 0
        self._sweeper: asyncio.Task[None] | None = None
        # Transaction state writes fsync: one thread keeps them off the event loop and in order.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txn-state")
        logs.txn_verifier = self.verify_append

    # -- life cycle ----------------------------------------------------------------------------
    def load(self) -> None:
        for rec in self.store.transactions():
            self.txns[rec.transactional_id] = self._by_pid[rec.producer_id] = TxnMetadata(
                rec.transactional_id,
                rec.producer_id,
                rec.producer_epoch,
                rec.timeout_ms,
                TxnState(rec.state),
                set(rec.partitions),
                {g: dict(o) for g, o in rec.pending_offsets.items()},
                time.monotonic(),
            )

    async def recover(self) -> None:
        """Finish transactions a crash left in Prepare*, abort open transactions without an owner."""
        for meta in self.txns.values():
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("completing transaction %s left in %s", meta.transactional_id, meta.state.value)
                await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
            elif meta.state == TxnState.ONGOING:
                meta.started = time.monotonic()
        # Nobody can ever end these (no Ongoing transaction includes the partition): abort them now.
        await self.abort_hanging(lambda _pid, _opened: True)

    def _owns(self, producer_id: int, tp: tuple[str, int], states: Iterable[TxnState] = _OWNING) -> bool:
        """Whether a transaction of this producer in one of `states` includes the partition."""
        meta = self._by_pid.get(producer_id)
        return (
            meta is not None and meta.producer_id == producer_id and meta.state in states
            and tp in meta.partitions
        )

    async def abort_hanging(self, due: Callable[[int, float], bool]) -> int:
        """Abort (broker-written marker) open partition transactions no Ongoing transaction owns, if `due`.

        `due(producer_id, opened_monotonic)` decides; returns how many were aborted.
        """
        markers = []
        for topic in list(self.logs.topics.values()):
            for part in topic.partitions:
                for pid, opened in list(part.txn_index.opened_at.items()):
                    if self._owns(pid, (topic.name, part.partition)) or not due(pid, opened):
                        continue
                    entry = part.producers.entries.get(pid)
                    meta = self._by_pid.get(pid)
                    epoch = max(entry.epoch if entry is not None else 0, meta.producer_epoch if meta else 0)
                    log.warning(
                        "aborting a hanging transaction of producer %d in %s-%d (no open transaction owns it)",
                        pid,
                        topic.name,
                        part.partition,
                    )
                    markers.append(self.logs.append_marker(part, pid, epoch, commit=False))
        if markers:
            await asyncio.gather(*markers)
        return len(markers)

    def _hanging_due(self, now: float) -> Callable[[int, float], bool]:
        def due(pid: int, opened: float) -> bool:
            meta = self._by_pid.get(pid)
            timeout_ms = meta.timeout_ms if meta is not None else self.max_timeout_ms
            return now - opened > timeout_ms / 1000

        return due

    def verify_append(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> None:
        """Refuse a transactional batch unless the producer's Ongoing transaction includes the partition.

        Raises INVALID_PRODUCER_EPOCH for a fenced epoch, INVALID_TXN_STATE otherwise (Kafka >= 3.6).
        """
        meta = self._by_pid.get(producer_id)
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

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="txn-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
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
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = TxnMetadata(transactional_id, self.allocate_producer_id(), 0, timeout_ms)
            self.txns[transactional_id] = self._by_pid[meta.producer_id] = meta
            await self._save(meta)
            return ErrorCode.NONE, meta.producer_id, 0
        async with meta.lock:
            if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
                return _fenced(version, 4), -1, -1
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
            if meta.producer_epoch >= MAX_EPOCH - 1:
                meta.producer_id, meta.producer_epoch = self.allocate_producer_id(), -1
                self._by_pid[meta.producer_id] = meta
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
        record = meta.record()  # the state now, whatever changes while the write is queued
        await asyncio.get_running_loop().run_in_executor(self._writer, self.store.save_transaction, record)

    def _check(
        self, transactional_id: str, producer_id: int, producer_epoch: int, version: int, fenced_since: int
    ) -> TxnMetadata:
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
            self._begin(meta)
            meta.pending_offsets.setdefault(group_id, {})
            await self._save(meta)
            return ErrorCode.NONE

    async def txn_offset_commit(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        instance_id: str | None,
        offsets: GroupOffsets,
        version: int,
    ) -> ErrorCode:
        """Stage consumer offsets that commit with the transaction."""
        try:
            meta = self._check(transactional_id, producer_id, producer_epoch, version, 3)
        except KafkaApiError as exc:
            return exc.code
        if meta.state != TxnState.ONGOING or group_id not in meta.pending_offsets:
            return ErrorCode.INVALID_TXN_STATE
        if member_id or generation >= 0:
            error = self.groups.check_commit(group_id, generation, member_id, instance_id)
            if error:
                return error
        async with meta.lock:
            meta.pending_offsets[group_id].update(offsets)
            self.groups.stage_txn_offsets(group_id, producer_id, offsets)
            await self._save(meta)
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
        """Prepare -> markers on every partition -> offsets -> Complete (caller holds the lock)."""
        meta.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self._save(meta)
        fault_point("txn-prepared")
        markers = []
        lost = armed(MARKERS_LOST_FAULT)
        for topic, partition in sorted(meta.partitions):
            if self._exists((topic, partition)) and not lost:
                _, part = self.logs.partition(topic, partition)
                markers.append(self.logs.append_marker(part, meta.producer_id, meta.producer_epoch, commit))
        if markers:
            await asyncio.gather(*markers)
        for group_id, offsets in meta.pending_offsets.items():
            await self.groups.end_txn_offsets(group_id, meta.producer_id, offsets if commit else None)
        meta.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        meta.partitions.clear()
        meta.pending_offsets.clear()
        await self._save(meta)
        fault_point("txn-completed")
        log.debug("transaction %s %s", meta.transactional_id, "committed" if commit else "aborted")

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
            for meta in list(self.txns.values()):
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
                except Exception:
                    log.exception(
                        "aborting timed-out transaction %s failed; will retry", meta.transactional_id
                    )
            try:
                await self.abort_hanging(self._hanging_due(now))
            except Exception:
                log.exception("aborting hanging transactions failed; will retry")
