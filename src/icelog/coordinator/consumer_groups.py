"""KIP-848 consumer groups: ConsumerGroupHeartbeat as Kafka 4's group coordinator serves it.

Every heartbeat: the member is found or created (static members by instance id), its epoch checked (a zombie gets
FENCED_MEMBER_EPOCH), its subscription updated; a change of membership, of a subscription or of the subscribed
topics (a topic created that a regex matches, partitions added) bumps the group epoch and the server-side assignor
computes a new target assignment; the member then moves one step toward its target (`reconciliation.py`). A sweeper
removes members that miss the session timeout or do not give up partitions within their rebalance timeout.

The state lives in memory and, once a heartbeat changed it, in the metadata store before the member is answered
(`consumer_state.py`), so a restarted broker or a group's next coordinator goes on with the same members, epochs and
assignments; committed offsets are the classic groups' (`Group.offsets`). A member a coordinator does not know (its
group's state was never stored) is answered UNKNOWN_MEMBER_ID and rejoins.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from icelog.coordinator.assignors import ASSIGNORS, MemberSubscription
from icelog.coordinator.consumer_model import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    Assignment,
    ConsumerGroup,
    ConsumerGroupSettings,
    ConsumerMember,
    MemberState,
    TopicMetadata,
    TopicPartition,
)
from icelog.coordinator.group_model import Group, GroupState
from icelog.coordinator.reconciliation import reconcile
from icelog.errors import ErrorCode

log = logging.getLogger(__name__)

TopicView = Callable[[], Mapping[str, TopicMetadata]]  # every topic of the broker by name


@dataclass(frozen=True)
class HeartbeatRequest:
    """The fields of a ConsumerGroupHeartbeat (None: unchanged since the member's last heartbeat)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: list[TopicPartition] | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@dataclass
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    assignment: Assignment | None = None  # None: not sent (unchanged)
    interval_ms: int = 0  # the heartbeat interval to ask of the member


class _Refused(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error, self.message = error, message


class ConsumerGroups:
    """The KIP-848 side of the group coordinator (event loop thread only); groups are shared with the classic side."""

    def __init__(self, groups: dict[str, Group], settings: ConsumerGroupSettings, topics: TopicView) -> None:
        self.groups = groups
        self.settings = settings
        self.topics = topics

    # -- heartbeat ------------------------------------------------------------------------------------------------
    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        """ConsumerGroupHeartbeat: join (epoch 0), stay, or leave (-1; -2 for a static member that will return)."""
        try:
            self._validate(request)
            if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return self._leave(request)
            return self._heartbeat(request)
        except _Refused as refused:
            return HeartbeatResult(refused.error, refused.message)

    def _validate(self, request: HeartbeatRequest) -> None:
        invalid = ErrorCode.INVALID_REQUEST
        if not request.group_id:
            raise _Refused(invalid, "GroupId can't be empty.")
        if request.instance_id == "":
            raise _Refused(invalid, "InstanceId can't be empty.")
        if request.rack_id == "":
            raise _Refused(invalid, "RackId can't be empty.")
        epoch = request.member_epoch
        if (request.api_version >= 1 or epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH) and not request.member_id:
            raise _Refused(invalid, "MemberId can't be empty.")  # v1: the consumer makes up its id (KIP-1082)
        if epoch == 0:
            if request.rebalance_timeout_ms == -1:
                raise _Refused(invalid, "RebalanceTimeoutMs must be provided in first request.")
            if request.owned is None or request.owned:
                raise _Refused(invalid, "TopicPartitions must be empty when (re-)joining.")
            if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
                raise _Refused(invalid, "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                                        "(re-)joining.")
        elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if request.instance_id is None:
                raise _Refused(invalid, "InstanceId can't be null.")
        elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise _Refused(invalid, f"MemberEpoch is {epoch}, but must be greater than or equal to -2.")
        if request.server_assignor is not None and request.server_assignor not in self.settings.assignors:
            raise _Refused(ErrorCode.UNSUPPORTED_ASSIGNOR,
                           f"ServerAssignor {request.server_assignor} is not supported. Supported assignors: "
                           f"{', '.join(self.settings.assignors)}.")
        if request.subscribed_topic_regex is not None and _compile(request.subscribed_topic_regex) is None:
            raise _Refused(ErrorCode.INVALID_REGULAR_EXPRESSION,
                           f"SubscribedTopicRegex `{request.subscribed_topic_regex}` is not a valid regular "
                           "expression.")

    def _group(self, group_id: str, create: bool) -> tuple[Group, ConsumerGroup]:
        group = self.groups.get(group_id)
        if group is not None and group.consumer is not None:
            return group, group.consumer
        if group is not None and (group.members or group.state != GroupState.EMPTY or group.rebalance_task):
            # Kafka with group.consumer.migration.policy=disabled: no online upgrade of a live classic group.
            raise _Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
        if not create:
            # Unknown here (a restart forgets members, not offsets): the member rejoins with epoch 0.
            raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Consumer group {group_id} has no such member.")
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        group.consumer = ConsumerGroup()
        group.protocol_type = "consumer"
        return group, group.consumer

    def _heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        group, consumer = self._group(request.group_id, create=request.member_epoch == 0)
        member_id = request.member_id or str(uuid.uuid4())  # v0: the coordinator names a member that has no id
        member, bumped = self._member(group.group_id, consumer, request, member_id)
        member.heartbeat()
        for attribute in ("rack_id", "server_assignor"):
            value = getattr(request, attribute)
            if value is not None and value != getattr(member, attribute):
                setattr(member, attribute, value)
                bumped = bumped or attribute == "server_assignor"
        if request.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
        names, regex = request.subscribed_topic_names, request.subscribed_topic_regex
        if names is not None and names != member.subscribed_topic_names:
            member.subscribed_topic_names = list(names)
            bumped = True
        if regex is not None and (regex or None) != member.subscribed_topic_regex:
            member.subscribed_topic_regex = regex or None
            bumped = True
        subscription = self._subscription(consumer)
        if subscription != consumer.subscription:
            consumer.subscription = subscription
            bumped = True
        if bumped:
            consumer.group_epoch += 1
        if consumer.group_epoch != consumer.assignment_epoch:
            self._assign(group.group_id, consumer)
        before = (member.member_epoch, member.assigned)
        reconcile(consumer, member, consumer.assignment_epoch, consumer.target.get(member.member_id, {}),
                  request.owned)
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            if member.revocation_deadline is None:
                member.revocation_deadline = time.monotonic() + member.rebalance_timeout_ms / 1000
        else:
            member.revocation_deadline = None
        full = request.member_epoch == 0 or request.owned is not None
        changed = before != (member.member_epoch, member.assigned)
        if changed or request.member_epoch == 0:
            member.settling_until = time.monotonic() + self.settings.heartbeat_interval_ms / 1000
        return HeartbeatResult(ErrorCode.NONE, None, member.member_id, member.member_epoch,
                               member.assigned if full or changed else None, self.interval_ms(consumer, member))

    def interval_ms(self, consumer: ConsumerGroup, member: ConsumerMember) -> int:
        """The heartbeat interval to ask of a member: the configured one once it is settled; a tenth of it (at least
        `settling_floor_ms`) while it moves (it must give up partitions, waits for some, is behind the target) and
        for one full interval after it joined or its assignment changed.

        Kafka always asks the configured interval, so each step of a rebalance waits up to a full interval: the owner
        learns it must revoke at its next heartbeat, the newcomer gets the freed partitions at its own next one, and
        a fleet started together settles one interval per wave of joins. A coordinator cannot push, but it may ask
        for the next heartbeat sooner (the protocol's HeartbeatIntervalMs is per response, and librdkafka and the
        Java client follow it), so a move costs a few short intervals; settled members heartbeat as configured."""
        configured = self.settings.heartbeat_interval_ms
        short = min(configured, max(self.settings.settling_floor_ms, configured // self.settings.settling_speedup))
        moving = member.state != MemberState.STABLE or member.member_epoch != consumer.assignment_epoch
        return short if moving or time.monotonic() < member.settling_until else configured

    def _member(self, group_id: str, consumer: ConsumerGroup, request: HeartbeatRequest,
                member_id: str) -> tuple[ConsumerMember, bool]:
        """The member this heartbeat is from, created on a join; True when it is new to the group."""
        epoch, instance_id = request.member_epoch, request.instance_id
        member = consumer.members.get(member_id)
        if instance_id is not None and epoch == 0:
            existing_id = consumer.static_members.get(instance_id)
            existing = consumer.members.get(existing_id) if existing_id is not None else None
            if existing is not None and existing.member_id != member_id:
                if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise _Refused(ErrorCode.UNRELEASED_INSTANCE_ID,
                                   f"Static member {member_id} with instance id {instance_id} cannot join the group "
                                   f"because the instance id is owned by member {existing.member_id}.")
                return self._replace_static(group_id, consumer, existing, member_id, request), False
        if member is None:
            if epoch != 0:
                raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                               f"Member {member_id} is not a member of group {group_id}.")
            member = ConsumerMember(
                member_id, instance_id, request.rack_id, request.client_id, request.client_host,
                request.rebalance_timeout_ms, list(request.subscribed_topic_names or []),
                request.subscribed_topic_regex or None, request.server_assignor,
            )
            consumer.members[member_id] = member
            if instance_id is not None:
                consumer.static_members[instance_id] = member_id
            log.info("group %s: member %s joins (instance %s)", group_id, member_id, instance_id)
            return member, True
        if member.instance_id != instance_id and instance_id is not None:
            raise _Refused(ErrorCode.FENCED_INSTANCE_ID,
                           f"Member {member_id} is not the member of instance id {instance_id}.")
        if epoch == 0:
            # A member rejoining with its own id (after FENCED_MEMBER_EPOCH, say): it starts over from what the
            # coordinator thinks it owns; the full assignment is in the answer.
            log.info("group %s: member %s rejoins", group_id, member_id)
            if member.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                member.member_epoch = max(member.previous_member_epoch, 0)
            return member, False
        if epoch > member.member_epoch:
            raise _Refused(ErrorCode.FENCED_MEMBER_EPOCH,
                           "The consumer group member has a greater member epoch "
                           f"({epoch}) than the one known by the group coordinator ({member.member_epoch}). "
                           "The member must abandon all its partitions and rejoin.")
        if epoch < member.member_epoch and not (
            epoch == member.previous_member_epoch and request.owned is not None
            and _subset(request.owned, member.assigned)
        ):
            # An older epoch is accepted only from a member that lost the answer which moved it (its owned
            # partitions then are a subset of what it has now), as Kafka does.
            raise _Refused(ErrorCode.FENCED_MEMBER_EPOCH,
                           f"The consumer group member has a smaller member epoch ({epoch}) than the one known by the "
                           f"group coordinator ({member.member_epoch}). The member must abandon all its partitions "
                           "and rejoin.")
        return member, False

    def _replace_static(self, group_id: str, consumer: ConsumerGroup, old: ConsumerMember, member_id: str,
                        request: HeartbeatRequest) -> ConsumerMember:
        """A static member came back (its old self left with epoch -2): the new member id takes its place, its epoch
        and its partitions, with no rebalance."""
        old_id = old.member_id
        del consumer.members[old_id]
        assigned, revoking = old.assigned, old.pending_revocation
        consumer.set_assignment(old, {}, {})
        old.member_id = member_id
        old.member_epoch = max(old.previous_member_epoch, 0)
        old.client_id, old.client_host = request.client_id, request.client_host
        old.revocation_deadline = None
        old.state = MemberState.STABLE if not revoking else MemberState.UNREVOKED_PARTITIONS
        consumer.members[member_id] = old
        consumer.set_assignment(old, assigned, revoking)
        if old.instance_id is not None:
            consumer.static_members[old.instance_id] = member_id
        consumer.target[member_id] = consumer.target.pop(old_id, {})
        log.info("group %s: static member %s rejoins as %s", group_id, old.instance_id, member_id)
        return old

    def _leave(self, request: HeartbeatRequest) -> HeartbeatResult:
        group = self.groups.get(request.group_id)
        consumer = group.consumer if group is not None else None
        member = consumer.members.get(request.member_id) if consumer is not None else None
        if request.instance_id is not None and consumer is not None:
            static_id = consumer.static_members.get(request.instance_id)
            if static_id is None:
                raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                               f"Instance id {request.instance_id} is unknown in group {request.group_id}.")
            if static_id != request.member_id:
                raise _Refused(ErrorCode.FENCED_INSTANCE_ID,
                               f"Instance id {request.instance_id} belongs to another member.")
        if group is None or consumer is None or member is None:
            raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                           f"Member {request.member_id} is not a member of group {request.group_id}.")
        if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # It will come back (a restart): its partitions wait for it until its session times out.
            log.info("group %s: static member %s (instance %s) leaves for now", group.group_id, member.member_id,
                     member.instance_id)
            if member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                member.previous_member_epoch = member.member_epoch
            member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
            member.heartbeat()
        else:
            log.info("group %s: member %s leaves", group.group_id, member.member_id)
            self.remove(group, member.member_id)
        return HeartbeatResult(ErrorCode.NONE, None, request.member_id, request.member_epoch)

    # -- membership changes ---------------------------------------------------------------------------------------
    def remove(self, group: Group, member_id: str) -> None:
        """Take a member out (left, or timed out): its partitions are free, the group epoch moves, a new target."""
        consumer = group.consumer
        if consumer is None or member_id not in consumer.members:
            return
        member = consumer.members.pop(member_id)
        consumer.set_assignment(member, {}, {})
        consumer.target.pop(member_id, None)
        if member.instance_id is not None and consumer.static_members.get(member.instance_id) == member_id:
            del consumer.static_members[member.instance_id]
        consumer.group_epoch += 1
        if consumer.members:
            consumer.subscription = self._subscription(consumer)
            self._assign(group.group_id, consumer)
            return
        consumer.assignment_epoch = consumer.group_epoch
        consumer.target.clear()
        if not (group.offsets or group.txn_offsets) and self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]  # nothing left to keep

    def sweep(self, now: float) -> list[str]:
        """Members silent past the session timeout, or not giving partitions up within their rebalance timeout;
        returns the groups that lost a member."""
        session_s = self.settings.session_timeout_ms / 1000
        changed: list[str] = []
        for group in list(self.groups.values()):
            consumer = group.consumer
            if consumer is None:
                continue
            for member in list(consumer.members.values()):
                if now - member.last_heartbeat > session_s:
                    log.info("group %s: member %s missed its session timeout", group.group_id, member.member_id)
                elif member.revocation_deadline is not None and now > member.revocation_deadline:
                    log.info("group %s: member %s did not revoke its partitions within its rebalance timeout",
                             group.group_id, member.member_id)
                else:
                    continue
                self.remove(group, member.member_id)
                if not changed or changed[-1] != group.group_id:
                    changed.append(group.group_id)
        return changed

    # -- target assignment ----------------------------------------------------------------------------------------
    def _subscription(self, consumer: ConsumerGroup) -> dict[str, TopicMetadata]:
        """The topics some member subscribes to (by name or by regex), as they are now."""
        topics = self.topics()
        out: dict[str, TopicMetadata] = {}
        names = {name for member in consumer.members.values() for name in member.subscribed_topic_names}
        out.update((name, topics[name]) for name in names if name in topics)
        # Each distinct regex walks the topics once, however many members share it.
        for regex in {m.subscribed_topic_regex for m in consumer.members.values() if m.subscribed_topic_regex}:
            pattern = self._pattern(consumer, regex)
            if pattern is not None:
                out.update((name, topics[name]) for name in topics if name not in out and pattern.fullmatch(name))
        return out

    @staticmethod
    def _pattern(consumer: ConsumerGroup, regex: str | None) -> re.Pattern[str] | None:
        if regex is None:
            return None
        if regex not in consumer.patterns:
            consumer.patterns[regex] = _compile(regex)
        return consumer.patterns[regex]

    def _member_topics(self, consumer: ConsumerGroup, member: ConsumerMember) -> frozenset[uuid.UUID]:
        pattern = self._pattern(consumer, member.subscribed_topic_regex)
        names = set(member.subscribed_topic_names)
        return frozenset(meta.topic_id for name, meta in consumer.subscription.items()
                         if name in names or (pattern is not None and pattern.fullmatch(name)))

    def _assign(self, group_id: str, consumer: ConsumerGroup) -> None:
        """A new target assignment at the group epoch, by the assignor the members ask for most (Kafka's rule)."""
        wanted = Counter(m.server_assignor for m in consumer.members.values() if m.server_assignor)
        name = wanted.most_common(1)[0][0] if wanted else self.settings.assignors[0]
        subscriptions = {
            m.member_id: MemberSubscription(self._member_topics(consumer, m), m.instance_id)
            for m in consumer.members.values()
        }
        topics = {meta.topic_id: meta for meta in consumer.subscription.values()}
        consumer.target = ASSIGNORS[name](subscriptions, topics, consumer.target)
        in_use = {m.subscribed_topic_regex for m in consumer.members.values()}
        for regex in [r for r in consumer.patterns if r not in in_use]:
            del consumer.patterns[regex]  # compiled once per regex while some member subscribes with it
        consumer.assignor = name
        consumer.assignment_epoch = consumer.group_epoch
        log.info("group %s: epoch %d, %d member(s), %d topic(s), assignor %s", group_id, consumer.group_epoch,
                 len(consumer.members), len(topics), name)

    # -- offsets --------------------------------------------------------------------------------------------------
    @staticmethod
    def check_commit(consumer: ConsumerGroup, member_id: str, member_epoch: int, api_version: int | None) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetCommit (`api_version` None: a TxnOffsetCommit)."""
        if member_epoch < 0 and not consumer.members:
            return ErrorCode.NONE  # an admin's commit (or a consumer without group management) to an empty group
        member = consumer.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if api_version is not None and api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION  # KIP-848 members commit with OffsetCommit v9+
        if member_epoch != member.member_epoch:
            # TxnOffsetCommit has no STALE_MEMBER_EPOCH: Kafka answers ILLEGAL_GENERATION there.
            return ErrorCode.STALE_MEMBER_EPOCH if api_version is not None else ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    @staticmethod
    def subscribed_topics(consumer: ConsumerGroup) -> set[str]:
        return set(consumer.subscription)


def _compile(regex: str) -> re.Pattern[str] | None:
    """Python's `re` for RE2/J's syntax: the common subset (classes, alternation, repetition, anchors) means the
    same; a pattern either refuses is INVALID_REGULAR_EXPRESSION."""
    try:
        return re.compile(regex)
    except re.error:
        return None


def _subset(owned: list[TopicPartition], assigned: Assignment) -> bool:
    return all(p in assigned.get(topic_id, frozenset()) for topic_id, p in owned)
