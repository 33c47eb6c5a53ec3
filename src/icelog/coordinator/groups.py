"""The group coordinator: Kafka's classic consumer-group protocol and committed offsets.

States follow Kafka's GroupCoordinator: Empty -> PreparingRebalance -> CompletingRebalance -> Stable.
A rebalance waits until every known member has re-joined (or its rebalance timeout, i.e.
max.poll.interval.ms, passes); members that miss session.timeout.ms are removed by a sweeper.
Committed offsets are written to the metadata store before they are acknowledged; groups with
offsets but no members come back as Empty after a restart. KIP-848 consumer groups (ConsumerGroupHeartbeat) are
`consumer_groups.ConsumerGroups`, sharing this coordinator's groups and offsets.

A broker alone coordinates every group. A broker of a cluster (issue 46) coordinates the groups of the coordinator
shards it leads (`cluster/view.coordinator_shard`, Kafka's __consumer_offsets partitions): the cluster controller
hands it a shard (`take_shard`: the shard's groups come back from the store as Empty groups with their committed
offsets) and takes it away (`drop_shard`: the shard's groups are forgotten, members waiting on a join or a sync are
answered NOT_COORDINATOR, and they rejoin at the shard's new coordinator). The wire answers NOT_COORDINATOR (or
COORDINATOR_LOAD_IN_PROGRESS, while the shard is on its way here) for a group this broker does not serve (`serves`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from icelog.cluster.view import coordinator_shard
from icelog.coordinator.consumer_groups import ConsumerGroups, HeartbeatRequest, HeartbeatResult, TopicView
from icelog.coordinator.consumer_model import ConsumerGroupSettings
from icelog.coordinator.consumer_state import ConsumerStates
from icelog.coordinator.group_model import Group, GroupSettings, GroupState, JoinResult, Member, SyncResult
from icelog.coordinator.txn_offsets import TxnOffsets
from icelog.errors import ErrorCode
from icelog.faults import fault_point
from icelog.meta.store import CommittedOffset, ConsumerOffsets, GroupOffsets

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.25


class ServedShards(Protocol):
    """Which groups a broker of a cluster coordinates (coordinator/group_shards.GroupShards)."""

    def serves(self, group_id: str) -> bool: ...

    def serves_shard(self, shard: int) -> bool: ...


class GroupCoordinator:
    """All consumer groups of this broker (event loop thread only)."""

    def __init__(self, store: ConsumerOffsets, settings: GroupSettings | None = None,
                 consumer_settings: ConsumerGroupSettings | None = None, topics: TopicView | None = None) -> None:
        self.store = store
        self.settings = settings or GroupSettings()
        self.groups: dict[str, Group] = {}
        self.consumer_groups = ConsumerGroups(self.groups, consumer_settings or ConsumerGroupSettings(),
                                              topics or dict)
        self._sweeper: asyncio.Task[None] | None = None
        # The coordinator shards served: None alone (every group), else those the cluster controller handed over.
        self.shards: ServedShards | None = None  # (coordinator/group_shards.GroupShards)
        # Offset commits fsync: one thread keeps them off the event loop and in request order (transactional offsets
        # staged and completed too: coordinator/txn_offsets.py).
        self.commit_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offset-commit")
        self.txn_offsets = TxnOffsets(self)
        # KIP-848 groups' members and assignments, kept in the store.
        self.consumer_states = ConsumerStates(self, self.txn_offsets.fence)

    def load(self) -> None:
        """Bring back the committed offsets of every group (as Empty groups), the transactional ones pending, and
        the KIP-848 groups' members and assignments."""
        for group_id in self.store.offset_groups():
            self.groups[group_id] = Group(group_id, offsets=self.store.committed_offsets(group_id))
        self.txn_offsets.load()
        self.consumer_states.restore(self.store.consumer_group_states())

    async def consumer_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        """ConsumerGroupHeartbeat (consumer_groups.py), answered once what it changed is in the store: a member
        never holds an epoch or an assignment a new coordinator would not load (consumer_state.py)."""
        result = self.consumer_groups.heartbeat(request)
        if not await self.consumer_states.save(request.group_id):
            return HeartbeatResult(ErrorCode.NOT_COORDINATOR, "The coordinator of the group moved.")
        return result

    def serves(self, group_id: str) -> bool:
        """Whether this broker coordinates the group (else the wire refuses it: wire/handlers/groups.not_served):
        every group alone; in a cluster, those of the coordinator shards it leads (coordinator/group_shards.py)."""
        return self.shards is None or self.shards.serves(group_id)

    def serves_shard(self, shard: int) -> bool:
        """Whether this broker coordinates the groups of a coordinator shard (alone: every shard)."""
        return self.shards is None or self.shards.serves_shard(shard)

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="group-sweeper")

    async def stop(self) -> None:
        tasks = [
            t for t in [self._sweeper, *(g.rebalance_task for g in self.groups.values())] if t is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.commit_thread.shutdown(wait=True)

    # -- membership ----------------------------------------------------------------------------
    async def join(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member: bool,
    ) -> JoinResult:
        """JoinGroup: returns when the rebalance this join takes part in completes (or at once on error)."""
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id)
        if not (
            self.settings.min_session_timeout_ms <= session_timeout_ms <= self.settings.max_session_timeout_ms
        ):
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.setdefault(group_id, Group(group_id))
        if group.consumer is not None:
            if group.consumer.members:
                # A KIP-848 group takes no classic member (Kafka's answer for classic protocols a consumer group
                # does not support; icelog does not run Kafka's mixed groups).
                return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
            group.consumer = None  # an empty consumer group (offsets only) becomes a classic one, as in Kafka
            group.protocol_type = None
        if not protocols or (
            group.members
            and (protocol_type != group.protocol_type or not self._common_protocols(group, protocols))
        ):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        rebalance_timeout_ms = session_timeout_ms if rebalance_timeout_ms < 0 else rebalance_timeout_ms
        if not member_id:
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if instance_id is not None and instance_id in group.static_members:
                return await self._rejoin_static(
                    group, instance_id, new_id, session_timeout_ms, rebalance_timeout_ms, protocols
                )
            if require_known_member and instance_id is None:
                group.pending_members[new_id] = time.monotonic() + session_timeout_ms / 1000
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            member_id = new_id
        elif member_id in group.pending_members:
            del group.pending_members[member_id]
        elif member_id not in group.members:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
            )
            group.members[member_id] = member
            if instance_id is not None:
                group.static_members[instance_id] = member_id
            group.protocol_type = protocol_type
            log.info("group %s: member %s joins", group_id, member_id)
            self._prepare_rebalance(group)
        else:
            if instance_id is not None and group.static_members.get(instance_id) != member_id:
                return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
            member.heartbeat()
            changed = member.protocols != protocols
            member.protocols = protocols
            member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
            if (
                group.state in (GroupState.STABLE, GroupState.COMPLETING)
                and not changed
                and (group.state == GroupState.COMPLETING or member_id != group.leader)
            ):
                return self._join_result(group, member)
            if group.state != GroupState.PREPARING:
                self._prepare_rebalance(group)
        return await self._await_join(group, member)

    async def _rejoin_static(
        self,
        group: Group,
        instance_id: str,
        new_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
    ) -> JoinResult:
        """A static member came back with a new member id: it replaces its old self (fencing it)."""
        old_id = group.static_members[instance_id]
        member = group.members.pop(old_id)
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member.join_future = member.sync_future = None
        changed = member.protocols != protocols
        member.member_id, member.protocols = new_id, protocols
        member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        member.heartbeat()
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        log.info("group %s: static member %s rejoins as %s", group.group_id, instance_id, new_id)
        if group.state == GroupState.STABLE and not changed:
            return self._join_result(group, member)
        if group.state != GroupState.PREPARING:
            self._prepare_rebalance(group)
        return await self._await_join(group, member)

    async def _await_join(self, group: Group, member: Member) -> JoinResult:
        if member.join_future is None or member.join_future.done():
            member.join_future = asyncio.get_running_loop().create_future()
        future = member.join_future
        group.changed.set()
        return await asyncio.shield(future)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members = []
        if member.member_id == group.leader:
            members = [
                (m.member_id, m.instance_id, m.metadata(group.protocol_name)) for m in group.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            member.member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader or "",
            members,
        )

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == GroupState.COMPLETING:
            for member in group.members.values():
                member.assignment = b""
                if member.sync_future is not None and not member.sync_future.done():
                    member.sync_future.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        was_empty = group.state == GroupState.EMPTY
        group.state = GroupState.PREPARING
        group.changed.set()
        if group.rebalance_task is None or group.rebalance_task.done():
            group.rebalance_task = asyncio.get_running_loop().create_task(
                self._complete_join(group, was_empty), name=f"rebalance-{group.group_id}"
            )

    async def _complete_join(self, group: Group, was_empty: bool) -> None:
        started = time.monotonic()
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        delay = self.settings.initial_rebalance_delay_ms / 1000
        if was_empty and delay > 0:
            # Kafka's initial delay: let a starting fleet of consumers join one rebalance, not many.
            while True:
                size = len(group.members)
                await asyncio.sleep(min(delay, max(started + timeout - time.monotonic(), 0)))
                timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
                if len(group.members) == size or time.monotonic() >= started + timeout:
                    break
        while group.members and not all(m.awaiting_join for m in group.members.values()):
            timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
            remaining = started + timeout - time.monotonic()
            if remaining <= 0:
                break
            group.changed.clear()
            try:
                await asyncio.wait_for(group.changed.wait(), remaining)
            except TimeoutError:
                break
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info(
                "group %s: member %s did not rejoin in time; removing it", group.group_id, member.member_id
            )
            self._remove_member(group, member.member_id)
        group.generation += 1
        group.rebalance_task = None
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_name = group.leader = None
            group.protocol_type = None
            log.info("group %s is empty (generation %d)", group.group_id, group.generation)
            if (
                not (group.offsets or group.txn_offsets or group.pending_members)
                and self.groups.get(group.group_id) is group
            ):
                del self.groups[group.group_id]  # nothing left to keep: the group is gone (Kafka: Dead)
            return
        group.protocol_name = self._choose_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING
        log.info(
            "group %s: generation %d with %d member(s), protocol %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
        )
        for member in group.members.values():
            if member.join_future is not None and not member.join_future.done():
                member.join_future.set_result(self._join_result(group, member))
            member.join_future = None
            member.heartbeat()

    @staticmethod
    def _common_protocols(group: Group, protocols: list[tuple[str, bytes]]) -> set[str]:
        names = {name for name, _ in protocols}
        for member in group.members.values():
            names &= {name for name, _ in member.protocols}
        return names

    @staticmethod
    def _choose_protocol(group: Group) -> str:
        members = list(group.members.values())
        common = {name for name, _ in members[0].protocols}
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        votes: dict[str, int] = {}
        for member in members:
            choice = next((name for name, _ in member.protocols if name in common), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            return members[0].protocols[0][0]
        return max(votes, key=lambda name: votes[name])

    def _remove_member(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is None:
            return
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member_id:
            del group.static_members[member.instance_id]
        for future in (member.join_future, member.sync_future):
            if future is not None and not future.done():
                future.set_result(
                    JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
                    if future is member.join_future
                    else SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)  # type: ignore[arg-type]
                )
        if group.leader == member_id:
            group.leader = None

    def _member_error(
        self, group: Group | None, member_id: str, instance_id: str | None, generation: int
    ) -> ErrorCode:
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None and group.static_members.get(instance_id) != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        """SyncGroup: the leader's assignments are handed to every member."""
        group = self.groups.get(group_id)
        error = self._member_error(group, member_id, instance_id, generation)
        if error or group is None:
            return SyncResult(error or ErrorCode.UNKNOWN_MEMBER_ID)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[member_id]
        member.heartbeat()
        if group.state == GroupState.PREPARING:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state == GroupState.STABLE:
            return SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name)
        if member.sync_future is None or member.sync_future.done():
            member.sync_future = asyncio.get_running_loop().create_future()
        future = member.sync_future
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = GroupState.STABLE
            for m in group.members.values():
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(
                        SyncResult(ErrorCode.NONE, m.assignment, group.protocol_type, group.protocol_name)
                    )
                m.sync_future = None
                m.heartbeat()
        return await asyncio.shield(future)

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        error = self._member_error(group, member_id, instance_id, generation)
        if error or group is None:
            return error or ErrorCode.UNKNOWN_MEMBER_ID
        group.members[member_id].heartbeat()
        if group.state == GroupState.PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[ErrorCode]:
        """LeaveGroup for (member id, group.instance.id) pairs; one error per pair."""
        group = self.groups.get(group_id)
        errors = []
        left = False
        for member_id, instance_id in members:
            if group is None:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    errors.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = known
            if member_id not in group.members:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            log.info("group %s: member %s leaves", group_id, member_id)
            self._remove_member(group, member_id)
            errors.append(ErrorCode.NONE)
            left = True
        if group is not None and left:
            self._after_removal(group)
        return errors

    def _after_removal(self, group: Group) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING):
            self._prepare_rebalance(group)
        elif group.state == GroupState.PREPARING:
            group.changed.set()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member_id, expiry in list(group.pending_members.items()):
                    if expiry < now:
                        del group.pending_members[member_id]
                expired = [
                    m.member_id
                    for m in group.members.values()
                    if not m.awaiting_join and now - m.last_heartbeat > m.session_timeout_ms / 1000
                ]
                for member_id in expired:
                    log.info("group %s: member %s missed its session timeout", group.group_id, member_id)
                    self._remove_member(group, member_id)
                if expired:
                    self._after_removal(group)
            for group_id in self.consumer_groups.sweep(now):
                self.consumer_states.save_soon(group_id)

    # -- offsets -------------------------------------------------------------------------------
    def check_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None, api_version: int | None = None
    ) -> ErrorCode:
        """Whether an OffsetCommit (at `api_version`) or a TxnOffsetCommit (None) from this member may commit now;
        a KIP-848 member's generation is its member epoch."""
        group = self.groups.get(group_id)
        if group is not None and group.consumer is not None:
            return self.consumer_groups.check_commit(group.consumer, member_id, generation, api_version)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.NONE
        if group is None:
            return ErrorCode.ILLEGAL_GENERATION if generation >= 0 else ErrorCode.UNKNOWN_MEMBER_ID
        error = self._member_error(group, member_id, instance_id, generation)
        if error:
            return error
        if group.state == GroupState.COMPLETING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        group.members[member_id].heartbeat()
        return ErrorCode.NONE

    async def commit(self, group_id: str, offsets: GroupOffsets) -> bool:
        """Make offsets durable in the metadata store (fsync, off the event loop), then visible to OffsetFetch.

        One writer thread: commits reach the store, and then memory, in the order they were asked for. False: this
        broker stopped coordinating the group meanwhile (the client is told NOT_COORDINATOR and commits again at the
        new coordinator). A cluster's commit is fenced by the group shard's lease in the store, so a coordinator
        that lost the shard while cut off stores nothing the new one would not have loaded.
        """
        if not offsets:
            return True
        loop = asyncio.get_running_loop()
        fence = self.txn_offsets.fence(coordinator_shard(group_id))
        stored = await loop.run_in_executor(
            self.commit_thread, self.store.commit_offsets, group_id, dict(offsets), fence)
        fault_point("offsets-stored")
        if not stored or not self.serves(group_id):
            return False
        group = self.groups.setdefault(group_id, Group(group_id))
        group.offsets.update(offsets)
        return True

    def fetch(
        self, group_id: str, partitions: Iterable[tuple[str, int]] | None, require_stable: bool = False
    ) -> dict[tuple[str, int], tuple[CommittedOffset | None, ErrorCode]]:
        """Committed offsets (None where nothing is committed) of some partitions, or all (None)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        wanted = list(offsets) if partitions is None else list(partitions)
        out: dict[tuple[str, int], tuple[CommittedOffset | None, ErrorCode]] = {}
        for tp in wanted:
            if require_stable and group is not None and tp in group.txn_offsets:
                out[tp] = (None, ErrorCode.UNSTABLE_OFFSET_COMMIT)
            else:
                out[tp] = (offsets.get(tp), ErrorCode.NONE)
        return out

    # -- administration ------------------------------------------------------------------------
    def forget_topic(self, topic: str) -> None:
        """A topic was deleted (here, or by another broker of a cluster): drop every group's committed offsets of
        it; the store dropped its rows with the topic."""
        for group in list(self.groups.values()):
            for tp in [tp for tp in group.offsets if tp[0] == topic]:
                del group.offsets[tp]
            for tp in [tp for tp in group.txn_offsets if tp[0] == topic]:
                del group.txn_offsets[tp]

    def describe(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def list_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.state != GroupState.DEAD]

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.has_members or group.state != GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        self.store.delete_offsets(group_id)
        if group.consumer is not None:
            self.store.save_consumer_group_state(group_id, coordinator_shard(group_id), None)
            self.consumer_states.forget(group_id)
        group.state = GroupState.DEAD
        del self.groups[group_id]
        log.info("deleted group %s", group_id)
        return ErrorCode.NONE

    def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete: drop committed offsets of partitions the group no longer subscribes to."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        subscribed = group.subscribed_topics() if group.has_members else set()
        results = {
            tp: (ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed else ErrorCode.NONE)
            for tp in partitions
        }
        gone = [tp for tp, error in results.items() if error == ErrorCode.NONE]
        if gone:
            self.store.delete_offsets(group_id, gone)
            for tp in gone:
                group.offsets.pop(tp, None)
        return ErrorCode.NONE, results
