"""Locks among the processes that archive one metadata store's topics, on whatever machines they run.

`archiver.lock`: one archiver per metadata store (two would append the same records twice). Every continuous
archiver of the store but its holder stands by for it (ArchiverLock.stand_by): with several brokers on one
store, each broker's archiver child waits, without a JVM, and the first to see the holder gone takes over.
`maintenance.lock`: one maintenance round at a time, the archiver's or `icelog maintain`'s.
`turns/<table>.lock`: an upsert table's writer and its compaction take turns (WriterTurns).
The store keeps them (meta/store.ProcessLocks): flock files beside a SQLite database, PostgreSQL advisory
locks for a database every archiver shares. A holder that dies lets go.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator

from icelog.errors import IcelogError, first_line
from icelog.meta.store import HeldLock, ProcessLocks

log = logging.getLogger(__name__)

ARCHIVER_LOCK = "archiver.lock"
# How often a standby tries the lock: the takeover comes within this (and a connection) of the holder's death. Each
# try is one short connection to PostgreSQL (meta/postgres/locks.py), so not much more often.
STANDBY_POLL_S = 1.0


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
                "the broker), or a continuous one with --standby to take over when it stops"
                if self.name == ARCHIVER_LOCK else "a maintenance round is running; try again when it ends"
            )
            raise LockHeldError(f"another process holds the {self.name.removesuffix('.lock')} lock; {hint}")
        self._held = held

    def stand_by(
        self, stop: threading.Event, still_wanted: Callable[[], bool] = lambda: True, where: str = "",
        poll_s: float = STANDBY_POLL_S,
    ) -> bool:
        """Wait for the lock for as long as it takes: True once held; False as soon as `stop` is set or
        `still_wanted()` says no (the broker that started this archiver is gone). Says once that it stands by
        (`where`: which lock, for the log). A store that cannot be reached is tried again, said once per outage."""
        started, said, away = time.monotonic(), False, False
        while True:
            try:
                held = self.locks.try_lock(self.name)
            except IcelogError as exc:
                if not exc.retriable:
                    raise
                if not away:
                    log.warning("standing by for the %s: the metadata store cannot be reached (%s); trying again",
                                self.name, first_line(exc))
                held, away = None, True
            else:
                if away:
                    log.info("the metadata store answers again; still standing by for the %s", self.name)
                away = False
            if held is not None:
                self._held = held
                if said:
                    log.info("took the %s after standing by for %.1f s", self.name, time.monotonic() - started)
                return True
            if not said and not away:
                log.info("standing by: another process holds the %s%s; taking over when it lets go (trying every "
                         "%.1f s)", self.name, f" ({where})" if where else "", poll_s)
                said = True
            if stop.wait(poll_s) or not still_wanted():
                return False

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
