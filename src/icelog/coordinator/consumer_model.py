"""The state of KIP-848 consumer groups: members with their epochs and assignments, the group's target assignment.

Names follow Kafka's group coordinator (`ConsumerGroup`, `ConsumerGroupMember`, `MemberState`), so that a reader of
Kafka's code finds the same things here. A partition is named by its topic's id, as the protocol names it.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from icelog.log.topic_logs import TopicState

TopicPartition = tuple[uuid.UUID, int]
Assignment = dict[uuid.UUID, frozenset[int]]  # topic id -> partitions (no empty sets)

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class ConsumerGroupState(StrEnum):
    """Kafka's ConsumerGroup.ConsumerGroupState, as DescribeGroups and ListGroups spell it."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"  # the group epoch moved and the target assignment is not computed yet
    RECONCILING = "Reconciling"  # some member has not reached the target assignment
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(StrEnum):
    """Where a member is on its way to its target assignment (Kafka's MemberState)."""

    STABLE = "stable"  # it has its target assignment, at the target's epoch
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # it must give partitions up (and say so) before it moves on
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # it waits for partitions other members still own


@dataclass(frozen=True)
class ConsumerGroupSettings:
    """Kafka's group.consumer.* broker settings."""

    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    # While a member moves (it joined, its assignment changed, it must give up or wait for partitions) it is asked
    # to heartbeat this much more often, for one full interval: see ConsumerGroups.interval_ms.
    settling_speedup: int = 10
    settling_floor_ms: int = 50
    assignors: tuple[str, ...] = ("uniform", "range")  # the first is the default (group.consumer.assignors)


@dataclass(frozen=True)
class TopicMetadata:
    """What the assignors know of a topic: its id, name and partition count."""

    topic_id: uuid.UUID
    name: str
    partitions: int


class TopicsView(Mapping[str, TopicMetadata]):
    """The broker's topics as the assignors see them, read through (a look-up by name costs one dict look-up; only
    a regex walks them all)."""

    def __init__(self, topics: Mapping[str, TopicState]) -> None:
        self._topics = topics

    def __getitem__(self, name: str) -> TopicMetadata:
        state = self._topics[name]
        return TopicMetadata(state.record.topic_id, name, len(state.partitions))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._topics))

    def __len__(self) -> int:
        return len(self._topics)


@dataclass
class ConsumerMember:
    """One member of a consumer group."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    server_assignor: str | None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)  # what it may consume now
    pending_revocation: Assignment = field(default_factory=dict)  # what it must give up before it moves on
    last_heartbeat: float = field(default_factory=time.monotonic)
    revocation_deadline: float | None = None  # monotonic time by which its revocation must be acknowledged
    settling_until: float = 0.0  # monotonic time until which it heartbeats at the short interval (joined, moved)

    def heartbeat(self) -> None:
        self.last_heartbeat = time.monotonic()

    def owned(self) -> Iterable[TopicPartition]:
        """Every partition no other member may be given yet: assigned, or assigned and not yet given up."""
        for assignment in (self.assigned, self.pending_revocation):
            for topic_id, partitions in assignment.items():
                for partition in partitions:
                    yield topic_id, partition


@dataclass
class ConsumerGroup:
    """The KIP-848 part of a group: epochs, members and the target assignment (offsets stay on `Group`)."""

    group_epoch: int = 0
    assignment_epoch: int = 0  # the group epoch the target assignment was computed at
    assignor: str | None = None  # the assignor the last target assignment used
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Assignment] = field(default_factory=dict)  # member id -> its target assignment
    owners: dict[TopicPartition, str] = field(default_factory=dict)  # partition -> the member that still owns it
    subscription: dict[str, TopicMetadata] = field(default_factory=dict)  # topics subscribed when last assigned
    patterns: dict[str, re.Pattern[str] | None] = field(default_factory=dict)  # compiled regexes (None: invalid)

    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE
               for m in self.members.values() if m.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def set_assignment(self, member: ConsumerMember, assigned: Mapping[uuid.UUID, Iterable[int]],
                       pending_revocation: Mapping[uuid.UUID, Iterable[int]]) -> None:
        """Change what a member owns, keeping `owners` (which partitions are free to give away) in step."""
        for tp in member.owned():
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]
        member.assigned, member.pending_revocation = _clean(assigned), _clean(pending_revocation)
        for tp in member.owned():
            self.owners[tp] = member.member_id

    def owner(self, tp: TopicPartition) -> str | None:
        return self.owners.get(tp)


def _clean(assignment: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    return {topic_id: frozenset(parts) for topic_id, parts in assignment.items() if parts}


def partitions_of(assignment: Assignment) -> set[TopicPartition]:
    return {(topic_id, p) for topic_id, parts in assignment.items() for p in parts}


def as_assignment(partitions: Iterable[TopicPartition]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for topic_id, partition in partitions:
        out.setdefault(topic_id, set()).add(partition)
    return _clean(out)
