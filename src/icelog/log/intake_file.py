"""The on-disk format of intake files: a sequence of self-checking frames.

Each frame carries the batches of one partition gathered in one group commit:

    magic "ILF1" | crc32c u32 | payload_length u32 | partition i32 | topic_id 16 bytes |
    base_offset i64 | end_offset i64 | max_timestamp i64 | payload (record batches)

The CRC-32C covers every byte after the crc field, payload included, so recovery can tell a torn or
corrupt tail from a whole frame.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

MAGIC = b"ILF1"
_FRAME = struct.Struct(">4sIIi16sqqq")
FRAME_HEADER_SIZE = _FRAME.size  # 56


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame header and where its payload sits in the file."""

    topic_id: uuid.UUID
    partition: int
    base_offset: int
    end_offset: int
    max_timestamp: int
    payload_position: int
    payload_length: int

    @property
    def end_position(self) -> int:
        return self.payload_position + self.payload_length


def encode_frame(
    topic_id: uuid.UUID,
    partition: int,
    base_offset: int,
    end_offset: int,
    max_timestamp: int,
    payload: bytes | bytearray | Sequence[bytes | bytearray],
) -> bytes:
    """The frame header for a payload (write the header, then the payload).

    The payload may be given in parts (one partition's appends of a group commit): the CRC runs over them
    in turn, so the writer hands them to writev without joining (copying) them first.
    """
    parts = [payload] if isinstance(payload, (bytes, bytearray)) else payload
    length = sum(len(part) for part in parts)
    tail = _FRAME.pack(MAGIC, 0, length, partition, topic_id.bytes, base_offset, end_offset, max_timestamp)[8:]
    crc = crc32c.crc32c(tail)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return MAGIC + struct.pack(">I", crc) + tail


def file_path(directory: Path, file_id: int) -> Path:
    return directory / f"{file_id:020d}.intake"


def list_files(directory: Path) -> list[int]:
    """Ids of the intake files in a directory, ascending."""
    return sorted(int(p.stem) for p in directory.glob("*.intake") if p.stem.isdigit())


def scan_frames(path: Path, start: int) -> tuple[list[Frame], int, int]:
    """Read whole, valid frames from `start`; return them, the end of the last one and the file size.

    The first frame that is short, has a wrong magic or fails its CRC ends the scan: everything from
    there on is a torn (or corrupt) tail.
    """
    frames: list[Frame] = []
    size = path.stat().st_size
    pos = start
    with open(path, "rb") as handle:
        handle.seek(start)
        while pos + FRAME_HEADER_SIZE <= size:
            header = handle.read(FRAME_HEADER_SIZE)
            magic, crc, length, partition, tid, base, end, max_ts = _FRAME.unpack(header)
            if magic != MAGIC or pos + FRAME_HEADER_SIZE + length > size:
                break
            payload = handle.read(length)
            if crc32c.crc32c(payload, crc32c.crc32c(header[8:])) != crc:
                break
            frames.append(Frame(uuid.UUID(bytes=tid), partition, base, end, max_ts, pos + FRAME_HEADER_SIZE, length))
            pos += FRAME_HEADER_SIZE + length
    return frames, pos, size


def is_zero_tail(path: Path, start: int) -> bool:
    """Whether every byte from `start` to the end of the file is zero (preallocated, never written)."""
    with open(path, "rb") as handle:
        handle.seek(start)
        while block := handle.read(1 << 20):
            if block.count(0) != len(block):
                return False
    return True


def fsync_directory(directory: Path) -> None:
    """Make a created or deleted file name durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
