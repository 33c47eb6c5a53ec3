"""ProcessLocks of the SQLite store: flock on files beside its database, which only processes of this machine see.

`<dir>/archiver.lock`, `<dir>/maintenance.lock`, `<dir>/turns/<table>.lock` (the names archive/locks.py gives),
held open for as long as the lock is held; the kernel lets go when the holder dies.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class FileLock:
    def __init__(self, handle: IO[str]) -> None:
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class FileLocks:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, name: str) -> Path:
        return self.directory / name

    def try_lock(self, name: str, shared: bool = False) -> FileLock | None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 - held open while the lock is held
        try:
            fcntl.flock(handle.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        if not shared:  # who holds it, for a person looking
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
        return FileLock(handle)
