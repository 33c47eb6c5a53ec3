"""The local-files backend of the intake (log/storage.IntakeStorage): group commit into fsync'd intake files
(log/intake.py), reads through one descriptor cache, files deleted once no indexed chunk references them."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from icelog.config import IntakeSettings
from icelog.log import intake_file
from icelog.log.intake import IntakeFiles, IntakeWriter
from icelog.log.storage import Append, Capacity, ChunkLocation, IntakeReader, IntakeStats, OnDurable, OnNotWritten
from icelog.meta.store import IntakeChunk, IntakeIndex

log = logging.getLogger(__name__)


class LocalStorage:
    """Intake files in one directory of the broker's disk: today's behaviour, the embedded default."""

    assigns_offsets = False

    def __init__(self, directory: Path, index: IntakeIndex, settings: IntakeSettings) -> None:
        self.directory = directory
        self._index = index
        self.files = IntakeFiles(directory)
        self.writer = IntakeWriter(directory, index, settings)
        self.on_request: Callable[[str, int, float, bool], None] | None = None  # never called: no remote store

    # -- the Protocol's state -----------------------------------------------------------------
    @property
    def stats(self) -> IntakeStats:
        return self.writer.stats

    @property
    def on_commit(self) -> Callable[[int, int, float], None] | None:
        return self.writer.on_commit

    @on_commit.setter
    def on_commit(self, hook: Callable[[int, int, float], None] | None) -> None:
        self.writer.on_commit = hook

    @property
    def failed(self) -> BaseException | None:
        return self.writer.failed

    @property
    def unavailable(self) -> str | None:
        why = self.writer.store_unavailable
        return None if why is None else f"the metadata store is unavailable ({why})"

    # -- write, recover, release --------------------------------------------------------------
    def recover(self) -> list[IntakeChunk]:
        """Index whole frames written after the recorded tail, cut a torn tail, open the active file."""
        return self.writer.recover()

    def start(self, on_durable: OnDurable, on_not_written: OnNotWritten) -> None:
        self.writer.start(on_durable, on_not_written)

    def submit(self, append: Append) -> asyncio.Future[None]:
        return self.writer.submit(append)

    def failure(self) -> asyncio.Future[None]:
        return self.writer.failure()

    def release(self) -> int:
        """Delete intake files older than the active one that no indexed chunk references (the store says)."""
        candidates = [f for f in intake_file.list_files(self.directory) if f < self.writer.active_file_id]
        in_use = self._index.intake_files_in_use(candidates)
        deleted = 0
        for file_id in candidates:
            if file_id not in in_use:
                self.files.forget(file_id)
                intake_file.file_path(self.directory, file_id).unlink(missing_ok=True)
                log.info("deleted intake file %d: no partition needs it", file_id)
                deleted += 1
        return deleted

    def capacity(self) -> Capacity:
        """Free space of the file system holding the intake directory."""
        usage = shutil.disk_usage(self.directory)
        return Capacity(usage.free, usage.total, str(self.directory))

    # -- reads ----------------------------------------------------------------------------------
    def read(self, chunk: ChunkLocation, offset_in_chunk: int = 0, length: int = -1) -> bytes:
        return self.files.read(chunk, offset_in_chunk, length)

    def reader(self) -> IntakeReader:
        return IntakeFiles(self.directory)

    async def close(self) -> None:
        await self.writer.close()
        self.files.close()
