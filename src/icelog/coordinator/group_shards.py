"""The coordinator shards of consumer groups a broker of a cluster serves (issue 46): a group belongs to shard
abs(hashCode(group id)) % 50, as in Kafka's __consumer_offsets, and the broker leading a shard (cluster/controller.py)
coordinates its groups. Taking a shard brings back its groups' committed offsets from the store, as Empty groups,
and their transactional offsets pending (coordinator/txn_offsets.py: staged and completed under the shard's lease);
dropping it forgets them (their offsets stay in the store), answering members waiting on a join or a sync
NOT_COORDINATOR so they find the new coordinator."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from icelog.cluster.view import coordinator_shard
from icelog.coordinator.group_model import Group, JoinResult, SyncResult
from icelog.errors import ErrorCode
from icelog.faults import hold_point
from icelog.meta.store import BrokerLease, GroupOffsets

if TYPE_CHECKING:
    from icelog.coordinator.groups import GroupCoordinator

log = logging.getLogger(__name__)


class GroupShards:
    """(cluster.controller.ShardOwner) The shards whose groups `coordinator` serves; set as its `shards`."""

    def __init__(self, coordinator: GroupCoordinator, lease: BrokerLease | None = None) -> None:
        self.coordinator = coordinator
        self.served: set[int] = set()
        coordinator.txn_offsets.lease = lease  # (transactional offsets are staged and completed under the lease)

    def serves(self, group_id: str) -> bool:
        return coordinator_shard(group_id) in self.served

    def serves_shard(self, shard: int) -> bool:
        return shard in self.served

    async def take_shard(self, shard: int) -> None:
        """Bring back the committed offsets of the shard's groups, as Empty groups, then serve them.

        On the commit thread: a commit of this broker still in flight reaches the store before the shard is read."""
        groups = self.coordinator.groups
        loaded, pending, states = await asyncio.get_running_loop().run_in_executor(
            self.coordinator.commit_thread, self._read, shard)
        for group_id in [g for g in groups if coordinator_shard(g) == shard]:
            self._forget(group_id)  # (none: a shard not served has no groups here)
        for group_id, offsets in loaded.items():
            groups[group_id] = Group(group_id, offsets=offsets)
        for group_id, tps in pending.items():  # transactional offsets waiting for their transaction's marker
            groups.setdefault(group_id, Group(group_id)).txn_offsets.update(tps)
        self.coordinator.consumer_states.restore(states)  # KIP-848 groups go on with their members and epochs
        self.served.add(shard)
        log.info("coordinating the groups of shard %d (%d with committed offsets, %d with transactional offsets "
                 "pending, %d consumer groups with members)", shard, len(loaded), len(pending), len(states))

    def _read(self, shard: int) -> tuple[dict[str, GroupOffsets], dict[str, dict[tuple[str, int], int]],
                                         dict[str, str]]:
        hold_point("group-shard-held", Path(tempfile.gettempdir()) / "icelog-group-shard-held.release")
        store = self.coordinator.store
        committed = {group_id: store.committed_offsets(group_id) for group_id in store.offset_groups()
                     if coordinator_shard(group_id) == shard}
        pending = {group_id: tps for group_id, tps in store.pending_txn_offsets().items()
                   if coordinator_shard(group_id) == shard}
        return committed, pending, store.consumer_group_states(shard)

    def drop_shard(self, shard: int) -> None:
        """Another broker coordinates the shard's groups now: forget them (their offsets are in the store)."""
        self.served.discard(shard)
        gone = [group_id for group_id in self.coordinator.groups if coordinator_shard(group_id) == shard]
        for group_id in gone:
            self._forget(group_id)
        if gone:
            log.info("no longer coordinating the groups of shard %d (%d group(s))", shard, len(gone))

    def _forget(self, group_id: str) -> None:
        self.coordinator.consumer_states.forget(group_id)
        group = self.coordinator.groups.pop(group_id, None)
        if group is None:
            return
        if group.rebalance_task is not None:
            group.rebalance_task.cancel()
            group.rebalance_task = None
        for member in group.members.values():
            if member.join_future is not None and not member.join_future.done():
                member.join_future.set_result(JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result(SyncResult(ErrorCode.NOT_COORDINATOR))
            member.join_future = member.sync_future = None
