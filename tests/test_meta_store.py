"""The metadata store behaviour suite: every backend must pass it unchanged.

Tests talk only to the MetadataStore interface. A backend joins by one entry in BACKENDS: a function from
the test's temporary directory to a store URL; opening that URL twice must reach the same database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from icelog.errors import StoreError, TopicExistsError, UnknownTopicError
from icelog.meta.store import IntakeChunk, IntakeTail, MetadataStore, TopicRecord, open_store

BACKENDS: dict[str, Callable[[Path], str]] = {
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'meta.db'}",
}

OpenStore = Callable[[], MetadataStore]


@pytest.fixture(params=sorted(BACKENDS))
def open_same_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens (or re-opens) the one database of this test; every store opened is closed afterwards."""
    url = BACKENDS[request.param](tmp_path)
    opened: list[MetadataStore] = []

    def open_() -> MetadataStore:
        opened.append(open_store(url))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()  # closing twice is allowed (a test may have closed it already)


@pytest.fixture
def store(open_same_store: OpenStore) -> MetadataStore:
    return open_same_store()


def chunk(topic_id: uuid.UUID, partition: int, base: int, end: int, file_id: int = 1, position: int = 56,
          length: int = 100, max_timestamp: int = 1_000) -> IntakeChunk:
    return IntakeChunk(topic_id, partition, base, end, file_id, position, length, max_timestamp)


def offsets(store: MetadataStore, topic_id: uuid.UUID) -> list[tuple[int, int]]:
    """(log start offset, high watermark) of each partition."""
    return [(p.log_start_offset, p.high_watermark) for p in store.partitions(topic_id)]


# -- topics ----------------------------------------------------------------------------------------
def test_create_get_list_topics(store: MetadataStore) -> None:
    created = store.create_topic("orders", 3, {"retention.ms": "1000"})
    store.create_topic("audit", 1, {})

    assert created.name == "orders" and created.partitions == 3
    assert created.configs == {"retention.ms": "1000"}
    assert store.get_topic("orders") == created
    assert store.get_topic("missing") is None
    assert [t.name for t in store.list_topics()] == ["audit", "orders"]
    assert offsets(store, created.topic_id) == [(0, 0)] * 3


def test_topic_ids_are_unique_and_stable(store: MetadataStore) -> None:
    first = store.create_topic("a", 1, {})
    second = store.create_topic("b", 1, {})
    assert first.topic_id != second.topic_id
    assert store.get_topic("a") == first
    assert store.get_topic("b") == second


def test_create_existing_topic_fails_and_changes_nothing(store: MetadataStore) -> None:
    original = store.create_topic("orders", 2, {"retention.ms": "1000"})
    with pytest.raises(TopicExistsError):
        store.create_topic("orders", 5, {"retention.ms": "5"})
    assert store.get_topic("orders") == original
    assert len(store.partitions(original.topic_id)) == 2


def test_create_topic_without_partitions_fails(store: MetadataStore) -> None:
    with pytest.raises(StoreError):
        store.create_topic("empty", 0, {})
    assert store.get_topic("empty") is None


def test_delete_topic_removes_it_and_its_data(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {"retention.ms": "1000"})
    store.commit_intake([chunk(topic.topic_id, 0, 0, 10)], IntakeTail(1, 156))

    deleted = store.delete_topic("orders")

    assert deleted.topic_id == topic.topic_id
    assert store.get_topic("orders") is None
    assert store.list_topics() == []
    assert store.partitions(topic.topic_id) == []
    assert store.intake_chunks(topic.topic_id) == []
    # The name is free again and the new topic starts empty, with a new id and no old configs.
    again = store.create_topic("orders", 1, {})
    assert again.topic_id != topic.topic_id
    assert again.configs == {}
    assert offsets(store, again.topic_id) == [(0, 0)]


def test_unknown_topic_errors(store: MetadataStore) -> None:
    with pytest.raises(UnknownTopicError):
        store.delete_topic("missing")
    with pytest.raises(UnknownTopicError):
        store.add_partitions("missing", 3)
    with pytest.raises(UnknownTopicError):
        store.alter_topic_configs("missing", {"retention.ms": "1"})


