"""The metadata store behaviour suite: every backend must pass it unchanged.

Tests talk only to the MetadataStore interface. The `store` and `open_same_store` fixtures (tests/meta/conftest.py)
run each test once per backend in STORE_BACKENDS.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from icelog.errors import StoreError, TopicExistsError, UnknownTopicError
from icelog.meta.store import (
    CommittedOffset,
    IntakeChunk,
    IntakeTail,
    MetadataStore,
    TopicRecord,
    TransactionRecord,
)
from tests.meta.conftest import OpenStore


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


def test_delete_topic_drops_every_groups_offsets_of_it(store: MetadataStore) -> None:
    """Kafka deletes a topic's committed offsets with it, whichever broker coordinates the groups."""
    store.create_topic("orders", 2, {})
    for group in ("g1", "g2"):
        store.commit_offsets(group, {("orders", 0): CommittedOffset(3), ("orders", 1): CommittedOffset(4),
                                     ("kept", 0): CommittedOffset(5)})
    store.save_transaction(TransactionRecord("txn", 42, 3, 60000, "Ongoing", (("out", 0),), ("g1",)))
    assert store.stage_txn_offsets("txn", "g1", 42, 3, {("orders", 1): CommittedOffset(9),
                                                         ("kept", 1): CommittedOffset(2)}).staged

    store.delete_topic("orders")

    for group in ("g1", "g2"):
        assert store.committed_offsets(group) == {("kept", 0): CommittedOffset(5)}
    assert store.pending_txn_offsets() == {"g1": {("kept", 1): 42}}


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


def test_commit_sequenced_assigns_offsets_from_each_partitions_committed_end(store: MetadataStore) -> None:
    """The sequencer: chunks come numbered from 0; the commit gives each its partition's high watermark."""
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    first = store.commit_sequenced([chunk(tid, 0, 0, 5, file_id=1, position=56),
                                    chunk(tid, 1, 0, 3, file_id=1, position=212)], IntakeTail(1, 312))
    second = store.commit_sequenced([chunk(tid, 0, 0, 4, file_id=2, position=56)], IntakeTail(2, 156))

    assert [(c.partition, c.base_offset, c.end_offset, c.file_id, c.position) for c in first + second] == [
        (0, 0, 5, 1, 56), (1, 0, 3, 1, 212), (0, 5, 9, 2, 56)]
    assert offsets(store, tid) == [(0, 9), (0, 3)]
    assert store.intake_chunks(tid) == [first[0], second[0], first[1]]
    assert store.intake_tail() == IntakeTail(2, 156)
    assert store.intake_range_summary(tid, 0, 0).chunks == 2 and store.intake_range_summary(tid, 0, 0).bytes == 200


def test_commit_sequenced_retried_for_a_committed_object_assigns_nothing_again(store: MetadataStore) -> None:
    """A commit whose answer was lost is retried: the store returns the object's chunks as committed."""
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    sent = [chunk(tid, 0, 0, 5, file_id=1)]
    first = store.commit_sequenced(sent, IntakeTail(1, 156))
    assert store.commit_sequenced(sent, IntakeTail(1, 156)) == first
    assert offsets(store, tid) == [(0, 5)] and store.intake_chunks(tid) == first


def test_commit_sequenced_skips_deleted_partitions(store: MetadataStore) -> None:
    gone = store.create_topic("gone", 1, {})
    kept = store.create_topic("kept", 1, {})
    store.delete_topic("gone")
    assigned = store.commit_sequenced([chunk(gone.topic_id, 0, 0, 2, position=56),
                                       chunk(kept.topic_id, 0, 0, 3, position=212)], IntakeTail(1, 312))
    assert [(c.topic_id, c.base_offset, c.end_offset) for c in assigned] == [(kept.topic_id, 0, 3)]
    assert store.intake_chunks() == assigned


def test_two_writers_sequencing_one_partition_get_one_order(open_same_store: OpenStore) -> None:
    """Two brokers' stores over one database (issue 46): their commits to one partition take consecutive offsets."""
    a, b = open_same_store(), open_same_store()
    tid = a.create_topic("orders", 1, {}).topic_id
    got = []
    for object_id in range(1, 7):
        writer = a if object_id % 2 else b
        got += writer.commit_sequenced([chunk(tid, 0, 0, object_id, file_id=object_id)], IntakeTail(object_id, 156))
    assert [(c.base_offset, c.end_offset) for c in got] == [(0, 1), (1, 3), (3, 6), (6, 10), (10, 15), (15, 21)]
    assert a.intake_chunks(tid) == b.intake_chunks(tid) == got


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


