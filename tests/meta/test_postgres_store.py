"""What only the PostgreSQL backend has: a versioned schema shared by several processes, and a server that can go
away and come back. (Its behaviour as a metadata store is the behaviour suite's, over every backend.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from icelog.errors import ConfigError, StoreUnavailableError
from icelog.meta.backends import open_store
from icelog.meta.postgres import PostgresStore, masked_url
from icelog.meta.postgres import schema as postgres_schema
from icelog.meta.store import BrokerLease, CommittedOffset, IntakeTail, TransactionRecord
from tests.support.postgres import PASSWORD, PostgresCluster, start_cluster


def _version(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        assert row is not None
        return int(row[0])


def test_a_new_database_gets_the_current_schema_version(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.new_database()
    open_store(url).close()
    assert _version(url) == max(postgres_schema.MIGRATIONS) == 4


def test_a_coordinators_transaction_write_is_fenced_by_its_shard_lease(postgres_cluster: PostgresCluster) -> None:
    """A cluster's transaction coordinator writes an id's state only while it holds the id's coordinator shard:
    once another broker took the shard (this one paused past its session), its write changes nothing."""
    from icelog.cluster.view import TXN_SHARDS_ID

    store = open_store(postgres_cluster.new_database())
    try:
        first, second = BrokerLease(0, "a"), BrokerLease(1, "b")
        shard = (TXN_SHARDS_ID, 7)
        for lease in (first, second):
            store.register_broker(lease, {"PLAINTEXT": ("127.0.0.1", 9092 + lease.node_id)}, None)
        assert store.claim_leaderships(first, [shard], 60000)
        assert store.save_transaction(TransactionRecord("t", 1, 0, 60000, "Ongoing"), (first, shard))
        store.release_leaderships(first, [shard])
        assert store.claim_leaderships(second, [shard], 60000)
        assert not store.save_transaction(TransactionRecord("t", 1, 0, 60000, "CompleteAbort"), (first, shard))
        assert store.transaction("t") == TransactionRecord("t", 1, 0, 60000, "Ongoing"), "the stale write is refused"
        assert store.save_transaction(TransactionRecord("t", 1, 1, 60000, "Empty"), (second, shard))
        assert store.transaction("t") == TransactionRecord("t", 1, 1, 60000, "Empty")
    finally:
        store.close()


def test_a_group_coordinators_offsets_are_fenced_by_its_shard_lease(
    postgres_cluster: PostgresCluster,
) -> None:
    """A cluster's group coordinator commits offsets, and stages and completes transactional ones, only while it holds
    the group's coordinator shard: once another broker took the shard, its writes change nothing (the new one loaded
    what was there)."""
    from icelog.cluster.view import GROUP_SHARDS_ID

    store = open_store(postgres_cluster.new_database())
    try:
        first, second = BrokerLease(0, "a"), BrokerLease(1, "b")
        shard = (GROUP_SHARDS_ID, 3)
        for lease in (first, second):
            store.register_broker(lease, {"PLAINTEXT": ("127.0.0.1", 9092 + lease.node_id)}, None)
        assert store.claim_leaderships(first, [shard], 60000)
        store.save_transaction(TransactionRecord("t", 1, 0, 60000, "Ongoing", (), ("g",)))
        offsets = {("in", 0): CommittedOffset(5)}
        assert store.stage_txn_offsets("t", "g", 1, 0, offsets, (first, shard)).staged
        store.release_leaderships(first, [shard])
        assert store.claim_leaderships(second, [shard], 60000)
        stale = store.stage_txn_offsets("t", "g", 1, 0, {("in", 1): CommittedOffset(9)}, (first, shard))
        assert not stale.staged and not stale.coordinated
        store.save_transaction(TransactionRecord("t", 1, 0, 60000, "PrepareCommit", (), ("g",)))
        assert store.complete_txn_offsets(1, 0, True, lambda _: True, (first, shard)) is None
        assert store.pending_txn_offsets() == {"g": {("in", 0): 1}}, "the stale coordinator changed nothing"
        assert store.complete_txn_offsets(1, 0, True, lambda _: True, (second, shard)) == {"g": offsets}
        assert store.committed_offsets("g") == offsets
        # Plain OffsetCommits likewise: the stale coordinator's is refused, the shard holder's stored.
        assert not store.commit_offsets("g", {("in", 0): CommittedOffset(2)}, (first, shard))
        assert store.committed_offsets("g") == offsets, "the stale commit changed nothing"
        assert store.commit_offsets("g", {("in", 0): CommittedOffset(8)}, (second, shard))
        assert store.committed_offsets("g") == {("in", 0): CommittedOffset(8)}
        # And a KIP-848 group's members and assignments.
        assert not store.save_consumer_group_state("g", 3, '{"stale":1}', (first, shard))
        assert store.consumer_group_states(3) == {}, "the stale coordinator stored nothing"
        assert store.save_consumer_group_state("g", 3, '{"held":1}', (second, shard))
        assert not store.save_consumer_group_state("g", 3, None, (first, shard))
        assert store.consumer_group_states(3) == {"g": '{"held":1}'}
    finally:
        store.close()


def test_a_database_of_a_newer_icelog_is_refused_naming_both_versions_and_the_fix(
    postgres_cluster: PostgresCluster,
) -> None:
    url = postgres_cluster.new_database()
    store = open_store(url)
    store.create_topic("orders", 1, {})
    store.close()
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE schema_version SET version = 7")

    with pytest.raises(postgres_schema.SchemaVersionError) as refused:
        open_store(url)
    message = str(refused.value)
    assert "schema version 7" in message and f"version {max(postgres_schema.MIGRATIONS)} " in message, message
    assert "run the newer icelog" in message and "meta_url" in message, "says how to fix it"
    assert PASSWORD not in message and "127.0.0.1:" in message
    assert not refused.value.retriable
    assert _version(url) == 7, "nothing changed"


def test_an_older_database_is_upgraded_step_by_step_keeping_its_data(
    postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = postgres_cluster.new_database()
    current = dict(postgres_schema.MIGRATIONS)
    # A database of the first release (version 1: no cluster tables yet).
    monkeypatch.setattr(postgres_schema, "MIGRATIONS", {1: current[1]})
    store = open_store(url)
    topic = store.create_topic("orders", 2, {"retention.ms": "5"})
    store.close()
    assert _version(url) == 1
    # This release, and one after it that adds a step: the next icelog opening it runs each missing step, once.
    later = max(current) + 1
    steps = {**current, later: ("ALTER TABLE topics ADD COLUMN note TEXT NOT NULL DEFAULT 'v-next'",)}
    monkeypatch.setattr(postgres_schema, "MIGRATIONS", steps)

    upgraded = open_store(url)
    assert upgraded.get_topic("orders") == topic
    assert upgraded.brokers(1000) == [], "version 2's tables (the cluster's) are there"
    upgraded.close()
    open_store(url).close()  # at the current version: nothing to do
    assert _version(url) == later
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT note FROM topics").fetchall() == [("v-next",)]


def test_processes_opening_a_new_database_at_once_create_it_once(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.new_database()
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_one() -> None:
        start.wait()
        try:
            stores.append(PostgresStore(url))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stores[0].create_topic("orders", 1, {})
    assert all(s.get_topic("orders") is not None for s in stores)
    for store in stores:
        store.close()
    assert _version(url) == max(postgres_schema.MIGRATIONS)


def test_an_unreachable_server_is_one_retriable_line_naming_host_and_port_never_the_password() -> None:
    with pytest.raises(StoreUnavailableError) as failed:
        open_store(f"postgresql://icelog:{PASSWORD}@127.0.0.1:9/meta")  # port 9 (discard): nothing listens
    message = str(failed.value)
    assert failed.value.retriable
    assert "127.0.0.1:9/meta" in message and "\n" not in message, message
    assert PASSWORD not in message


def test_urls_are_shown_with_the_password_masked() -> None:
    assert masked_url("postgresql://me:s3cret@db:5432/meta?sslmode=require") == (
        "postgresql://me:***@db:5432/meta?sslmode=require"
    )
    assert masked_url("postgresql://db/meta") == "postgresql://db/meta"
    with pytest.raises(ConfigError) as unsupported:
        open_store("mysql://me:s3cret@db/meta")
    assert "s3cret" not in str(unsupported.value)


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A server of the test's own: it is stopped and started."""
    cluster = start_cluster()
    yield cluster
    cluster.destroy()


def test_a_server_restart_fails_calls_retriably_then_the_same_store_works_again(own_cluster: PostgresCluster) -> None:
    store = open_store(own_cluster.new_database())
    topic = store.create_topic("orders", 1, {})
    own_cluster.stop("fast")

    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as down:
        store.commit_intake([], IntakeTail(1, 10))
    assert down.value.retriable and time.monotonic() - started < 15, "fails within the pool's wait, not forever"
    with pytest.raises(StoreUnavailableError):
        store.get_topic("orders")

    own_cluster.start()
    back = time.monotonic()
    while True:  # every pooled connection was broken: the store replaces them by itself, no reopen needed
        try:
            store.commit_intake([], IntakeTail(1, 10))
            break
        except StoreUnavailableError:
            assert time.monotonic() - back < 2, "works again within a probe interval of the server's return"
            time.sleep(0.05)
    assert store.get_topic("orders") == topic
    assert store.intake_tail() == IntakeTail(1, 10)
    store.close()