def test_set_and_delete_configs(store: MetadataStore) -> None:
    store.create_topic("orders", 1, {"retention.ms": "1000", "max.message.bytes": "2000"})

    after = store.alter_topic_configs(
        "orders", {"retention.ms": "5000", "retention.bytes": "10"}, delete_keys=["max.message.bytes"]
    )

    expected = {"retention.ms": "5000", "retention.bytes": "10"}
    assert after.configs == expected
    assert store.get_topic("orders") == after
    # Deleting a key that is not set is not an error.
    assert store.alter_topic_configs("orders", {}, delete_keys=["segment.ms"]).configs == expected


def test_add_partitions(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {})
    store.commit_intake([chunk(topic.topic_id, 1, 0, 7)], IntakeTail(1, 156))

    grown = store.add_partitions("orders", 5)

    assert grown.partitions == 5 and grown.topic_id == topic.topic_id
    assert [p.partition for p in store.partitions(topic.topic_id)] == [0, 1, 2, 3, 4]
    # Existing partitions keep their offsets; new ones start empty.
    assert offsets(store, topic.topic_id) == [(0, 0), (0, 7), (0, 0), (0, 0), (0, 0)]
    with pytest.raises(StoreError):
        store.add_partitions("orders", 5)
    with pytest.raises(StoreError):
        store.add_partitions("orders", 3)
    assert store.get_topic("orders") == grown


