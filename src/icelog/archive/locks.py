"""Locks among the processes that archive one metadata store's topics, on whatever machines they run.

`archiver.lock`: one archiver per metadata store (two would append the same records twice).
`maintenance.lock`: one maintenance round at a time, the archiver's or `icelog maintain`'s.
`turns/<table>.lock`: an upsert table's writer and its compaction take turns (WriterTurns).
The store keeps them (meta/store.ProcessLocks): flock files beside a SQLite database, PostgreSQL advisory
locks for a database every archiver shares. A holder that dies lets go.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

from icelog.errors import IcelogError
from icelog.meta.store import HeldLock, ProcessLocks

ARCHIVER_LOCK = "archiver.lock"


class LockHeldError(IcelogError):
    """Another process (or a pass in flight) holds the lock: try again once it has let go."""

    retriable = True


class ArchiverLock:
    """The store's `archiver.lock` (or `maintenance.lock`), exclusive, for as long as the holder runs."""

    def __init__(self, locks: ProcessLocks, name: str = ARCHIVER_LOCK) -> None:
        self.locks = locks
        self.name = name
        self._held: HeldLock | None = None

    def acquire(self, wait_s: float = 0.0) -> None:
        held = _take(self.locks, self.name, False, wait_s, poll_s=0.2)
        if held is None:
            hint = (
                "run one archiver per metadata store (with the archiver elsewhere, set archive.enabled: false on "
                "the broker)" if self.name == ARCHIVER_LOCK
                else "a maintenance round is running; try again when it ends"
            )
            raise LockHeldError(f"another process holds the {self.name.removesuffix('.lock')} lock; {hint}")
        self._held = held

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


class WriterTurns:
    """An upsert table's archive passes and its compaction take turns (the store's `turns/<table>.lock`).

    Every upsert commit replaces the deletion vectors of the data files it touches, and Iceberg refuses a
    compaction whose files got new deletes since it started: under a steady stream of updates every compaction
    lost the race, and the table grew without bound. A pass writes holding the lock shared, and skips its turn
    (its records wait in the intake) while a compaction holds it exclusively; a compaction waits for the pass
    in flight to end, then keeps the writer out until it has committed.
    """

    def __init__(self, locks: ProcessLocks, table_key: str) -> None:
        self.locks = locks
        self.name = f"turns/{re.sub(r'[^A-Za-z0-9._-]', '_', table_key)}.lock"

    @contextlib.contextmanager
    def writing(self) -> Iterator[bool]:
        """The writer's turn: True while held; False (nothing held) while a compaction runs."""
        held = self.locks.try_lock(self.name, shared=True)
        try:
            yield held is not None
        finally:
            if held is not None:
                held.release()

    @contextlib.contextmanager
    def compacting(self, wait_s: float = 60.0) -> Iterator[None]:
        """Compaction's turn, once the pass in flight (if any) has ended; LockHeldError after `wait_s`."""
        held = _take(self.locks, self.name, False, wait_s, poll_s=0.05)
        if held is None:
            raise LockHeldError(f"an archive pass held {self.name} for over {wait_s:.0f} s")
        try:
            yield
        finally:
            held.release()


def _take(locks: ProcessLocks, name: str, shared: bool, wait_s: float, poll_s: float) -> HeldLock | None:
    """The lock `name`, trying for up to `wait_s`; None if it was not taken."""
    deadline = time.monotonic() + wait_s
    while True:
        held = locks.try_lock(name, shared)
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(poll_s)
