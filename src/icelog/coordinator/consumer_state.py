"""KIP-848 consumer groups' state in the metadata store (issue 46): members, epochs, target and current assignments,
as Kafka's coordinator keeps them in __consumer_offsets (ConsumerGroupMemberMetadata, TargetAssignment and
CurrentAssignment records), so that when a group's coordinator shard moves, or a broker alone restarts, the next
coordinator goes on where the last one stopped: members heartbeat on at their epochs, with their partitions, instead
of being answered UNKNOWN_MEMBER_ID, losing their partitions and rejoining while others are handed them.

A heartbeat, a leave or a session timeout that changed a group's state is written (under the group shard's lease, on
the coordinator's commit thread, in request order) before the member is answered: a member never holds an epoch or an
assignment the store does not. Liveness (the last heartbeat, the revocation deadline) is not kept: a coordinator that
takes a group over starts every member's session timeout afresh, as Kafka's does on loading its partition.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from icelog.cluster.view import coordinator_shard
from icelog.coordinator.consumer_model import (
    Assignment,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    TopicMetadata,
)
from icelog.coordinator.group_model import Group
from icelog.meta.store import ConsumerOffsets, ShardFence

log = logging.getLogger(__name__)

FORMAT = 1  # the version of the JSON below; a reader refuses (and logs) a format it does not know


def encode(consumer: ConsumerGroup) -> str:
    """The durable part of a group's KIP-848 state, as JSON (deterministic: equal states give equal strings)."""
    return json.dumps({
        "format": FORMAT,
        "group_epoch": consumer.group_epoch,
        "assignment_epoch": consumer.assignment_epoch,
        "assignor": consumer.assignor,
        "members": [_member(m) for m in consumer.members.values()],
        "target": {member_id: _assignment(a) for member_id, a in sorted(consumer.target.items())},
        "subscription": {name: [str(meta.topic_id), meta.partitions]
                         for name, meta in sorted(consumer.subscription.items())},
    }, separators=(",", ":"))


def decode(state: str, now: float | None = None) -> ConsumerGroup:
    """A group's KIP-848 state from `encode`'s JSON; every member's session starts at `now` (monotonic)."""
    data = json.loads(state)
    if data.get("format") != FORMAT:
        raise ValueError(f"consumer group state of format {data.get('format')!r}, this icelog reads {FORMAT}")
    now = time.monotonic() if now is None else now
    consumer = ConsumerGroup(group_epoch=data["group_epoch"], assignment_epoch=data["assignment_epoch"],
                             assignor=data["assignor"])
    consumer.subscription = {name: TopicMetadata(uuid.UUID(topic_id), name, partitions)
                             for name, (topic_id, partitions) in data["subscription"].items()}
    consumer.target = {member_id: _parse(a) for member_id, a in data["target"].items()}
    for fields in data["members"]:
        member = ConsumerMember(
            fields["member_id"], fields["instance_id"], fields["rack_id"], fields["client_id"],
            fields["client_host"], fields["rebalance_timeout_ms"], fields["subscribed_topic_names"],
            fields["subscribed_topic_regex"], fields["server_assignor"], member_epoch=fields["member_epoch"],
            previous_member_epoch=fields["previous_member_epoch"], state=MemberState(fields["state"]),
            last_heartbeat=now,
        )
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
        consumer.members[member.member_id] = member
        consumer.set_assignment(member, _parse(fields["assigned"]), _parse(fields["pending_revocation"]))
        if member.instance_id is not None:
            consumer.static_members[member.instance_id] = member.member_id
    return consumer


def _member(m: ConsumerMember) -> dict[str, Any]:
    return {
        "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id, "client_id": m.client_id,
        "client_host": m.client_host, "rebalance_timeout_ms": m.rebalance_timeout_ms,
        "subscribed_topic_names": m.subscribed_topic_names, "subscribed_topic_regex": m.subscribed_topic_regex,
        "server_assignor": m.server_assignor, "member_epoch": m.member_epoch,
        "previous_member_epoch": m.previous_member_epoch, "state": m.state.value,
        "assigned": _assignment(m.assigned), "pending_revocation": _assignment(m.pending_revocation),
    }


def _assignment(assignment: Assignment) -> dict[str, list[int]]:
    return {str(topic_id): sorted(parts) for topic_id, parts in sorted(assignment.items(), key=lambda kv: str(kv[0]))}


def _parse(assignment: dict[str, list[int]]) -> Assignment:
    return {uuid.UUID(topic_id): frozenset(parts) for topic_id, parts in assignment.items() if parts}


class StatesCoordinator(Protocol):
    """What of the group coordinator (coordinator/groups.GroupCoordinator) the stored states use."""

    store: ConsumerOffsets
    groups: dict[str, Group]
    commit_thread: ThreadPoolExecutor

    def serves(self, group_id: str) -> bool: ...


class ConsumerStates:
    """Writes and reads of the KIP-848 groups' state for `coordinator` (event loop thread only); `fence` gives what a
    write of a shard's groups is fenced by (txn_offsets.TxnOffsets.fence: None for a broker alone)."""

    def __init__(self, coordinator: StatesCoordinator, fence: Callable[[int], ShardFence | None]) -> None:
        self.coordinator = coordinator
        self.fence = fence
        self._written: dict[str, str | None] = {}  # group id -> the state last handed to the store

    async def save(self, group_id: str) -> bool:
        """Write the group's state if it changed since the last write (None: the group is gone), and wait for it.
        False: this broker no longer holds the group's shard (nothing was written: the member is told
        NOT_COORDINATOR and finds the new coordinator)."""
        coordinator = self.coordinator
        group = coordinator.groups.get(group_id)
        state = encode(group.consumer) if group is not None and group.consumer is not None else None
        if self._written.get(group_id) == state:
            return True
        self._written[group_id] = state
        shard = coordinator_shard(group_id)
        try:
            stored = await asyncio.get_running_loop().run_in_executor(
                coordinator.commit_thread, coordinator.store.save_consumer_group_state, group_id, shard, state,
                self.fence(shard))
        except BaseException:
            self._written.pop(group_id, None)  # (unknown whether it landed: the next change writes again)
            raise
        if state is None:
            self._written.pop(group_id, None)
        return stored and coordinator.serves(group_id)

    def save_soon(self, group_id: str) -> None:
        """`save` without waiting for it (a member swept out: nobody is answered about it)."""
        task = asyncio.get_running_loop().create_task(self.save(group_id), name=f"consumer-state-{group_id}")
        task.add_done_callback(_log_failure)

    def restore(self, states: dict[str, str]) -> None:
        """Bring back stored KIP-848 groups (a shard taken, or a broker alone starting) into the coordinator."""
        groups = self.coordinator.groups
        for group_id, state in states.items():
            try:
                consumer = decode(state)
            except (ValueError, KeyError, TypeError) as e:
                log.error("group %s: stored consumer group state not readable (%s): its members rejoin", group_id, e)
                continue
            group = groups.setdefault(group_id, Group(group_id))
            group.consumer, group.protocol_type = consumer, "consumer"
            self._written[group_id] = state

    def forget(self, group_id: str) -> None:
        self._written.pop(group_id, None)


def _log_failure(task: asyncio.Task[bool]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a consumer group's state was not stored: %s (the next change stores it)", task.exception())