def test_retention_start_only_moves_forward_and_survives_reopen(open_same_store: OpenStore) -> None:
    store = open_same_store()
    tid = store.create_topic("orders", 2, {}).topic_id
    assert [p.retention_start_offset for p in store.partitions(tid)] == [0, 0]
    store.move_retention_start(tid, 1, 40)
    store.move_retention_start(tid, 1, 25)  # never back
    store.close()
    again = open_same_store()
    assert [(p.retention_start_offset, p.log_start_offset) for p in again.partitions(tid)] == [(0, 0), (40, 0)]


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
    from icelog.table.field_ids import TableColumn

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


# -- bounded reads of the intake index (the archiver's poll) ------------------------------------------
def test_intake_chunks_after_starts_at_the_chunk_holding_the_offset_and_is_bounded(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    p0 = [chunk(tid, 0, base, base + 10, position=100 * base) for base in range(0, 100, 10)]
    p1 = [chunk(tid, 1, 0, 3, position=99_000)]
    store.commit_intake([*p0, *p1], IntakeTail(1, 100_000))

    assert store.intake_chunks_after(tid, 0, 0, 3) == p0[:3]
    assert store.intake_chunks_after(tid, 0, 25, 3) == p0[2:5], "from the chunk holding offset 25"
    assert store.intake_chunks_after(tid, 0, 30, 100) == p0[3:]
    assert store.intake_chunks_after(tid, 0, 100, 100) == [], "nothing at or past the high watermark"
    assert store.intake_chunks_after(tid, 1, 0, 100) == p1
    store.trim_intake(tid, 0, 50)
    assert store.intake_chunks_after(tid, 0, 20, 2) == p0[5:7], "below the log start: the first chunk kept"


def test_commit_intake_does_not_index_chunks_a_trim_dropped(store: MetadataStore) -> None:
    """Recovery replaying frames from an older tail (after a power loss) must not resurrect trimmed chunks."""
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    chunks = [chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 9, position=200)]
    store.commit_intake(chunks, IntakeTail(1, 300))
    store.trim_intake(tid, 0, 5)

    store.commit_intake(chunks, IntakeTail(1, 300))

    assert store.intake_chunks(tid) == [chunks[1]]
    assert offsets(store, tid) == [(5, 9)]


# -- producer-state snapshots ---------------------------------------------------------------------------
def test_producer_snapshots_keep_the_newest_and_go_with_their_topic(open_same_store: OpenStore) -> None:
    from icelog.meta.store import ProducerSnapshot

    store = open_same_store()
    orders = store.create_topic("orders", 2, {})
    other = store.create_topic("other", 1, {})
    tid = orders.topic_id
    store.save_producer_snapshots([ProducerSnapshot(tid, 0, 10, "a"), ProducerSnapshot(tid, 1, 4, "b"),
                                   ProducerSnapshot(other.topic_id, 0, 1, "c")])
    store.save_producer_snapshots([ProducerSnapshot(tid, 0, 7, "older"), ProducerSnapshot(tid, 1, 9, "newer")])
    store.save_producer_snapshots([ProducerSnapshot(tid, 5, 1, "no such partition")])
    store.close()

    again = open_same_store()
    snapshots = {(s.topic_id, s.partition): (s.offset, s.state) for s in again.producer_snapshots()}
    assert snapshots == {(tid, 0): (10, "a"), (tid, 1): (9, "newer"), (other.topic_id, 0): (1, "c")}
    # One partition's, by key (what a broker of a cluster reads when it takes the partition over).
    assert again.producer_snapshot(tid, 1) == ProducerSnapshot(tid, 1, 9, "newer")
    assert again.producer_snapshot(tid, 5) is None
    again.delete_topic("orders")
    assert [(s.topic_id, s.partition) for s in again.producer_snapshots()] == [(other.topic_id, 0)]
    assert again.producer_snapshot(tid, 0) is None


# -- durability: what a client is answered about is on disk first --------------------------------------
Probe = Callable[[Callable[[], object]], list[bool]]


def _sqlite_durable_commits(store: MetadataStore, request: pytest.FixtureRequest) -> Probe:
    """For each transaction the call commits: was it committed with synchronous=FULL (fsync'd WAL)?"""
    conn = store._db.conn  # type: ignore[attr-defined]

    def probe(call: Callable[[], object]) -> list[bool]:
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            call()
        finally:
            conn.set_trace_callback(None)
        commits = []
        level = conn.execute("PRAGMA synchronous").fetchone()[0]  # 1 NORMAL, 2 FULL
        for statement in statements:
            text = statement.strip().upper().replace(" ", "")
            if text.startswith("PRAGMASYNCHRONOUS="):
                level = 2 if text.endswith("FULL") else 1
            elif text == "COMMIT":
                commits.append(level >= 2)
        return commits

    return probe


