"""Transaction state of one partition: open transactions, the last stable offset and aborted ranges.

read_committed consumers read up to the last stable offset (the first offset of the oldest open
transaction, or the high watermark) and drop the records of aborted ranges. The Iceberg archiver uses
the same two things to archive only committed records. Rebuilt at start-up from stored batch headers
and the transaction markers (control batches) in the intake, like the producer sequence state.
"""

from __future__ import annotations

import bisect
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from icelog.log.producers import StoredBatch
from icelog.records.record_format import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    CRC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    UINT32,
    batch_crc,
)
from icelog.records.varint import encode_varint as _write_varint
from icelog.records.varint import read_varint as _read_varint

MARKER_ABORT = 0
MARKER_COMMIT = 1


@dataclass(frozen=True, slots=True)
class AbortedRange:
    """Records of `producer_id` from `first_offset` up to the abort marker at `last_offset` are aborted."""

    producer_id: int
    first_offset: int
    last_offset: int


class TxnIndex:
    """Open transactions and aborted ranges of one partition (event loop thread only)."""

    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        # producer id -> when (time.monotonic) its open transaction was first seen here, for the hanging-
        # transaction timeout; transactions replayed at start-up count from the start-up.
        self.opened_at: dict[int, float] = {}
        self.aborted: list[AbortedRange] = []  # ordered by last_offset (markers are appended in order)
        self._aborted_last: list[int] = []

    def on_data(self, producer_id: int, base_offset: int, transactional: bool) -> None:
        """A data batch was given offsets; a transactional one may open a transaction."""
        if transactional and producer_id >= 0 and producer_id not in self.open:
            self.open[producer_id] = base_offset
            self.opened_at[producer_id] = time.monotonic()

    def forget_from(self, offset: int) -> None:
        """Data batches from `offset` on were never written (a full disk refused them): they open nothing."""
        for pid in [pid for pid, first in self.open.items() if first >= offset]:
            del self.open[pid]
            self.opened_at.pop(pid, None)

    def on_marker(self, producer_id: int, offset: int, commit: bool) -> None:
        """A commit or abort marker was given `offset`: the producer's transaction here is over."""
        first = self.open.pop(producer_id, None)
        self.opened_at.pop(producer_id, None)
        if not commit and first is not None:
            self.aborted.append(AbortedRange(producer_id, first, offset))
            self._aborted_last.append(offset)

    def last_stable_offset(self, high_watermark: int) -> int:
        """No open transaction starts below this offset (never above the high watermark)."""
        return min(high_watermark, *self.open.values()) if self.open else high_watermark

    def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """Aborted ranges overlapping [start_offset, end_offset): those a reader of that span must drop."""
        index = bisect.bisect_left(self._aborted_last, start_offset)
        return [r for r in self.aborted[index:] if r.first_offset < end_offset]

    def drop_before(self, log_start_offset: int) -> None:
        """Forget aborted ranges wholly below the log start (retention)."""
        index = bisect.bisect_left(self._aborted_last, log_start_offset)
        del self.aborted[:index]
        del self._aborted_last[:index]

    def replay(self, stored: Iterable[tuple[StoredBatch, int | None]]) -> None:
        """Rebuild from stored batches in offset order, each with its marker type if a control batch."""
        for batch, marker in stored:
            if batch.is_control:
                if marker is not None:
                    self.on_marker(batch.producer_id, batch.base_offset, marker == MARKER_COMMIT)
            else:
                self.on_data(batch.producer_id, batch.base_offset, batch.is_transactional)


def marker_type(data: bytes | memoryview, position: int) -> int | None:
    """MARKER_COMMIT or MARKER_ABORT for the control batch at `position` (None if unreadable)."""
    # Control records are never compressed: length, attributes, timestamp delta, offset delta, key.
    pos = position + HEADER_SIZE
    try:
        for _ in range(4):  # record length, attributes (int8, not a varint), timestampDelta, offsetDelta
            if _ == 1:
                pos += 1
                continue
            _, pos = _read_varint(data, pos)
        key_length, pos = _read_varint(data, pos)
        if key_length < 4:
            return None
        _version, kind = struct.unpack_from(">hh", data, pos)
    except (IndexError, ValueError, struct.error):  # ValueError: a malformed varint
        return None
    return int(kind) if kind in (MARKER_ABORT, MARKER_COMMIT) else None


def encode_marker_batch(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """A control batch holding one commit/abort marker (base offset 0: assigned on append)."""
    key = struct.pack(">hh", 0, MARKER_COMMIT if commit else MARKER_ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (
        b"\x00"
        + _write_varint(0)
        + _write_varint(0)
        + _write_varint(len(key))
        + key
        + _write_varint(len(value))
        + value
        + _write_varint(0)
    )
    record = _write_varint(len(body)) + body
    attributes = ATTR_TRANSACTIONAL | ATTR_CONTROL
    length = HEADER_SIZE - LOG_OVERHEAD + len(record)
    batch = bytearray(
        HEADER.pack(0, length, -1, 2, 0, attributes, 0, timestamp_ms, timestamp_ms, producer_id, producer_epoch, -1, 1)
    )
    batch += record
    UINT32.pack_into(batch, CRC, batch_crc(batch))
    return bytes(batch)
