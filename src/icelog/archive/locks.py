"""Locks in the data directory (flock, held open for as long as the holder runs).

`archiver.lock`: one archiver per data directory (two would append the same records twice).
`maintenance.lock`: one maintenance round at a time, the archiver's or `icelog maintain`'s.
`turns/<table>.lock`: an upsert table's writer and its compaction take turns (WriterTurns).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from icelog.errors import IcelogError


class LockHeldError(IcelogError):
    """Another process (or a pass in flight) holds the lock: try again once it has let go."""

    retriable = True


class ArchiverLock:
    """An exclusive lock on <data_dir>/archiver.lock: two archivers would append the same records twice.

    (Also <data_dir>/maintenance.lock: one maintenance round at a time, the archiver's or `icelog maintain`'s.)
    """

    def __init__(self, data_dir: Path, name: str = "archiver.lock") -> None:
        self.path = Path(data_dir) / name
        self._handle: IO[str] | None = None

    def acquire(self, wait_s: float = 0.0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held open while the lock is held
        if not _flock(handle, fcntl.LOCK_EX, wait_s, poll_s=0.2):
            handle.close()
            hint = (
                "run one archiver per data directory" if self.path.name == "archiver.lock"
                else "a maintenance round is running there; try again when it ends"
            )
            raise LockHeldError(f"another process holds {self.path}; {hint}")
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class WriterTurns:
    """An upsert table's archive passes and its compaction take turns (flock on <data_dir>/turns/<table>.lock).

    Every upsert commit replaces the deletion vectors of the data files it touches, and Iceberg refuses a
    compaction whose files got new deletes since it started: under a steady stream of updates every compaction
    lost the race, and the table grew without bound. A pass writes holding the lock shared, and skips its turn
    (its records wait in the intake) while a compaction holds it exclusively; a compaction waits for the pass
    in flight to end, then keeps the writer out until it has committed.
    """

    def __init__(self, data_dir: Path, table_key: str) -> None:
        self.path = Path(data_dir) / "turns" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', table_key)}.lock"

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.path, "a+")  # noqa: SIM115 - closed by the caller's context

    @contextlib.contextmanager
    def writing(self) -> Iterator[bool]:
        """The writer's turn: True while held; False (nothing held) while a compaction runs."""
        with self._open() as handle:
            yield _flock(handle, fcntl.LOCK_SH, wait_s=0)

    @contextlib.contextmanager
    def compacting(self, wait_s: float = 60.0) -> Iterator[None]:
        """Compaction's turn, once the pass in flight (if any) has ended; LockHeldError after `wait_s`."""
        with self._open() as handle:
            if not _flock(handle, fcntl.LOCK_EX, wait_s, poll_s=0.05):
                raise LockHeldError(f"an archive pass held {self.path} for over {wait_s:.0f} s")
            yield


def _flock(handle: IO[str], mode: int, wait_s: float, poll_s: float = 0.05) -> bool:
    """Take the flock `mode` on `handle`, trying for up to `wait_s`; whether it was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle.fileno(), mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
