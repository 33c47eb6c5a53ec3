"""How a KIP-848 member moves to its target assignment (Kafka's `CurrentAssignmentBuilder`), one heartbeat at a time.

A partition another member still owns (assigned, or assigned and not yet acknowledged as given up) is never handed
on: the member gets it on a later heartbeat, once its owner has acknowledged the revocation by heartbeating without
it. A member that must give partitions up stays at its epoch until it does; then it moves to the target's epoch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from icelog.coordinator.consumer_model import (
    Assignment,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    TopicPartition,
)


def reconcile(group: ConsumerGroup, member: ConsumerMember, target_epoch: int, target: Assignment,
              reported: Iterable[TopicPartition] | None) -> None:
    """One step of `member` toward `target` (at `target_epoch`); `reported` is what the member says it owns, None
    when its heartbeat left that out (unchanged since the last one)."""
    owned = None if reported is None else set(reported)
    if member.state == MemberState.STABLE:
        if member.member_epoch != target_epoch:
            _next(group, member, member.member_epoch, target_epoch, target, owned)
    elif member.state == MemberState.UNREVOKED_PARTITIONS:
        if not _still_owns(owned, member.pending_revocation):
            _next(group, member, member.member_epoch + 1, target_epoch, target, owned)
    elif member.state == MemberState.UNRELEASED_PARTITIONS:
        _next(group, member, member.member_epoch, target_epoch, target, owned)


def _still_owns(owned: set[TopicPartition] | None, partitions: Assignment) -> bool:
    """Whether the member may still hold some of `partitions` (it did not say what it owns: assume it does)."""
    if owned is None:
        return True
    return any((topic_id, p) in owned for topic_id, parts in partitions.items() for p in parts)


def _next(group: ConsumerGroup, member: ConsumerMember, member_epoch: int, target_epoch: int, target: Assignment,
          owned: set[TopicPartition] | None) -> None:
    assigned: dict[uuid.UUID, set[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    adding: dict[uuid.UUID, set[int]] = {}
    unreleased = False
    for topic_id in set(target) | set(member.assigned):
        wanted = target.get(topic_id, frozenset())
        current = member.assigned.get(topic_id, frozenset())
        kept = current & wanted
        if kept:
            assigned[topic_id] = set(kept)
        if current - kept:
            revoking[topic_id] = current - kept
        new = set()
        for partition in sorted(wanted - kept):
            holder = group.owner((topic_id, partition))
            if holder is None or holder == member.member_id:
                new.add(partition)
            else:
                unreleased = True
        if new:
            adding[topic_id] = new
    previous = member.member_epoch
    if revoking and _still_owns(owned, revoking):
        # Give up first, at the same epoch; the partitions it keeps stay, nothing new is added yet.
        member.state = MemberState.UNREVOKED_PARTITIONS
        member.previous_member_epoch, member.member_epoch = previous, member_epoch
        group.set_assignment(member, assigned, revoking)
        return
    for topic_id, partitions in adding.items():
        assigned.setdefault(topic_id, set()).update(partitions)
    member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    member.previous_member_epoch, member.member_epoch = previous, target_epoch
    group.set_assignment(member, assigned, {})
