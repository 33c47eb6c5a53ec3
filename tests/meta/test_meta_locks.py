"""The store's locks among processes (meta/store.ProcessLocks, as archive/locks.py uses them), over each backend:
one archiver per metadata store, one maintenance round, and an upsert table's turns between its archive passes
and its compaction. A holder that dies lets go. The end-to-end turns (a compaction landing under a steady stream
of updates) are in tests/archive/test_maintenance.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icelog.archive.locks import ArchiverLock, LockHeldError, WriterTurns
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from tests.meta.conftest import STORE_BACKENDS

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORE_BACKENDS[request.param](request, tmp_path)


@pytest.fixture
def locks(store_url: str) -> Iterator[MetadataStore]:
    store = open_store(store_url)
    yield store
    store.close()


def hold_in_another_process(url: str, code: str) -> subprocess.Popen[str]:
    """Run `code` (with `store` open on `url`; it takes a lock, prints 'held' and sleeps) in a child; return
    once it holds the lock."""
    prelude = f"import time\nfrom icelog.meta.backends import open_store\nstore = open_store({url!r})\n"
    child = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)], stdout=subprocess.PIPE,
                             text=True, env={"PYTHONPATH": str(SRC)})
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_archiver_is_refused_while_the_first_runs(store_url: str, locks: MetadataStore) -> None:
    child = hold_in_another_process(store_url, """
        from icelog.archive.locks import ArchiverLock
        lock = ArchiverLock(store)
        lock.acquire()
        print("held", flush=True); time.sleep(60)
    """)
    try:
        with pytest.raises(LockHeldError, match="run one archiver per metadata store") as info:
            ArchiverLock(locks).acquire(wait_s=0.3)
        assert info.value.retriable
        ArchiverLock(locks, "maintenance.lock").acquire()  # another name is another lock
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 10  # PostgreSQL lets go once it sees the connection gone
    lock = ArchiverLock(locks)
    lock.acquire(wait_s=10)  # free once the holder is gone (a killed archiver leaves no stale lock)
    assert time.monotonic() < deadline
    with pytest.raises(LockHeldError):
        ArchiverLock(locks).acquire(wait_s=0)  # held by this process now: held is held
    lock.release()
    ArchiverLock(locks).acquire(wait_s=0)


def test_passes_skip_their_turn_while_a_compaction_runs_and_a_compaction_waits_for_passes(
    store_url: str, locks: MetadataStore
) -> None:
    turns = WriterTurns(locks, "icelog.orders/é")
    child = hold_in_another_process(store_url, """
        from icelog.archive.locks import WriterTurns
        with WriterTurns(store, "icelog.orders/é").compacting():
            print("held", flush=True); time.sleep(60)
    """)
    try:
        with turns.writing() as mine:
            assert mine is False  # the pass skips; its records wait in the intake
        with pytest.raises(LockHeldError, match="for over 0 s"), turns.compacting(wait_s=0.2):
            pass
        with WriterTurns(locks, "icelog.other").writing() as other:
            assert other  # another table's turns are its own
    finally:
        child.kill()
        child.wait()
    with turns.writing() as mine, turns.writing() as another:  # passes share the lock
        assert mine and another
        started = time.monotonic()
        with pytest.raises(LockHeldError), turns.compacting(wait_s=0.3):
            pass  # a compaction waits for the pass in flight (here: for ever, so it gives up)
        assert time.monotonic() - started >= 0.3
    with turns.compacting(wait_s=10), turns.writing() as mine:  # no pass in flight: at once
        assert mine is False
    with turns.writing() as mine:  # the compaction let go
        assert mine
