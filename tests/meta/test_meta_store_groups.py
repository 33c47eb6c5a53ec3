"""Metadata-store behaviour for committed offsets, producer ids and transaction state (every backend).

Runs once per backend in STORE_BACKENDS (the `store` and `open_same_store` fixtures of tests/meta/conftest.py).
"""

from __future__ import annotations

from icelog.meta.store import CommittedOffset, MetadataStore, TransactionRecord
from tests.meta.conftest import OpenStore


def test_committed_offsets_replace_per_partition_and_survive_reopen(open_same_store: OpenStore) -> None:
    first = open_same_store()
    first.commit_offsets("g", {("t", 0): CommittedOffset(5, "m", 1), ("t", 1): CommittedOffset(7)})
    first.commit_offsets("g", {("t", 0): CommittedOffset(9, "", 2)})
    first.commit_offsets("other", {("u", 0): CommittedOffset(1)})
    first.close()
    again = open_same_store()
    assert again.committed_offsets("g") == {("t", 0): CommittedOffset(9, "", 2), ("t", 1): CommittedOffset(7)}
    assert again.offset_groups() == ["g", "other"]
    assert again.committed_offsets("nobody") == {}


def test_delete_offsets_of_some_partitions_or_a_whole_group(store: MetadataStore) -> None:
    store.commit_offsets("g", {("t", 0): CommittedOffset(1), ("t", 1): CommittedOffset(2)})
    store.delete_offsets("g", [("t", 0), ("missing", 3)])
    assert store.committed_offsets("g") == {("t", 1): CommittedOffset(2)}
    store.delete_offsets("g")
    assert store.committed_offsets("g") == {}
    assert store.offset_groups() == []


def test_consumer_group_states_are_kept_per_shard_replaced_and_dropped(open_same_store: OpenStore) -> None:
    first = open_same_store()
    assert first.save_consumer_group_state("g", 3, '{"v":1}')
    assert first.save_consumer_group_state("g", 3, '{"v":2}')
    assert first.save_consumer_group_state("h", 3, '{"h":1}')
    assert first.save_consumer_group_state("other", 7, '{"o":1}')
    first.close()
    again = open_same_store()
    assert again.consumer_group_states(3) == {"g": '{"v":2}', "h": '{"h":1}'}
    assert again.consumer_group_states(7) == {"other": '{"o":1}'}
    assert again.consumer_group_states(9) == {}
    assert again.save_consumer_group_state("g", 3, None)
    assert again.save_consumer_group_state("never-saved", 3, None)
    assert again.consumer_group_states() == {"h": '{"h":1}', "other": '{"o":1}'}


def test_producer_id_blocks_never_overlap_even_after_reopen(open_same_store: OpenStore) -> None:
    first = open_same_store()
    a = first.allocate_producer_ids(10)
    b = first.allocate_producer_ids(5)
    first.close()
    c = open_same_store().allocate_producer_ids(1)
    ranges = [set(range(a, a + 10)), set(range(b, b + 5)), {c}]
    assert sum(len(r) for r in ranges) == len(set().union(*ranges))
    assert min(a, b, c) >= 0


def test_transaction_state_round_trips(open_same_store: OpenStore) -> None:
    first = open_same_store()
    record = TransactionRecord("txn", 42, 3, 60000, "PrepareCommit", (("t", 0), ("u", 2)), ("g", "h"))
    first.save_transaction(record)
    first.save_transaction(TransactionRecord("another", 7, 0, 1000, "Empty"))
    first.close()
    again = open_same_store()
    assert again.transactions() == [TransactionRecord("another", 7, 0, 1000, "Empty"), record]
    again.save_transaction(TransactionRecord("txn", 42, 4, 60000, "CompleteCommit"))
    assert again.transactions()[1] == TransactionRecord("txn", 42, 4, 60000, "CompleteCommit")
    # One id by its key (a cluster's partition leader verifies a transactional batch from it)
    assert again.transaction("txn") == TransactionRecord("txn", 42, 4, 60000, "CompleteCommit")
    assert again.transaction("another") == TransactionRecord("another", 7, 0, 1000, "Empty")
    assert again.transaction("never") is None


