"""Kafka RecordBatch (magic v2) headers: validation, offset assignment, timestamp look-ups.

Batches are stored exactly as produced (still compressed). The broker patches the base offset in place:
the CRC-32C covers attributes onwards, so bytes 0-11 can change without recomputing it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from icelog.errors import ErrorCode, KafkaApiError

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength, the bytes before batchLength's count starts
_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_MAX_TIMESTAMP = struct.Struct(">q")
_CRC = struct.Struct(">I")

ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


class BatchAttributes:
    """Flags read from a batch's attributes field."""

    __slots__ = ()
    attributes: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


@dataclass(frozen=True, slots=True)
class BatchHeader(BatchAttributes):
    """The fields of a v2 record batch header that the broker uses."""

    position: int
    size: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


def parse_produced_batches(records: bytes | bytearray, max_batch_bytes: int) -> list[BatchHeader]:
    """Split and validate the batches of one partition in a Produce request.

    Raises CORRUPT_MESSAGE (bad length, magic or CRC) or MESSAGE_TOO_LARGE; nothing is stored on error.
    """
    view = memoryview(records)
    total = len(view)
    if total == 0:
        raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, "empty record set")
    batches: list[BatchHeader] = []
    pos = 0
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"truncated batch header at byte {pos}")
        (_, length, _, magic, crc, attributes, last_delta, base_ts, max_ts, pid, epoch, base_seq, count) = (
            _HEADER.unpack_from(view, pos)
        )
        size = LOG_OVERHEAD + length
        if magic != 2:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"record batch magic {magic} is not supported (only 2)")
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > total:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"batch length {length} does not fit the request")
        if size > max_batch_bytes:
            raise KafkaApiError(
                ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes is over max.message.bytes={max_batch_bytes}"
            )
        if crc32c.crc32c(view[pos + 21 : pos + size]) != crc:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, "record batch CRC-32C mismatch")
        if count < 1 or last_delta != count - 1:
            raise KafkaApiError(
                ErrorCode.CORRUPT_MESSAGE, f"batch declares {count} records but last offset delta {last_delta}"
            )
        batches.append(BatchHeader(pos, size, attributes, last_delta, base_ts, max_ts, pid, epoch, base_seq, count))
        pos += size
    return batches


def assign_offsets(buffer: bytearray, batches: list[BatchHeader], base_offset: int) -> int:
    """Write consecutive base offsets into the batches in place; return the next offset."""
    offset = base_offset
    for batch in batches:
        struct.pack_into(">q", buffer, batch.position, offset)
        offset += batch.last_offset_delta + 1
    return offset


def set_log_append_time(buffer: bytearray, batches: list[BatchHeader], timestamp_ms: int) -> None:
    """Stamp LogAppendTime on every batch (this changes the CRC, so recompute it)."""
    for batch in batches:
        attributes_pos = batch.position + 21
        attributes = struct.unpack_from(">h", buffer, attributes_pos)[0] | ATTR_LOG_APPEND_TIME
        struct.pack_into(">h", buffer, attributes_pos, attributes)
        struct.pack_into(">q", buffer, batch.position + 35, timestamp_ms)
        crc = crc32c.crc32c(memoryview(buffer)[attributes_pos : batch.position + batch.size])
        _CRC.pack_into(buffer, batch.position + 17, crc)


def iter_stored_batches(data: bytes | memoryview) -> list[tuple[int, int, int, int]]:
    """(position, size, base_offset, last_offset) of each batch in stored (offset-assigned) bytes."""
    out = []
    pos = 0
    total = len(data)
    while pos + HEADER_SIZE <= total:
        base, length = _OFFSET_AND_LENGTH.unpack_from(data, pos)
        size = LOG_OVERHEAD + length
        last = base + _LAST_OFFSET_DELTA.unpack_from(data, pos + 23)[0]
        out.append((pos, size, base, last))
        pos += size
    return out


def batch_max_timestamp(data: bytes | memoryview, position: int) -> int:
    """The maxTimestamp field of the batch at `position`."""
    return int(_MAX_TIMESTAMP.unpack_from(data, position + 35)[0])


def first_record_at_or_after(batch: bytes, timestamp_ms: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record in a stored batch whose timestamp is >= timestamp_ms."""
    from kafka.record.default_records import DefaultRecordBatch

    parsed = DefaultRecordBatch(batch)
    for record in parsed:
        if record.timestamp >= timestamp_ms:
            return record.offset, record.timestamp
    return None
