"""A continuous archiver whose store's archiver lock another process holds stands by (archive/locks.py
ArchiverLock.stand_by, cli/archive.py): with no JVM, for as long as the holder holds it, taking over within about a
second of its letting go; it stops at once on SIGTERM or when the broker that started it is gone. Over both backends
(a flock beside SQLite, a PostgreSQL advisory lock), with real `icelog archive` processes and no topic, so no Spark:
these run in the JVM-free lane, whose `java` refuses to start. The takeover with Spark, a kill -9 mid-pass and the
table's rows exactly once: tests/system/test_archiver_failover.py."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icelog.archive.locks import ArchiverLock, LockHeldError
from icelog.errors import StoreUnavailableError
from icelog.meta.backends import open_store
from icelog.meta.store import HeldLock, MetadataStore
from tests.meta.conftest import STORE_BACKENDS
from tests.support.archive import ArchiveChild


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORE_BACKENDS[request.param](request, tmp_path)


@pytest.fixture
def store(store_url: str) -> Iterator[MetadataStore]:
    opened = open_store(store_url)  # (a SQLite store's meta.db now exists: `icelog archive` refuses an empty dir)
    yield opened
    opened.close()


def archiver(tmp_path: Path, store_url: str, *args: str, command: str = "archive") -> ArchiveChild:
    """`icelog archive` (continuous) on this test's store, with archiving on but no topic: no Spark."""
    env = {"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg", **({"ICELOG_META_URL": store_url}
                                                        if store_url.startswith("postgresql") else {})}
    return ArchiveChild(tmp_path / f"{command}-{time.monotonic_ns()}.log", env, "--data-dir", str(tmp_path), *args,
                        command=command)


def test_the_brokers_archiver_stands_by_then_takes_over_within_a_second_or_two(
    tmp_path: Path, store_url: str, store: MetadataStore
) -> None:
    holder = ArchiverLock(store)
    holder.acquire()
    # As `icelog serve` starts it: its parent's pid (this process's) marks the broker's child, which stands by.
    standby = archiver(tmp_path, store_url, "--parent-pid", str(os.getpid()))
    try:
        standby.wait_for("standing by: another process holds the archiver.lock")
        where = "a PostgreSQL advisory lock in 127.0.0.1:" if store_url.startswith("postgresql") else (
            f"flock on {tmp_path / 'archiver.lock'}, pid {os.getpid()}")
        assert where in standby.log()
        time.sleep(2.5)  # a few tries of the lock: still waiting, said once, no JVM (this lane has none)
        assert standby.proc.poll() is None, standby.log()
        assert standby.log().count("standing by") == 1
        assert "Spark" not in standby.log()

        holder.release()  # the holder is gone: the standby takes the lock at its next try
        released = time.monotonic()
        standby.wait_for("took the archiver.lock after standing by")
        assert time.monotonic() - released < 5, "taken over within about a poll (1 s), not at some restart"
        with pytest.raises(LockHeldError):
            ArchiverLock(store).acquire(wait_s=0)
        standby.proc.send_signal(signal.SIGTERM)
        assert standby.exits_within(15) == 0
        ArchiverLock(store).acquire(wait_s=5)  # let go with its process
    finally:
        standby.kill_all()


def test_a_standby_stops_at_once_on_sigterm_and_when_its_broker_is_gone(
    tmp_path: Path, store_url: str, store: MetadataStore
) -> None:
    holder = ArchiverLock(store)
    holder.acquire()
    by_hand = archiver(tmp_path, store_url, "--standby")  # a dedicated archiver's (no broker): stands by when asked
    orphan = archiver(tmp_path, store_url, "--parent-pid", "1")  # a "broker" that is not its parent: gone
    try:
        by_hand.wait_for("standing by")
        by_hand.proc.send_signal(signal.SIGTERM)
        assert by_hand.exits_within(3) == 0
        assert "stopped while standing by" in by_hand.log()
        assert orphan.exits_within(30) == 0
        assert "the broker that started the archiver is gone" in orphan.log()
        with pytest.raises(LockHeldError):
            ArchiverLock(store).acquire(wait_s=0)  # (still ours: neither took it)
    finally:
        by_hand.kill_all()
        orphan.kill_all()
        holder.release()


def test_a_brokers_sinks_stand_by_while_another_process_runs_them(
    tmp_path: Path, store_url: str, store: MetadataStore
) -> None:
    """`icelog sink` as `icelog serve` starts it, while another broker's runs the sink: it stands by, no Spark."""
    config = tmp_path / "icelog.yaml"
    config.write_text("sinks:\n  mirror:\n    bootstrap_servers: 127.0.0.1:9\n    topics: [orders]\n")
    holder = ArchiverLock(store, "sink-mirror.lock")
    holder.acquire()
    standby = archiver(tmp_path, store_url, "--config", str(config), "--parent-pid", str(os.getpid()), command="sink")
    try:
        standby.wait_for("standing by: another process holds the sink-mirror.lock")
        time.sleep(1.5)
        assert standby.proc.poll() is None and "Spark" not in standby.log(), standby.log()
        standby.proc.send_signal(signal.SIGTERM)
        assert standby.exits_within(3) == 0
    finally:
        standby.kill_all()
        holder.release()


def test_a_standby_rides_out_a_store_it_cannot_reach(caplog: pytest.LogCaptureFixture) -> None:
    """The metadata store down while standing by: said once, tried again, the lock taken once it answers."""

    class Flaky:
        def __init__(self) -> None:
            self.tries = 0

        def try_lock(self, name: str, shared: bool = False) -> HeldLock | None:
            self.tries += 1
            if self.tries <= 3:
                raise StoreUnavailableError("PostgreSQL at 127.0.0.1:5432/meta cannot be reached: connection refused")
            return None if self.tries <= 5 else Held()

    class Held:
        def release(self) -> None:
            pass

    locks = Flaky()
    with caplog.at_level(logging.INFO, logger="icelog.archive.locks"):
        assert ArchiverLock(locks).stand_by(threading.Event(), poll_s=0.01)
    assert locks.tries == 6
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot be reached" in m for m in said) == 1
    assert sum("answers again" in m for m in said) == 1
    assert sum(m.startswith("standing by: another process holds") for m in said) == 1
    assert any(m.startswith("took the archiver.lock after standing by") for m in said)
    stop = threading.Event()
    stop.set()
    assert not ArchiverLock(Flaky()).stand_by(stop, poll_s=0.01)  # stopped: gives up, holds nothing
