"""Local copies of the tables' data files that live on object storage, for read-back.

A consumer reading archived offsets reads a large row group in windows of offsets (source.py), each a read of the
row group's pages: from a local file the page cache serves the repeats; from a bucket each one would be GETs of the
same bytes again. So a data file on object storage is copied whole to the broker's disk on its first read (one
streamed GET) and read from there. The copies are a cache: bounded by `archive.readback_file_cache_bytes` (least
recently used out first; a file larger than the bound is read from the bucket), emptied at start-up, never the
only copy of anything.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO, InputStream

log = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 8 * 1024 * 1024


def is_remote(location: str) -> bool:
    """Whether a data file lives on object storage (not a local or mounted path)."""
    return "://" in location and not location.startswith("file:")


class FileCopies:
    """Whole copies of remote data files in `directory`, at most `max_bytes` of them (thread-safe)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, tuple[Path, int]] = OrderedDict()  # location → (copy, size), LRU first
        self._bytes = 0
        self._lock = threading.Lock()
        if max_bytes > 0:
            shutil.rmtree(directory, ignore_errors=True)  # copies of a previous run: their files may be gone
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def entries(self) -> int:
        return len(self._files)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def open(self, io: FileIO, location: str) -> pa.NativeFile:
        """The data file for random reads: its local copy (made now if missing), or the file itself when it is local,
        the copies are off, or it is larger than they may hold."""
        import pyarrow as pa

        if self.max_bytes <= 0 or not is_remote(location):
            return io.new_input(location).open()  # type: ignore[return-value]
        with self._lock:
            held = self._files.get(location)
            if held is not None:
                self._files.move_to_end(location)
                return pa.OSFile(str(held[0]), "r")  # open before an eviction may unlink it: the reader keeps it
        source = io.new_input(location)
        size = len(source)
        if size > self.max_bytes:
            return source.open()  # type: ignore[return-value]
        copy = self._copy(source.open(), location)
        with self._lock:
            held = self._files.get(location)
            if held is not None:  # another reader copied it meanwhile: keep that one
                copy.unlink(missing_ok=True)
                self._files.move_to_end(location)
                return pa.OSFile(str(held[0]), "r")
            self._files[location] = (copy, size)
            self._bytes += size
            opened = pa.OSFile(str(copy), "r")
            while self._bytes > self.max_bytes and len(self._files) > 1:
                _, (old, old_size) = self._files.popitem(last=False)
                old.unlink(missing_ok=True)
                self._bytes -= old_size
            return opened

    def _copy(self, stream: InputStream, location: str) -> Path:
        name = hashlib.sha256(location.encode()).hexdigest()[:32]
        partial = self.directory / f".{name}-{uuid.uuid4().hex}"
        with stream, open(partial, "wb") as out:
            while chunk := stream.read(COPY_CHUNK_BYTES):
                out.write(chunk)
        copy = self.directory / f"{name}-{uuid.uuid4().hex}.parquet"
        os.replace(partial, copy)
        log.debug("read-back: copied %s (%d bytes) to %s", location, copy.stat().st_size, copy)
        return copy
