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
    record = TransactionRecord(
        "txn", 42, 3, 60000, "PrepareCommit", (("t", 0), ("u", 2)),
        {"g": {("t", 0): CommittedOffset(11, "meta", 5)}},
    )
    first.save_transaction(record)
    first.save_transaction(TransactionRecord("another", 7, 0, 1000, "Empty"))
    first.close()
    again = open_same_store()
    assert again.transactions() == [TransactionRecord("another", 7, 0, 1000, "Empty"), record]
    again.save_transaction(TransactionRecord("txn", 42, 4, 60000, "CompleteCommit"))
    assert again.transactions()[1] == TransactionRecord("txn", 42, 4, 60000, "CompleteCommit")