# -- intake index ----------------------------------------------------------------------------------
def test_commit_intake_indexes_chunks_and_advances_high_watermarks(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    first = [chunk(tid, 0, 0, 5, position=56), chunk(tid, 1, 0, 3, position=212)]
    second = [chunk(tid, 0, 5, 9, position=368)]

    store.commit_intake(first, IntakeTail(1, 312))
    assert offsets(store, tid) == [(0, 5), (0, 3)]
    store.commit_intake(second, IntakeTail(1, 468))

    assert offsets(store, tid) == [(0, 9), (0, 3)]
    assert store.intake_chunks(tid) == [first[0], second[0], first[1]]
    assert store.intake_tail() == IntakeTail(1, 468)


def test_commit_intake_is_idempotent(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    chunks = [chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 8, position=212)]
    store.commit_intake(chunks, IntakeTail(1, 312))

    # Recovery replays frames the index already covers, possibly together with new ones.
    store.commit_intake(chunks, IntakeTail(1, 312))
    store.commit_intake([chunks[1], chunk(tid, 0, 8, 9, position=368)], IntakeTail(1, 468))

    assert store.intake_chunks(tid) == [*chunks, chunk(tid, 0, 8, 9, position=368)]
    assert offsets(store, tid) == [(0, 9)]
    # Replaying an old chunk never moves the high watermark back.
    store.commit_intake([chunks[0]], IntakeTail(1, 468))
    assert offsets(store, tid) == [(0, 9)]


def test_commit_intake_ignores_chunks_of_deleted_topics(store: MetadataStore) -> None:
    gone = store.create_topic("gone", 1, {})
    kept = store.create_topic("kept", 1, {})
    store.delete_topic("gone")

    # A frame written just before DeleteTopics becomes durable (or is recovered) afterwards.
    store.commit_intake([chunk(gone.topic_id, 0, 0, 4), chunk(kept.topic_id, 0, 0, 2, position=212)],
                        IntakeTail(2, 312))

    assert store.intake_chunks(gone.topic_id) == []
    assert store.partitions(gone.topic_id) == []
    assert store.get_topic("gone") is None
    assert offsets(store, kept.topic_id) == [(0, 2)]
    assert store.intake_chunks() == [chunk(kept.topic_id, 0, 0, 2, position=212)]
    assert store.intake_tail() == IntakeTail(2, 312)


def test_commit_intake_ignores_chunks_of_missing_partitions(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 1, {})
    store.commit_intake([chunk(topic.topic_id, 3, 0, 4)], IntakeTail(1, 156))
    assert store.intake_chunks() == []
    assert offsets(store, topic.topic_id) == [(0, 0)]


def test_intake_tail(store: MetadataStore) -> None:
    assert store.intake_tail() is None
    store.commit_intake([], IntakeTail(1, 0))
    assert store.intake_tail() == IntakeTail(1, 0)
    store.commit_intake([], IntakeTail(3, 4096))
    assert store.intake_tail() == IntakeTail(3, 4096)


def test_intake_chunks_filter_by_topic(store: MetadataStore) -> None:
    a = store.create_topic("a", 1, {})
    b = store.create_topic("b", 1, {})
    store.commit_intake(
        [chunk(a.topic_id, 0, 0, 1), chunk(b.topic_id, 0, 0, 2, position=200)], IntakeTail(1, 300)
    )
    assert store.intake_chunks(a.topic_id) == [chunk(a.topic_id, 0, 0, 1)]
    assert store.intake_chunks(b.topic_id) == [chunk(b.topic_id, 0, 0, 2, position=200)]
    assert len(store.intake_chunks()) == 2


def test_trim_intake_moves_log_start_and_drops_chunks(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    p0 = [chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 10, position=200), chunk(tid, 0, 10, 12, position=400)]
    p1 = [chunk(tid, 1, 0, 4, position=600)]
    store.commit_intake([*p0, *p1], IntakeTail(1, 700))

    store.trim_intake(tid, 0, 10)

    assert store.intake_chunks(tid) == [p0[2], *p1]
    assert offsets(store, tid) == [(10, 12), (0, 4)]
    # A start inside a chunk keeps that chunk: its later records are still readable.
    store.trim_intake(tid, 0, 11)
    assert store.intake_chunks(tid) == [p0[2], *p1]
    assert offsets(store, tid) == [(11, 12), (0, 4)]
    # The log start never moves backwards.
    store.trim_intake(tid, 0, 3)
    assert offsets(store, tid) == [(11, 12), (0, 4)]


def test_trim_to_high_watermark_empties_the_partition(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    store.commit_intake([chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 9, position=200)], IntakeTail(1, 300))
    store.trim_intake(tid, 0, 9)
    assert store.intake_chunks(tid) == []
    assert offsets(store, tid) == [(9, 9)]
    # New appends continue after the trimmed offsets.
    store.commit_intake([chunk(tid, 0, 9, 11, file_id=2, position=56)], IntakeTail(2, 156))
    assert offsets(store, tid) == [(9, 11)]


def test_reopen_keeps_everything(open_same_store: OpenStore) -> None:
    store = open_same_store()
    orders = store.create_topic("orders", 2, {"retention.ms": "1000"})
    gone = store.create_topic("gone", 1, {})
    store.add_partitions("orders", 3)
    store.alter_topic_configs("orders", {"retention.bytes": "100"})
    tid = orders.topic_id
    chunks = [chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 9, position=200), chunk(tid, 2, 0, 1, position=400)]
    store.commit_intake(chunks, IntakeTail(4, 500))
    store.trim_intake(tid, 0, 5)
    store.delete_topic("gone")
    before = (store.list_topics(), offsets(store, tid), store.intake_chunks(), store.intake_tail())
    store.close()

    reopened = open_same_store()

    after = (reopened.list_topics(), offsets(reopened, tid), reopened.intake_chunks(), reopened.intake_tail())
    assert after == before
    assert reopened.get_topic("orders") == TopicRecord(
        "orders", tid, 3, {"retention.ms": "1000", "retention.bytes": "100"}
    )
    assert offsets(reopened, tid) == [(5, 9), (0, 0), (0, 1)]
    assert reopened.intake_chunks() == chunks[1:]
    assert reopened.intake_tail() == IntakeTail(4, 500)
    assert reopened.get_topic("gone") is None and reopened.partitions(gone.topic_id) == []


# -- archive table columns (field ids of tables with a Protobuf schema) ---------------------------------------
def test_table_columns_are_replaced_per_table_and_survive_reopen(open_same_store: OpenStore) -> None:
    from icelog.meta.store import TableColumn

    store = open_same_store()
    assert store.table_columns("icelog.a") == []
    v1 = [TableColumn("value", 2, "struct"), TableColumn("key", 1, "struct"), TableColumn("value.amount", 3, "int")]
    store.save_table_columns("icelog.a", v1)
    store.save_table_columns("icelog.b", v1[:1])
    v2 = [
        TableColumn("key", 1, "struct"),
        TableColumn("value", 2, "struct"),
        TableColumn("value.amount__v1", 3, "int", deleted=True),
        TableColumn("value.amount", 4, "string"),
    ]
    store.save_table_columns("icelog.a", v2)
    store.close()
    reopened = open_same_store()
    assert reopened.table_columns("icelog.a") == v2  # ordered by field id, the old path gone
    assert reopened.table_columns("icelog.b") == v1[:1]
