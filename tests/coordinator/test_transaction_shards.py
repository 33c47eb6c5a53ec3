"""The transaction coordinator as one broker of a cluster, in process (no other broker): it answers only the
transactional ids of the shards it took, writes the markers of partitions it does not lead through `RemoteMarkers`
(retried until written), forgets a shard it gives up, and verifies batches of ids coordinated elsewhere from the
store. tests/cluster/test_cluster_transactions.py runs the same over three real brokers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from icelog.cluster.view import coordinator_shard
from icelog.config import IntakeSettings, Settings
from icelog.coordinator.group_shards import GroupShards
from icelog.coordinator.groups import GroupCoordinator
from icelog.coordinator.transactions import TransactionCoordinator, TxnState
from icelog.coordinator.txn_shards import TxnShards
from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.manager import LogManager
from icelog.meta.sqlite import SqliteStore
from icelog.meta.store import CommittedOffset, MetadataStore, TransactionRecord
from icelog.records.batch import parse_produced_batches
from tests.support.wire_client import build_batch

OTHER_NODE = 7


class FakeView:
    """Node 1's view: partition 1 of every topic is led by OTHER_NODE."""

    node_id = 1

    def leader(self, key: tuple[Any, int]) -> tuple[int, int]:
        return (OTHER_NODE if key[1] == 1 else self.node_id), 1


class FakeRemote:
    """WriteTxnMarkers to OTHER_NODE: the first answer NOT_LEADER_OR_FOLLOWER (its leader moving), then written."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, bool, list[tuple[str, int]]]] = []

    async def write(self, node: int, producer_id: int, producer_epoch: int, commit: bool,
                    partitions: Sequence[tuple[str, int]], coordinator_epoch: int = 0) -> dict[tuple[str, int], int]:
        self.calls.append((node, producer_id, producer_epoch, commit, list(partitions)))
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER if len(self.calls) == 1 else ErrorCode.NONE
        return {tp: int(code) for tp in partitions}

    def close(self) -> None:
        pass


@dataclass
class Broker:
    """One broker of a cluster, in process: its logs, group coordinator (with GroupShards, or serving every group)
    and transaction coordinator (TxnShards: FakeView, FakeRemote)."""

    logs: LogManager
    groups: GroupCoordinator
    group_shards: GroupShards
    txns: TransactionCoordinator
    shards: TxnShards
    remote: FakeRemote


@asynccontextmanager
async def one_broker(tmp_path: Path, with_group_shards: bool = False,
                     before: Callable[[MetadataStore], None] = lambda _: None) -> AsyncIterator[Broker]:
    """The broker's parts, stopped at the end; `before` writes to the store before the coordinators start (what
    another broker left there)."""
    logs = LogManager(Settings(data_dir=tmp_path, intake=IntakeSettings(fsync=False)),
                      SqliteStore(tmp_path / "meta.db"))
    logs.open()
    logs.start()
    before(logs.store)
    groups = GroupCoordinator(logs.store)
    group_shards = GroupShards(groups)
    if with_group_shards:
        groups.shards = group_shards
    txns = TransactionCoordinator(logs.store, logs, groups)
    remote = FakeRemote()
    shards = TxnShards(txns, lambda: FakeView(), remote)
    try:
        yield Broker(logs, groups, group_shards, txns, shards, remote)
    finally:
        await txns.stop()
        await groups.stop()
        await logs.close()


def _other_shard_id(transactional_id: str) -> str:
    """A transactional id of another shard than `transactional_id`'s."""
    return next(t for t in (f"other-{n}" for n in range(100))
                if coordinator_shard(t) != coordinator_shard(transactional_id))


