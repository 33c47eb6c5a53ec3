"""The group coordinator of a broker of a cluster (issue 46): it serves the groups of the coordinator shards it was
handed (take_shard loads their committed offsets from the store), forgets them when a shard is taken away
(drop_shard: a member waiting on its join is answered NOT_COORDINATOR), and a broker alone serves every group."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from icelog.cluster.view import coordinator_shard
from icelog.coordinator import consumer_state
from icelog.coordinator.consumer_groups import HeartbeatRequest
from icelog.coordinator.consumer_model import ConsumerGroup, ConsumerMember, MemberState, TopicMetadata
from icelog.coordinator.group_model import GroupSettings, GroupState
from icelog.coordinator.group_shards import GroupShards
from icelog.coordinator.groups import GroupCoordinator
from icelog.errors import ErrorCode
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import CommittedOffset


def _groups_of_two_shards() -> tuple[str, str, str]:
    """Two groups of one shard and a third of another."""
    first = "group-0"
    same = next(f"group-{i}" for i in range(1, 10000) if coordinator_shard(f"group-{i}") == coordinator_shard(first))
    other = next(f"group-{i}" for i in range(1, 10000) if coordinator_shard(f"group-{i}") != coordinator_shard(first))
    return first, same, other


def test_a_shard_taken_brings_back_its_groups_offsets_and_a_shard_dropped_forgets_them(tmp_path: Path) -> None:
    first, same, other = _groups_of_two_shards()
    shard = coordinator_shard(first)
    store = SqliteStore(tmp_path / "meta.db")
    for group in (first, same, other):
        store.commit_offsets(group, {("t", 0): CommittedOffset(7, "", 0)})

    async def main() -> None:
        groups = GroupCoordinator(store, GroupSettings(initial_rebalance_delay_ms=0))
        groups.shards = shards = GroupShards(groups)
        assert not groups.serves(first) and not groups.serves(other)
        await shards.take_shard(shard)
        assert groups.serves(first) and groups.serves(same) and not groups.serves(other)
        assert set(groups.groups) == {first, same}
        assert groups.fetch(first, [("t", 0)])[("t", 0)][0] == CommittedOffset(7, "", 0)
        assert groups.describe(first).state == GroupState.EMPTY  # type: ignore[union-attr]

        # A member joins and the group completes its rebalance; a second member's join then waits for the first to
        # join again (within a long rebalance timeout), and the shard is taken away meanwhile.
        first_join = await groups.join(first, "", None, "a", "/h", 10000, 60000, "consumer", [("range", b"")],
                                       require_known_member=False)
        assert first_join.error == ErrorCode.NONE
        waiting = asyncio.create_task(groups.join(first, "", None, "b", "/h", 10000, 60000, "consumer",
                                                  [("range", b"")], require_known_member=False))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        rebalance = groups.groups[first].rebalance_task
        shards.drop_shard(shard)
        assert (await waiting).error == ErrorCode.NOT_COORDINATOR
        await asyncio.sleep(0)
        assert rebalance is not None and rebalance.cancelled()
        assert not groups.serves(first) and groups.groups == {}

        # A commit that ends after the shard moved is not the coordinator's any more (the client commits again
        # at the new one); the store has it all the same.
        assert await groups.commit(same, {("t", 0): CommittedOffset(9, "", 0)}) is False
        assert same not in groups.groups
        await shards.take_shard(shard)
        assert groups.fetch(same, [("t", 0)])[("t", 0)][0] == CommittedOffset(9, "", 0)
        assert await groups.commit(same, {("t", 0): CommittedOffset(11, "", 0)}) is True
        await groups.stop()

    asyncio.run(main())
    store.close()


def test_a_broker_alone_serves_every_group(tmp_path: Path) -> None:
    first, _, other = _groups_of_two_shards()
    store = SqliteStore(tmp_path / "meta.db")
    store.commit_offsets(other, {("t", 1): CommittedOffset(3, "m", 0)})
    groups = GroupCoordinator(store)
    groups.load()
    assert groups.serves(first) and groups.serves(other)
    assert set(groups.groups) == {other}
    store.close()


def test_a_kip848_group_goes_on_at_each_new_coordinator_of_its_shard(tmp_path: Path) -> None:
    """The shard moves twice (A -> B -> A): at each new coordinator the members heartbeat on at their epochs with
    their partitions (nobody is fenced, nothing is handed to two members), and a member's leave at B is known to A."""
    group = "kip848-moving"
    shard = coordinator_shard(group)
    topic = TopicMetadata(uuid.uuid4(), "orders", 4)
    store = SqliteStore(tmp_path / "meta.db")

    def coordinator() -> tuple[GroupCoordinator, GroupShards]:
        groups = GroupCoordinator(store, topics=lambda: {"orders": topic})
        groups.shards = shards = GroupShards(groups)
        return groups, shards

    async def settle(groups: GroupCoordinator, members: dict[str, tuple[int, list[int]]]) -> None:
        """Heartbeat every member with what it owns until the group is stable (each step as a client would)."""
        for _ in range(20):
            for member, (epoch, owned) in list(members.items()):
                result = await groups.consumer_heartbeat(HeartbeatRequest(
                    group, member, epoch, owned=[(topic.topic_id, p) for p in owned]))
                assert result.error == ErrorCode.NONE, (member, result)
                assigned = owned if result.assignment is None else sorted(result.assignment.get(topic.topic_id, ()))
                members[member] = (result.member_epoch, assigned)
            if groups.describe(group).consumer.state().value == "Stable":  # type: ignore[union-attr]
                return
        raise AssertionError(f"the group did not settle: {members}")

    async def main() -> None:
        a, a_shards = coordinator()
        await a_shards.take_shard(shard)
        members: dict[str, tuple[int, list[int]]] = {}
        for member in ("m1", "m2"):
            joined = await a.consumer_heartbeat(HeartbeatRequest(group, member, 0, rebalance_timeout_ms=30000,
                                                                 subscribed_topic_names=["orders"], owned=[]))
            assert joined.error == ErrorCode.NONE
            members[member] = (joined.member_epoch, [])
        await settle(a, members)
        owned = {m: set(parts) for m, (_, parts) in members.items()}
        assert owned["m1"] | owned["m2"] == {0, 1, 2, 3} and not owned["m1"] & owned["m2"]
        a_shards.drop_shard(shard)

        b, b_shards = coordinator()
        await b_shards.take_shard(shard)
        for member, (epoch, parts) in members.items():  # B knows each member at its epoch, with its partitions
            again = await b.consumer_heartbeat(HeartbeatRequest(group, member, epoch,
                                                                owned=[(topic.topic_id, p) for p in parts]))
            assert (again.error, again.member_epoch) == (ErrorCode.NONE, epoch), again
            assert again.assignment is None or sorted(again.assignment[topic.topic_id]) == parts
        left = await b.consumer_heartbeat(HeartbeatRequest(group, "m2", -1))
        assert left.error == ErrorCode.NONE
        del members["m2"]
        await settle(b, members)
        assert members["m1"][1] == [0, 1, 2, 3]
        b_shards.drop_shard(shard)
        await b.stop()

        await a_shards.take_shard(shard)  # back at A: B's changes, not A's old state
        described = a.describe(group)
        assert described is not None and described.consumer is not None
        assert set(described.consumer.members) == {"m1"}
        epoch, parts = members["m1"]
        again = await a.consumer_heartbeat(HeartbeatRequest(group, "m1", epoch,
                                                            owned=[(topic.topic_id, p) for p in parts]))
        assert (again.error, again.member_epoch) == (ErrorCode.NONE, epoch)
        gone = await a.consumer_heartbeat(HeartbeatRequest(group, "m2", members.get("m2", (1, []))[0]))
        assert gone.error == ErrorCode.UNKNOWN_MEMBER_ID
        await a.stop()

    asyncio.run(main())
    store.close()