def _postgres_durable_commits(store: MetadataStore, request: pytest.FixtureRequest) -> Probe:
    """Did the call commit (write WAL), with synchronous_commit on, its commit records flushed when it returned?"""
    pool = store._db.pool  # type: ignore[attr-defined]
    cluster = request.getfixturevalue("postgres_cluster")

    def ask(query: str, *args: object) -> Any:
        with pool.connection() as conn:
            return conn.execute(query, args).fetchone()

    database = ask("SELECT current_database()")[0]
    cluster.psql("CREATE EXTENSION IF NOT EXISTS pg_walinspect", database)

    def commits_between(start: str, end: str) -> int:
        """Commit records in [start, end), once the WAL writer has flushed them (pg_walinspect reads only flushed
        WAL). The server's own background records (a standby snapshot every 15 s, autovacuum) may follow the
        call's commit unflushed: they are no sign of an asynchronous commit, only commit records are."""
        deadline = time.monotonic() + 10
        while not ask("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", end)[0]:
            assert time.monotonic() < deadline, f"the WAL writer never flushed up to {end}"
            time.sleep(0.01)
        return int(cluster.psql(f"SELECT count(*) FROM pg_get_wal_records_info('{start}', '{end}') "
                                "WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'", database))

    def probe(call: Callable[[], object]) -> list[bool]:
        before = ask("SELECT pg_current_wal_insert_lsn()::text")[0]
        call()
        # (flushed first: by the time the insert position is read, nothing of the call may be left unflushed)
        flushed, inserted = ask("SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_insert_lsn()::text")
        if not ask("SELECT %s::pg_lsn > %s::pg_lsn", inserted, before)[0]:
            return []  # committed nothing
        synchronous = ask("SELECT current_setting('synchronous_commit')")[0] != "off"
        return [synchronous and (flushed == inserted or commits_between(flushed, inserted) == 0)]

    return probe


DURABILITY_PROBES: dict[str, Callable[[MetadataStore, pytest.FixtureRequest], Probe]] = {
    "sqlite": _sqlite_durable_commits,
    "postgresql": _postgres_durable_commits,
}
# Is the intake index's group commit durable itself? SQLite's may lose its last rows to a power loss, which
# recovery re-indexes from the fdatasync'd intake frames (NORMAL, off the produce path's fsync budget).
# PostgreSQL's is durable: the database outlives the broker's machine, and rows it lost while the broker runs on
# would leave a hole no recovery re-reads.
INTAKE_INDEX_DURABLE = {"sqlite": False, "postgresql": True}


def test_every_write_a_client_is_answered_about_is_durable(
    store: MetadataStore, request: pytest.FixtureRequest
) -> None:
    from icelog.meta.store import CommittedOffset, TransactionRecord

    backend = request.node.callspec.params["open_same_store"]
    durable = DURABILITY_PROBES[backend](store, request)
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    store.commit_intake([chunk(tid, 0, 0, 5), chunk(tid, 0, 5, 9, position=200)], IntakeTail(1, 300))
    answered: dict[str, Callable[[], object]] = {
        "create_topic": lambda: store.create_topic("more", 1, {}),
        "alter_topic_configs": lambda: store.alter_topic_configs("orders", {"retention.ms": "5"}),
        "add_partitions": lambda: store.add_partitions("more", 2),
        "delete_topic": lambda: store.delete_topic("more"),
        "allocate_producer_ids": lambda: store.allocate_producer_ids(1000),
        "commit_offsets": lambda: store.commit_offsets("g", {("orders", 0): CommittedOffset(3)}),
        "delete_offsets": lambda: store.delete_offsets("g", [("orders", 0)]),
        "save_transaction": lambda: store.save_transaction(TransactionRecord("t", 1, 0, 60000, "Ongoing", (), ("g",))),
        "stage_txn_offsets": lambda: store.stage_txn_offsets("t", "g", 1, 0, {("orders", 0): CommittedOffset(4)}),
        "save_transaction (PrepareCommit)": lambda: store.save_transaction(
            TransactionRecord("t", 1, 0, 60000, "PrepareCommit", (), ("g",))),
        "complete_txn_offsets": lambda: store.complete_txn_offsets(1, 0, True, lambda _: True),
        "trim_intake (files are deleted next)": lambda: store.trim_intake(tid, 0, 5),
        "move_retention_start (consumers are refused below it)": lambda: store.move_retention_start(tid, 0, 5),
        "registry_add_version": lambda: store.registry_add_version("s", "PROTOBUF", "x", [], "fp", None),
        "registry_set_compatibility": lambda: store.registry_set_compatibility("s", "NONE"),
        "registry_delete_versions": lambda: store.registry_delete_versions("s", [1], permanent=False),
    }
    for name, call in answered.items():
        commits = durable(call)
        assert commits and all(commits), f"{name} must be durable before the client is answered: {commits}"
    assert durable(lambda: store.commit_intake([chunk(tid, 0, 9, 10, position=400)], IntakeTail(1, 500))) == [
        INTAKE_INDEX_DURABLE[backend]
    ]