# -- transactional offsets: pending until a marker of their transaction ------------------------------------------
def _open_txn(store: MetadataStore, state: str = "Ongoing", epoch: int = 3, groups: tuple[str, ...] = ("g",)) -> None:
    store.save_transaction(TransactionRecord("txn", 42, epoch, 60000, state, (("out", 0),), groups))


def test_txn_offsets_are_staged_only_for_the_open_transaction_that_added_the_group(store: MetadataStore) -> None:
    offsets = {("t", 0): CommittedOffset(5, "m", 1), ("t", 1): CommittedOffset(8)}
    refused = store.stage_txn_offsets("txn", "g", 42, 3, offsets)
    assert not refused.staged and refused.transaction is None, "an unknown transactional id"
    _open_txn(store)
    for group, pid, epoch in (("other", 42, 3), ("g", 43, 3), ("g", 42, 2), ("g", 42, 4)):
        stage = store.stage_txn_offsets("txn", group, pid, epoch, offsets)
        assert not stage.staged and stage.coordinated, (group, pid, epoch)
        assert stage.transaction is not None and stage.transaction.producer_epoch == 3
    assert store.pending_txn_offsets() == {}
    assert store.stage_txn_offsets("txn", "g", 42, 3, offsets).staged
    assert store.stage_txn_offsets("txn", "g", 42, 3, {("t", 0): CommittedOffset(6)}).staged  # the later one wins
    assert store.pending_txn_offsets() == {"g": {("t", 0): 42, ("t", 1): 42}}
    assert store.committed_offsets("g") == {}, "nothing is committed before the transaction ends"
    _open_txn(store, "PrepareCommit")
    assert not store.stage_txn_offsets("txn", "g", 42, 3, offsets).staged, "the transaction is ending"


def test_a_commit_marker_commits_the_pending_offsets_once(open_same_store: OpenStore) -> None:
    store = open_same_store()
    store.commit_offsets("g", {("t", 0): CommittedOffset(1), ("t", 9): CommittedOffset(2)})
    _open_txn(store, groups=("g", "elsewhere"))
    store.stage_txn_offsets("txn", "g", 42, 3, {("t", 0): CommittedOffset(5, "m", 7)})
    store.stage_txn_offsets("txn", "elsewhere", 42, 3, {("t", 0): CommittedOffset(6)})
    in_g = lambda group: group == "g"  # noqa: E731 (the groups of the shard the marker is for)
    assert store.complete_txn_offsets(42, 3, True, in_g) == {}, "still Ongoing: a stale marker changes nothing"
    assert store.complete_txn_offsets(42, 3, False, in_g) == {}
    _open_txn(store, "PrepareCommit", groups=("g", "elsewhere"))
    assert store.complete_txn_offsets(42, 3, False, in_g) == {}, "not the result the coordinator prepared"
    assert store.complete_txn_offsets(42, 2, True, in_g) == {}, "not the epoch the coordinator prepared"
    store.close()
    store = open_same_store()  # (the pending offsets are durable)
    assert store.complete_txn_offsets(42, 3, True, in_g) == {"g": {("t", 0): CommittedOffset(5, "m", 7)}}
    assert store.committed_offsets("g") == {("t", 0): CommittedOffset(5, "m", 7), ("t", 9): CommittedOffset(2)}
    assert store.pending_txn_offsets() == {"elsewhere": {("t", 0): 42}}, "another shard's group waits for its marker"
    assert store.complete_txn_offsets(42, 3, True, in_g) == {}, "a repeated marker"
    assert store.committed_offsets("g") == {("t", 0): CommittedOffset(5, "m", 7), ("t", 9): CommittedOffset(2)}


def test_an_abort_marker_drops_the_pending_offsets(store: MetadataStore) -> None:
    store.commit_offsets("g", {("t", 0): CommittedOffset(1)})
    _open_txn(store)
    store.stage_txn_offsets("txn", "g", 42, 3, {("t", 0): CommittedOffset(5)})
    _open_txn(store, "PrepareAbort", epoch=4)  # a timeout abort bumps the epoch
    assert store.complete_txn_offsets(42, 4, False, lambda _: True) == {"g": {("t", 0): CommittedOffset(5)}}
    assert store.committed_offsets("g") == {("t", 0): CommittedOffset(1)}
    assert store.pending_txn_offsets() == {}
