"""Exclusive locks in the data directory (flock, held open for as long as the holder runs).

`archiver.lock`: one archiver per data directory (two would append the same records twice).
`maintenance.lock`: one maintenance round at a time, the archiver's or `icelog maintain`'s.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from icelog.errors import IcelogError


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
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.close()
                    hint = (
                        "run one archiver per data directory" if self.path.name == "archiver.lock"
                        else "a maintenance round is running there; try again when it ends"
                    )
                    raise IcelogError(f"another process holds {self.path}; {hint}") from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