# -- the partition's chunk index without loading it (start-up, Fetch, ListOffsets, status) -----------
def test_partition_intake_totals_follow_commits_trims_and_reopen(open_same_store: OpenStore) -> None:
    store = open_same_store()
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    p0 = [chunk(tid, 0, base, base + 10, position=100 * base, length=100 + base) for base in range(0, 50, 10)]
    store.commit_intake([*p0, chunk(tid, 1, 0, 3, length=7)], IntakeTail(1, 10_000))
    store.commit_intake(p0[:2], IntakeTail(1, 10_000))  # a replay indexes nothing twice

    totals = [(p.intake_chunks, p.intake_bytes) for p in store.partitions(tid)]
    assert totals == [(5, sum(c.length for c in p0)), (1, 7)]
    store.trim_intake(tid, 0, 25)  # drops the chunks ending at 10 and 20
    assert [(p.intake_chunks, p.intake_bytes) for p in store.partitions(tid)][0] == (3, sum(c.length for c in p0[2:]))
    store.close()
    assert [(p.intake_chunks, p.intake_bytes) for p in open_same_store().partitions(tid)] == [
        (3, sum(c.length for c in p0[2:])), (1, 7)
    ]


def test_intake_index_queries_by_tail_time_range_and_file(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 1, {})
    tid = topic.topic_id
    times = [5_000, 7_000, 6_000, 9_000, 9_000, 8_000]
    chunks = [chunk(tid, 0, 10 * i, 10 * i + 10, file_id=1 + i // 3, position=100 * i, length=10 + i,
                    max_timestamp=ts) for i, ts in enumerate(times)]
    store.commit_intake(chunks, IntakeTail(2, 1_000))

    assert store.intake_last_chunks(tid, 0, 2) == chunks[4:], "the newest chunks, in offset order"
    assert store.intake_last_chunks(tid, 0, 100) == chunks
    assert store.intake_chunks_by_time(tid, 0, 0, 6_500, 2) == [chunks[1], chunks[3]]
    assert store.intake_chunks_by_time(tid, 0, 25, 6_500, 10) == [chunks[3], chunks[4], chunks[5]], (
        "from the chunk holding offset 25"
    )
    assert store.intake_chunks_by_time(tid, 0, 0, 9_001, 10) == []
    assert store.intake_max_timestamp_chunk(tid, 0) == chunks[3], "the first chunk with the largest timestamp"
    summary = store.intake_range_summary(tid, 0, 35)
    assert (summary.chunks, summary.bytes) == (3, 13 + 14 + 15)
    assert store.intake_range_summary(tid, 0, 60).chunks == 0
    assert store.intake_files_in_use([1, 2, 3]) == {1, 2}

    store.trim_intake(tid, 0, 30)
    assert store.intake_files_in_use([1, 2, 3]) == {2}, "file 1 held only trimmed chunks"
    assert store.intake_max_timestamp_chunk(tid, 0) == chunks[3]
    assert store.intake_chunks_by_time(tid, 0, 0, 0, 10) == chunks[3:]


def test_intake_bytes_below_counts_chunks_wholly_below_an_offset(store: MetadataStore) -> None:
    topic = store.create_topic("orders", 2, {})
    tid = topic.topic_id
    store.commit_intake([chunk(tid, 0, 10 * i, 10 * i + 10, position=100 * i, length=1 + i) for i in range(4)]
                        + [chunk(tid, 1, 0, 10, length=50)], IntakeTail(1, 1000))
    assert store.intake_bytes_below(tid, 0, 0) == 0
    assert store.intake_bytes_below(tid, 0, 25) == 1 + 2, "the chunk holding 25 is not wholly below it"
    assert store.intake_bytes_below(tid, 0, 40) == 1 + 2 + 3 + 4
    assert store.intake_bytes_below(tid, 1, 40) == 50
