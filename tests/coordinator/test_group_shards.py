"""The group coordinator of a broker of a cluster (issue 46): it serves the groups of the coordinator shards it was
handed (take_shard loads their committed offsets from the store), forgets them when a shard is taken away
(drop_shard: a member waiting on its join is answered NOT_COORDINATOR), and a broker alone serves every group."""

from __future__ import annotations

import asyncio
from pathlib import Path

from icelog.cluster.view import coordinator_shard
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