def test_a_cluster_coordinator_serves_its_shards_and_sends_markers_to_other_leaders(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_broker(tmp_path) as node:
            logs, txns, shards, remote = node.logs, node.txns, node.shards, node.remote
            state = logs.create_topic("spread", 2, {})
            assert state is not None
            state.partitions[1].led = False  # another broker leads it
            await shards.take_shard(coordinator_shard("mine"))
            elsewhere = _other_shard_id("mine")
            assert (await txns.init_producer_id(elsewhere, 60000, -1, -1, 4))[0] == ErrorCode.NOT_COORDINATOR
            error, pid, epoch = await txns.init_producer_id("mine", 60000, -1, -1, 4)
            assert error == ErrorCode.NONE
            added = await txns.add_partitions("mine", pid, epoch, [("spread", 0), ("spread", 1)], 3)
            assert set(added.values()) == {ErrorCode.NONE}
            assert await txns.end_txn("mine", pid, epoch, True, 3) == ErrorCode.NONE
            assert remote.calls == [(OTHER_NODE, pid, epoch, True, [("spread", 1)])] * 2, "retried until written"
            assert state.partitions[0].high_watermark == 1, "the local partition's marker through the intake"
            assert logs.store.transaction("mine") == TransactionRecord("mine", pid, epoch, 60000, "CompleteCommit")

            shards.drop_shard(coordinator_shard("mine"))
            assert "mine" not in txns.txns
            assert await txns.end_txn("mine", pid, epoch, True, 3) == ErrorCode.NOT_COORDINATOR
            await shards.take_shard(coordinator_shard("mine"))  # back, from the store
            assert txns.txns["mine"].state == TxnState.COMPLETE_COMMIT

    asyncio.run(main())


def _group_of_shard(wanted: int | None, avoid: int | None = None) -> str:
    return next(g for g in (f"group-{n}" for n in range(10000))
                if (wanted is None or coordinator_shard(g) == wanted) and coordinator_shard(g) != avoid)


def test_offsets_sent_to_a_transaction_wait_at_their_group_coordinator_for_the_marker(tmp_path: Path) -> None:
    """TxnOffsetCommit is staged by the group's coordinator (durably, verified against the stored transaction); at
    EndTxn the transaction coordinator completes a group shard it leads itself and sends WriteTxnMarkers for
    (__consumer_offsets, shard) to the broker leading any other (FakeView: shard 1 is OTHER_NODE's)."""
    async def main() -> None:
        local, elsewhere = _group_of_shard(None, avoid=1), _group_of_shard(1)
        offsets = {("in", 0): CommittedOffset(5, "m", 1)}
        async with one_broker(tmp_path, with_group_shards=True) as node:
            logs, groups, txns, shards, remote = node.logs, node.groups, node.txns, node.shards, node.remote
            group_shards = node.group_shards
            await group_shards.take_shard(coordinator_shard(local))
            await shards.take_shard(coordinator_shard("eos"))
            error, pid, epoch = await txns.init_producer_id("eos", 60000, -1, -1, 4)
            assert error == ErrorCode.NONE
            stage = groups.txn_offsets.commit
            assert await stage("eos", local, pid, epoch, -1, "", None, offsets) == ErrorCode.INVALID_TXN_STATE, \
                "AddOffsetsToTxn first"
            for group in (local, elsewhere):
                assert await txns.add_offsets("eos", pid, epoch, group, 3) == ErrorCode.NONE
            assert await stage("eos", local, pid, epoch + 1, -1, "", None, offsets) == ErrorCode.INVALID_PRODUCER_EPOCH
            assert await stage("eos", local, pid + 1, epoch, -1, "", None, offsets) == \
                ErrorCode.INVALID_PRODUCER_ID_MAPPING
            assert await stage("eos", local, pid, epoch, -1, "", None, offsets) == ErrorCode.NONE
            logs.store.stage_txn_offsets("eos", elsewhere, pid, epoch, offsets)  # (as OTHER_NODE, its coordinator)
            assert groups.fetch(local, [("in", 0)], require_stable=True) == {
                ("in", 0): (None, ErrorCode.UNSTABLE_OFFSET_COMMIT)}
            assert groups.fetch(local, [("in", 0)]) == {("in", 0): (None, ErrorCode.NONE)}, "not committed yet"

            assert await txns.end_txn("eos", pid, epoch, True, 3) == ErrorCode.NONE
            marker = (OTHER_NODE, pid, epoch, True, [("__consumer_offsets", 1)])
            assert remote.calls == [marker] * 2, "the other shard's marker, retried until written"
            assert groups.fetch(local, [("in", 0)], require_stable=True) == {("in", 0): (offsets[("in", 0)], 0)}
            assert logs.store.committed_offsets(local) == offsets
            assert logs.store.pending_txn_offsets() == {elsewhere: {("in", 0): pid}}, "completed by its coordinator"
            assert logs.store.transaction("eos") == TransactionRecord("eos", pid, epoch, 60000, "CompleteCommit")
            group_shards.drop_shard(coordinator_shard(local))  # another broker takes it, and reads it back
            await group_shards.take_shard(coordinator_shard(local))
            assert groups.fetch(local, [("in", 0)], require_stable=True) == {("in", 0): (offsets[("in", 0)], 0)}

    asyncio.run(main())


def test_a_coordinator_taking_a_shard_finishes_a_prepared_commit_of_offsets_once(tmp_path: Path) -> None:
    """The transaction coordinator died with PrepareCommit stored and offsets pending at the group's coordinator: the
    broker taking the transaction shard completes them (the group shard is its own here); a repeated marker (the
    dead coordinator's, late) and an abort marker for that epoch change nothing after that."""
    async def main() -> None:
        group = _group_of_shard(None, avoid=1)
        offsets = {("in", 0): CommittedOffset(9)}

        def left_by_the_dead_coordinator(store: MetadataStore) -> None:
            """AddOffsetsToTxn, TxnOffsetCommit and EndTxn, as the dead coordinator left them."""
            store.save_transaction(TransactionRecord("dead", 77, 2, 60000, "Ongoing", (), (group,)))
            assert store.stage_txn_offsets("dead", group, 77, 2, offsets).staged
            store.save_transaction(TransactionRecord("dead", 77, 2, 60000, "PrepareCommit", (), (group,)))

        async with one_broker(tmp_path, with_group_shards=True, before=left_by_the_dead_coordinator) as node:
            store, groups, txns, shards = node.logs.store, node.groups, node.txns, node.shards
            group_shards = node.group_shards
            await group_shards.take_shard(coordinator_shard(group))
            assert groups.fetch(group, [("in", 0)], require_stable=True)[("in", 0)][1] == \
                ErrorCode.UNSTABLE_OFFSET_COMMIT, "loaded with the shard"
            await shards.take_shard(coordinator_shard("dead"))
            for _ in range(100):
                if txns.txns["dead"].state == TxnState.COMPLETE_COMMIT:
                    break
                await asyncio.sleep(0.05)
            assert store.transaction("dead") == TransactionRecord("dead", 77, 2, 60000, "CompleteCommit")
            assert groups.fetch(group, [("in", 0)], require_stable=True) == {("in", 0): (offsets[("in", 0)], 0)}
            late = groups.txn_offsets.complete
            await late(coordinator_shard(group), 77, 2, commit=True)
            await late(coordinator_shard(group), 77, 2, commit=False)
            assert store.committed_offsets(group) == offsets and store.pending_txn_offsets() == {}
            with pytest.raises(KafkaApiError) as moved:
                await late(1, 77, 2, commit=True)  # a shard this broker does not lead
            assert moved.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    asyncio.run(main())


def test_a_leader_verifies_batches_of_ids_coordinated_elsewhere_from_the_store(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_broker(tmp_path) as node:
            logs, txns = node.logs, node.txns
            state = logs.create_topic("verified", 2, {})
            assert state is not None
            part0, part1 = state.partitions
            # Another broker coordinates "theirs": it stored AddPartitionsToTxn (partition 0) before answering it.
            logs.store.save_transaction(TransactionRecord("theirs", 900, 3, 60000, "Ongoing", (("verified", 0),)))
            batch = build_batch([b"v"], 900, 3, 0, transactional=True)
            headers = parse_produced_batches(batch, 1 << 20, False, False)

            with pytest.raises(KafkaApiError) as refused:
                txns.verify_append("verified", 0, 900, 3)  # not looked up yet
            assert refused.value.code == ErrorCode.INVALID_TXN_STATE
            await txns.verify_remote("theirs", "verified", part0, headers)
            txns.verify_append("verified", 0, 900, 3)  # from the cache now
            _, done = logs.append(state, part0, batch)
            await done
            with pytest.raises(KafkaApiError) as refused:
                await txns.verify_remote("theirs", "verified", part1, headers)
            assert refused.value.code == ErrorCode.INVALID_TXN_STATE, "partition 1 is not in the transaction"
            old = parse_produced_batches(build_batch([b"z"], 900, 2, 0, transactional=True), 1 << 20, False, False)
            with pytest.raises(KafkaApiError) as refused:
                await txns.verify_remote("theirs", "verified", part0, old)
            assert refused.value.code == ErrorCode.INVALID_PRODUCER_EPOCH, "a zombie's epoch"

            await txns.append_marker("verified", part0, 900, 3, commit=True)  # its coordinator's WriteTxnMarkers
            logs.store.save_transaction(TransactionRecord("theirs", 900, 3, 60000, "CompleteCommit"))
            with pytest.raises(KafkaApiError):
                txns.verify_append("verified", 0, 900, 3)  # the marker ended what was verified
            with pytest.raises(KafkaApiError) as refused:
                await txns.verify_remote("theirs", "verified", part0, headers)
            assert refused.value.code == ErrorCode.INVALID_TXN_STATE, "the transaction is over"

    asyncio.run(main())


def test_a_leader_aborts_as_hanging_only_what_no_stored_transaction_owns(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_broker(tmp_path) as node:
            logs, txns = node.logs, node.txns
            state = logs.create_topic("hanging", 1, {})
            assert state is not None
            part = state.partitions[0]
            logs.store.save_transaction(TransactionRecord("theirs", 901, 0, 60000, "Ongoing", (("hanging", 0),)))
            await txns.verify_remote("theirs", "hanging", part, parse_produced_batches(
                build_batch([b"open"], 901, 0, 0, transactional=True), 1 << 20, False, False))
            _, done = logs.append(state, part, build_batch([b"open"], 901, 0, 0, transactional=True))
            await done
            assert await txns.abort_hanging(lambda _pid, _opened: True) == 0, "its coordinator (elsewhere) owns it"
            logs.store.save_transaction(TransactionRecord("theirs", 901, 0, 60000, "CompleteAbort"))
            txns._hanging_checked.clear()  # (asked again only every few seconds)
            assert await txns.abort_hanging(lambda _pid, _opened: True) == 1, "nobody owns it: aborted"
            assert [r.producer_id for r in part.aborted_ranges(0, part.high_watermark)] == [901]

    asyncio.run(main())
