"""What a broker of a cluster knows of the others at one moment: the live brokers with their advertised listeners,
and who leads each partition and coordinator shard. A `ClusterView` is immutable; the controller replaces it after
every heartbeat, and the wire reads whichever is current (Metadata, FindCoordinator, DescribeCluster).

Leadership is spread by rendezvous hashing (highest random weight): every key (a partition, or a coordinator shard)
goes to the live broker whose hash with it is highest, so every broker computes the same target from the same live
set, and a broker joining or leaving moves only the keys it gains or held. A key stays with its holder until the
holder releases it (to its target) or stops heartbeating.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from icelog.meta.store import BrokerLease, BrokerRecord, Leadership

# Coordinator shards (Kafka's __consumer_offsets and __transaction_state partitions, 50 each by default): a group or a
# transactional id belongs to shard hash(key) % COORDINATOR_SHARDS, led like a partition of this reserved id.
COORDINATOR_SHARDS = 50
GROUP_SHARDS_ID = uuid.UUID("00000000-0000-0000-0000-00000000c0f5")  # Kafka's __consumer_offsets
TXN_SHARDS_ID = uuid.UUID("00000000-0000-0000-0000-00000000c0f7")  # Kafka's __transaction_state

Key = tuple[uuid.UUID, int]


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units), as Kafka's partitionFor(groupId) takes it."""
    h = 0
    for unit in _utf16_units(text):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _utf16_units(text: str) -> Iterable[int]:
    data = text.encode("utf-16-be", "surrogatepass")
    return (int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))


def coordinator_shard(key: str) -> int:
    """Kafka's Utils.abs(key.hashCode) % partitions: the shard of a group id or transactional id."""
    return (java_string_hash(key) & 0x7FFFFFFF) % COORDINATOR_SHARDS


def rendezvous(key: Key, nodes: Iterable[int]) -> int | None:
    """The node a key goes to among `nodes` (None: no node)."""
    best, best_weight = None, -1
    for node in nodes:
        digest = hashlib.blake2b(f"{key[0]}/{key[1]}/{node}".encode(), digest_size=8).digest()
        weight = int.from_bytes(digest, "big")
        if weight > best_weight:
            best, best_weight = node, weight
    return best


@dataclass(frozen=True)
class ClusterView:
    """The cluster as one broker last saw it."""

    lease: BrokerLease
    brokers: tuple[BrokerRecord, ...] = ()  # live ones, by node id
    leaders: dict[Key, Leadership] = field(default_factory=dict)

    @property
    def node_id(self) -> int:
        return self.lease.node_id

    def live_nodes(self) -> list[int]:
        return [b.node_id for b in self.brokers]

    def target(self, key: Key) -> int | None:
        """The live broker a key belongs on."""
        return rendezvous(key, self.live_nodes())

    def leader(self, key: Key) -> tuple[int, int]:
        """(node, epoch) a coordinator lookup or a transaction marker goes to: its holder while alive, else its target
        (which takes it at its next heartbeat, and answers retriably until then); (-1, epoch) when no broker is
        alive. (Metadata names partition leaders with `partition_leader`.)"""
        node, epoch = self.partition_leader(key)
        if node >= 0:
            return node, epoch
        target = self.target(key)
        return (-1 if target is None else target), epoch

    def partition_leader(self, key: Key) -> tuple[int, int]:
        """(node, epoch) Metadata names for a partition: its holder while alive, else (-1, epoch), which clients
        read as LEADER_NOT_AVAILABLE until the broker it goes to claims it under a new epoch. Never the target under
        the held epoch: one epoch must name one leader, as Kafka's do. Brokers' views differ for a heartbeat, and a
        client asking two of them would see two leaders of one epoch and flip between them; librdkafka 2.16 can
        then stay delegated to the old leader for good (its "preferred replica" check), and its records time out."""
        held = self.leaders.get(key)
        epoch = held.epoch if held is not None else 0
        if held is not None and held.holder is not None:
            holder = next((b for b in self.brokers if b.node_id == held.holder.node_id), None)
            if holder is not None and holder.incarnation == held.holder.incarnation:
                return held.holder.node_id, epoch
        return -1, epoch

    def leads(self, key: Key) -> bool:
        held = self.leaders.get(key)
        return held is not None and held.holder == self.lease

    def endpoint(self, node: int, listener: str) -> tuple[str, int] | None:
        """The (host, port) a broker advertises on a listener (the one a client came in on)."""
        for broker in self.brokers:
            if broker.node_id == node:
                return broker.endpoints.get(listener)
        return None

    def rack(self, node: int) -> str | None:
        return next((b.rack for b in self.brokers if b.node_id == node), None)

    def group_coordinator(self, group_id: str) -> int:
        return self.leader((GROUP_SHARDS_ID, coordinator_shard(group_id)))[0]

    def txn_coordinator(self, transactional_id: str) -> int:
        return self.leader((TXN_SHARDS_ID, coordinator_shard(transactional_id)))[0]
