"""Server-side assignors of KIP-848 consumer groups (Kafka's `group.consumer.assignors`: `uniform` and `range`).

An assignor computes the group's *target* assignment from the members' subscriptions, the subscribed topics and the
previous target; it never worries about who still owns what: reconciliation (`coordinator/reconciliation.py`) moves
members to the target one revocation at a time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from icelog.coordinator.consumer_model import Assignment, TopicMetadata, TopicPartition, as_assignment, partitions_of


@dataclass(frozen=True)
class MemberSubscription:
    """What an assignor knows of a member: the topics it subscribes to (by id) and its instance id."""

    topics: frozenset[uuid.UUID]
    instance_id: str | None = None


Assignor = Callable[[Mapping[str, MemberSubscription], Mapping[uuid.UUID, TopicMetadata], Mapping[str, Assignment]],
                    dict[str, Assignment]]


def uniform(members: Mapping[str, MemberSubscription], topics: Mapping[uuid.UUID, TopicMetadata],
            previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Kafka's UniformAssignor: every subscribed partition to one of its subscribers, the members' counts within one
    of each other where their subscriptions allow, and as few partitions moved from the previous target as that
    takes (a member joining takes its share from the busiest members; the rest stay where they are)."""
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member_id, assignment in sorted(previous.items()):
        if member_id not in members:
            continue
        for tp in sorted(partitions_of(assignment)):
            topic = topics.get(tp[0])
            if topic is None or tp[1] >= topic.partitions or tp[0] not in members[member_id].topics or tp in taken:
                continue
            owned[member_id].add(tp)
            taken.add(tp)
    subscribers = {topic_id: sorted(m for m, sub in members.items() if topic_id in sub.topics) for topic_id in topics}
    every = [(t.topic_id, p) for t in sorted(topics.values(), key=lambda t: t.name) for p in range(t.partitions)]
    for tp in every:
        if tp in taken or not subscribers[tp[0]]:
            continue
        least = min(subscribers[tp[0]], key=lambda m: (len(owned[m]), m))
        owned[least].add(tp)
        taken.add(tp)
    _balance(owned, subscribers)
    return {member_id: as_assignment(parts) for member_id, parts in owned.items()}


def _balance(owned: dict[str, set[TopicPartition]], subscribers: Mapping[uuid.UUID, list[str]]) -> None:
    """Move partitions from a member to a subscriber of theirs with at least two fewer, until none can move.

    Each move lowers the sum of the squared counts, so this ends; a member gives up its highest partitions first."""
    moved = True
    while moved:
        moved = False
        for member_id in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[member_id], reverse=True):
                least = min(subscribers[tp[0]], key=lambda m: (len(owned[m]), m))
                if len(owned[least]) < len(owned[member_id]) - 1:
                    owned[member_id].remove(tp)
                    owned[least].add(tp)
                    moved = True
                    break
            if moved:
                break


def range_(members: Mapping[str, MemberSubscription], topics: Mapping[uuid.UUID, TopicMetadata],
           previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Kafka's RangeAssignor, server side: each topic's partitions cut into contiguous ranges, one per subscriber in
    order (of instance id, else member id), the first `partitions % subscribers` ranges one longer, so that members
    subscribed to co-partitioned topics get the same partition numbers of each."""
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for topic in topics.values():
        subscribed = sorted((m for m, sub in members.items() if topic.topic_id in sub.topics),
                            key=lambda m: (members[m].instance_id or m, m))
        if not subscribed:
            continue
        per_member, extra = divmod(topic.partitions, len(subscribed))
        start = 0
        for i, member_id in enumerate(subscribed):
            count = per_member + (1 if i < extra else 0)
            owned[member_id].update((topic.topic_id, p) for p in range(start, start + count))
            start += count
    return {member_id: as_assignment(parts) for member_id, parts in owned.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
