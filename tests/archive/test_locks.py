"""The data directory's locks across processes (flock): one archiver, and an upsert table's turns between its
archive passes and its compaction. The end-to-end turns (a compaction landing under a steady stream of updates)
are in test_maintenance.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from icelog.archive.locks import ArchiverLock, WriterTurns
from icelog.errors import IcelogError

SRC = Path(__file__).resolve().parents[2] / "src"


def hold_in_another_process(code: str) -> subprocess.Popen[str]:
    """Run `code` (which takes a lock, then prints 'held' and sleeps) in a child; return once it holds it."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                             env={"PYTHONPATH": str(SRC)})
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_archiver_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    child = hold_in_another_process(f"""
        import time
        from icelog.archive.locks import ArchiverLock
        lock = ArchiverLock({str(tmp_path)!r})
        lock.acquire()
        print("held", flush=True); time.sleep(60)
    """)
    try:
        with pytest.raises(IcelogError, match="run one archiver per data directory"):
            ArchiverLock(tmp_path).acquire(wait_s=0.3)
    finally:
        child.kill()
        child.wait()
    lock = ArchiverLock(tmp_path)
    lock.acquire()  # free once the holder is gone (a killed archiver leaves no stale lock)
    lock.release()


def test_passes_skip_their_turn_while_a_compaction_runs_and_a_compaction_waits_for_passes(tmp_path: Path) -> None:
    turns = WriterTurns(tmp_path, "icelog.orders/é")
    child = hold_in_another_process(f"""
        import time
        from icelog.archive.locks import WriterTurns
        with WriterTurns({str(tmp_path)!r}, "icelog.orders/é").compacting():
            print("held", flush=True); time.sleep(60)
    """)
    try:
        with turns.writing() as mine:
            assert mine is False  # the pass skips; its records wait in the intake
        with pytest.raises(IcelogError, match="for over 0 s"), turns.compacting(wait_s=0.2):
            pass
    finally:
        child.kill()
        child.wait()
    with turns.writing() as mine, turns.writing() as another:  # passes share the lock
        assert mine and another
        started = time.monotonic()
        with pytest.raises(IcelogError), turns.compacting(wait_s=0.3):
            pass  # a compaction waits for the pass in flight (here: for ever, so it gives up)
        assert time.monotonic() - started >= 0.3
    with turns.compacting(wait_s=0), turns.writing() as mine:  # no pass in flight: at once
        assert mine is False
    assert turns.path.parent == tmp_path / "turns" and "/" not in turns.path.name
