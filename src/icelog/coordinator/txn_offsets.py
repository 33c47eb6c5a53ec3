"""The group coordinator's part of transactions (issue 46): a TxnOffsetCommit's offsets wait, pending, until their
transaction ends, as Kafka's GroupMetadataManager keeps pending transactional offsets per producer id.

TxnOffsetCommit goes to the group's coordinator (the broker leading the group's coordinator shard), which checks the
member and generation as for OffsetCommit, then stages the offsets in the metadata store for (group, producer id,
epoch) in the same store transaction that checks the transactional id's stored transaction admits them: its
producer id and epoch, Ongoing, with the group added by AddOffsetsToTxn (Kafka's KIP-890 verification of the
group's __consumer_offsets partition; a zombie's old epoch is answered INVALID_PRODUCER_EPOCH, as Kafka's
verification converts PRODUCER_FENCED). OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for those
partitions until then.

The transaction coordinator ends them with a marker for the group's shard (`complete`): locally when it leads that
shard too, else as WriteTxnMarkers for partition `shard` of `__consumer_offsets` to the broker leading it (Kafka's
markers to the group coordinator's __consumer_offsets partition, then `handleTxnCompletion`). The store turns the
producer's pending offsets in the shard's groups into committed offsets (commit) or drops them (abort), only while
it has that transaction in Prepare* with the marker's epoch and result: a repeated, late or stale marker changes
nothing. In a cluster both writes are fenced by the group shard's lease, so a coordinator that lost the shard writes
nothing and the one that took it has loaded every staged offset (`load`).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from icelog.cluster.view import GROUP_SHARDS_ID, coordinator_shard
from icelog.coordinator.group_model import Group
from icelog.errors import ErrorCode, KafkaApiError
from icelog.meta.store import (
    BrokerLease,
    ConsumerOffsets,
    GroupOffsets,
    ShardFence,
    TransactionRecord,
    TxnOffsetStage,
)

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"  # how WriteTxnMarkers names a group coordinator shard: partition = shard


class OffsetsCoordinator(Protocol):
    """What of the group coordinator (coordinator/groups.GroupCoordinator) the transactional offsets use."""

    store: ConsumerOffsets
    groups: dict[str, Group]
    commit_thread: ThreadPoolExecutor

    def serves(self, group_id: str) -> bool: ...

    def serves_shard(self, shard: int) -> bool: ...

    def check_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None, api_version: int | None = None
    ) -> ErrorCode: ...


class TxnOffsets:
    """Pending transactional offsets of the groups `coordinator` serves (event loop thread only)."""

    def __init__(self, coordinator: OffsetsCoordinator) -> None:
        self.coordinator = coordinator
        self.lease: BrokerLease | None = None  # a cluster's broker: its writes are fenced by the group shard's lease

    def fence(self, shard: int) -> ShardFence | None:
        """What a write of the shard's offsets is fenced by (None: a broker alone)."""
        return None if self.lease is None else (self.lease, (GROUP_SHARDS_ID, shard))

    def load(self) -> None:
        """Bring back every group's partitions with offsets pending (a broker alone, before it serves; a cluster's
        broker loads them per shard taken: group_shards.py)."""
        for group_id, pending in self.coordinator.store.pending_txn_offsets().items():
            self.coordinator.groups.setdefault(group_id, Group(group_id)).txn_offsets.update(pending)

    async def commit(
        self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int, generation: int,
        member_id: str, instance_id: str | None, offsets: GroupOffsets,
    ) -> ErrorCode:
        """TxnOffsetCommit: the offsets wait for the transaction's end, durably (the caller checked `serves`)."""
        groups = self.coordinator
        if member_id or generation >= 0:
            error = groups.check_commit(group_id, generation, member_id, instance_id)
            if error:
                return error
        stage = await asyncio.get_running_loop().run_in_executor(
            groups.commit_thread, lambda: groups.store.stage_txn_offsets(
                transactional_id, group_id, producer_id, producer_epoch, offsets,
                self.fence(coordinator_shard(group_id))))
        if not stage.coordinated or not groups.serves(group_id):
            return ErrorCode.NOT_COORDINATOR  # (the shard moved: its new coordinator loaded what was staged)
        if not stage.staged:
            return _refusal(stage, producer_id, producer_epoch)
        group = groups.groups.setdefault(group_id, Group(group_id))
        for tp in offsets:
            group.txn_offsets[tp] = producer_id
        return ErrorCode.NONE

    async def complete(self, shard: int, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """A transaction marker for the groups of `shard`: the producer's pending offsets there are committed or
        dropped. Raises NOT_LEADER_OR_FOLLOWER when this broker does not coordinate the shard (the sender retries
        where it moved), as Kafka's WriteTxnMarkers answers for a __consumer_offsets partition led elsewhere."""
        groups = self.coordinator
        if not groups.serves_shard(shard):
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"group coordinator shard {shard} is led elsewhere")
        waiting = [g.group_id for g in groups.groups.values()
                   if coordinator_shard(g.group_id) == shard and producer_id in g.txn_offsets.values()]

        def in_shard(group_id: str) -> bool:
            return coordinator_shard(group_id) == shard

        def work() -> dict[str, tuple[GroupOffsets, dict[tuple[str, int], int]]] | None:
            store = groups.store
            done = store.complete_txn_offsets(producer_id, producer_epoch, commit, in_shard, self.fence(shard))
            if done is None:
                return None
            # The touched groups as the store has them now (read on the commit thread: every commit and stage asked
            # before is in), so that a repeated marker (its first answer lost) or a stale one leaves memory true.
            pending = store.pending_txn_offsets()
            return {g: (store.committed_offsets(g), pending.get(g, {})) for g in {*done, *waiting}}

        now = await asyncio.get_running_loop().run_in_executor(groups.commit_thread, work)
        if now is None or not groups.serves_shard(shard):
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"group coordinator shard {shard} moved")
        for group_id, (offsets, pending) in now.items():
            group = groups.groups.setdefault(group_id, Group(group_id))
            group.offsets, group.txn_offsets = offsets, pending
        log.debug("transactional offsets of producer %d %s in %d group(s) of shard %d", producer_id,
                  "committed" if commit else "dropped", len(now), shard)


def _refusal(stage: TxnOffsetStage, producer_id: int, producer_epoch: int) -> ErrorCode:
    """Why the store did not stage: Kafka's answers to a TxnOffsetCommit its verification refuses."""
    record: TransactionRecord | None = stage.transaction
    if record is None or record.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != record.producer_epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH  # (fenced, or not yet current: Kafka answers both so)
    if record.state in ("PrepareCommit", "PrepareAbort"):
        return ErrorCode.CONCURRENT_TRANSACTIONS
    return ErrorCode.INVALID_TXN_STATE  # no transaction open, or the group was not added (AddOffsetsToTxn first)