def test_a_consumer_group_state_is_stored_as_written_and_read_back_whole() -> None:
    """consumer_state.encode / decode: every field that makes a member's epoch and partitions survives."""
    orders, audit = uuid.uuid4(), uuid.uuid4()
    group = ConsumerGroup(group_epoch=7, assignment_epoch=6, assignor="range")
    group.subscription = {"orders": TopicMetadata(orders, "orders", 3), "audit": TopicMetadata(audit, "audit", 1)}
    static = ConsumerMember("s", "instance-1", "rack-a", "client", "/127.0.0.1", 45000, ["orders"], None, "range",
                            member_epoch=6, previous_member_epoch=5, state=MemberState.UNREVOKED_PARTITIONS)
    regex = ConsumerMember("r", None, None, "client", "/127.0.0.1", 30000, [], "aud.*", None, member_epoch=5)
    for member, assigned, revoking in ((static, {orders: [0, 1]}, {orders: [2]}), (regex, {audit: [0]}, {})):
        group.members[member.member_id] = member
        group.set_assignment(member, assigned, revoking)
    group.static_members["instance-1"] = "s"
    group.target = {"s": {orders: frozenset({0, 1})}, "r": {audit: frozenset({0}), orders: frozenset({2})}}

    back = consumer_state.decode(consumer_state.encode(group), now=100.0)
    assert consumer_state.encode(back) == consumer_state.encode(group)
    assert (back.group_epoch, back.assignment_epoch, back.assignor) == (7, 6, "range")
    assert back.static_members == {"instance-1": "s"} and back.target == group.target
    assert back.owners == group.owners and back.state() == group.state()
    assert back.members["s"].revocation_deadline == 145.0 and back.members["r"].last_heartbeat == 100.0
    with pytest.raises(ValueError, match="format"):
        consumer_state.decode('{"format": 99}')
