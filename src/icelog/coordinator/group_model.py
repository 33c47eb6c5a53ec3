"""The state of consumer groups: members, results of joins and syncs, and the group state machine's states."""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass, field
from enum import StrEnum

from icelog.coordinator.consumer_model import ConsumerGroup
from icelog.errors import ErrorCode
from icelog.meta.store import GroupOffsets


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class GroupSettings:
    """Kafka's group.* broker settings."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000


@dataclass
class JoinResult:
    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # leader only


@dataclass
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    last_heartbeat: float = field(default_factory=time.monotonic)

    def metadata(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    def heartbeat(self) -> None:
        self.last_heartbeat = time.monotonic()


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: dict[str, float] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> expiry
    offsets: GroupOffsets = field(default_factory=dict)
    txn_offsets: dict[tuple[str, int], int] = field(
        default_factory=dict
    )  # partitions with uncommitted txn offsets
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    rebalance_task: asyncio.Task[None] | None = None
    consumer: ConsumerGroup | None = None  # a KIP-848 consumer group: its members and epochs (else a classic group)

    @property
    def group_type(self) -> str:
        """Kafka's GroupType, as ListGroups v5 names it."""
        return "classic" if self.consumer is None else "consumer"

    @property
    def state_name(self) -> str:
        """The state as DescribeGroups, ConsumerGroupDescribe and ListGroups spell it (each kind has its own)."""
        return self.state.value if self.consumer is None else self.consumer.state().value

    @property
    def has_members(self) -> bool:
        return bool(self.members) or (self.consumer is not None and bool(self.consumer.members))

    def subscribed_topics(self) -> set[str]:
        """Topics the members subscribe to (consumer protocol metadata, or KIP-848 subscriptions), for OffsetDelete."""
        if self.consumer is not None:
            return set(self.consumer.subscription)
        topics: set[str] = set()
        if self.protocol_type != "consumer":
            return topics
        for member in self.members.values():
            topics.update(_parse_subscription(member.metadata(self.protocol_name)))
        return topics


def _parse_subscription(metadata: bytes) -> list[str]:
    """Topic names of a consumer-protocol subscription (version i16, then an array of strings)."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, []
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", metadata, pos)
            topics.append(metadata[pos + 2 : pos + 2 + length].decode())
            pos += 2 + length
        return topics
    except (struct.error, UnicodeDecodeError):
        return []
