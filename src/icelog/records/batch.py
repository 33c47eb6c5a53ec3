"""Kafka RecordBatch (magic v2): validation of produced batches, offset assignment, timestamp look-ups.

Batches are stored as produced (still compressed). The broker patches the base offset in place: the
CRC-32C covers attributes onwards, so bytes 0-11 can change without recomputing it. As Kafka's
LogValidator, it also writes the max timestamp (the records' own, or the LogAppendTime) when the header
says otherwise, and recomputes the CRC for that batch only (`repair_headers`, `set_log_append_time`).
The header layout is `record_format`'s; the records inside are checked by `records`.
"""

from __future__ import annotations

from dataclasses import dataclass

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.record_format import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    ATTRIBUTES,
    BASE_OFFSET,
    BATCH_LENGTH,
    CRC,
    HEADER,
    HEADER_SIZE,
    INT16,
    INT32,
    INT64,
    LAST_OFFSET_DELTA,
    LOG_OVERHEAD,
    MAGIC,
    MAX_TIMESTAMP,
    RECORDS,
    UINT32,
    batch_crc,
)
from icelog.records.walk import CHECK_COST, MAX_UNCOMPRESSED_BYTES, decompress, read_batch, validate_records
from icelog.records.walk import inflation_hint as records_inflation_hint

NO_TIMESTAMP = -1
_LEGACY_RECORD_OVERHEAD = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: no batch length is smaller


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
    """The fields of a v2 record batch header that the broker uses.

    `max_timestamp` is the records' max timestamp (-1 if none has one), which Kafka stores whatever the
    producer wrote into the header (some clients write -1); `attributes` are those stored (a producer's
    LogAppendTime mark cleared).
    """

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
    records_size: int  # bytes of its records section once decompressed


def parse_produced_batches(
    records: bytes | bytearray, max_batch_bytes: int, compacted: bool = False, log_append_time: bool = False,
    inflation_limit: int = MAX_UNCOMPRESSED_BYTES, timestamp_window: tuple[int, int] | None = None,
) -> list[BatchHeader]:
    """Split and validate the batches of one partition in a Produce request, records included.

    Checks what Kafka's broker checks before an append (ProduceRequest.validateRecords, UnifiedLog and
    LogValidator: header, CRC, count, then every record: lengths, varints, offset deltas, timestamps,
    header keys, a key on a `compacted` topic) and raises the code Kafka answers: INVALID_RECORD for
    records that do not parse (InvalidRecordException), no whole batch, magic 0 or 1, a count that is not
    the last offset delta + 1, a control batch, a bad sequence from a producer, or a keyless record of a
    compacted topic (with the record's index); CORRUPT_MESSAGE for a CRC mismatch, a batch length shorter
    than a header, another magic, or records that do not decompress; INVALID_TIMESTAMP with the record's
    index (also for a timestamp outside `timestamp_window`, [earliest, latest] ms: a CreateTime topic's
    message.timestamp.before.max.ms / after.max.ms around the broker's clock); MESSAGE_TOO_LARGE,
    InflationLimitError when the batches' records decompress to more than `inflation_limit` bytes together (or
    one batch's to more than MAX_UNCOMPRESSED_BYTES). Nothing is stored on error.

    What Kafka repairs is not an error: the returned headers carry what it stores, the records' max
    timestamp whatever the producer's header said, and CreateTime for a batch the producer marked
    LogAppendTime on a CreateTime topic (Kafka refuses that mark on a `log_append_time` topic and when the
    batch has no timestamp); `repair_headers` writes them into the stored bytes.
    """
    view = memoryview(records)
    total = len(view)
    if total == 0:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, "a Produce must have at least one record batch per partition")
    batches: list[BatchHeader] = []
    pos = 0
    inflated = 0
    while pos < total:
        # In Kafka's order (ByteBufferLogInputStream, ProduceRequest.validateRecords, then
        # DefaultRecordBatch.ensureValid): bytes that do not hold a whole batch are no batch (INVALID_RECORD),
        # a length below any record's or a magic above 2 is corrupt, magic 0 or 1 is refused in Produce v3+.
        if total - pos < LOG_OVERHEAD:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, f"{total - pos} bytes at byte {pos} are not a whole batch")
        length = INT32.unpack_from(view, pos + BATCH_LENGTH)[0]
        size = LOG_OVERHEAD + length
        if length < _LEGACY_RECORD_OVERHEAD:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"batch length {length} is shorter than any record's")
        if total - pos <= MAGIC:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, f"{total - pos} bytes at byte {pos} are not a whole batch")
        magic = view[pos + MAGIC]
        if magic in (0, 1):
            raise KafkaApiError(
                ErrorCode.INVALID_RECORD, f"a Produce v3+ may only hold record batches of magic 2, not {magic}"
            )
        if magic != 2:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"record batch magic {magic} is not 0, 1 or 2")
        if pos + size > total:
            raise KafkaApiError(
                ErrorCode.INVALID_RECORD, f"batch length {length} at byte {pos} runs past the partition's records"
            )
        if length < HEADER_SIZE - LOG_OVERHEAD:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"batch length {length} is shorter than a batch header")
        (_, _, _, _, crc, attributes, last_delta, base_ts, max_ts, pid, epoch, base_seq, count) = (
            HEADER.unpack_from(view, pos)
        )
        if size > max_batch_bytes:
            raise KafkaApiError(
                ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes is over max.message.bytes={max_batch_bytes}"
            )
        if batch_crc(view, pos, size) != crc:
            raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, "record batch CRC-32C mismatch")
        if count < 1 or last_delta != count - 1:
            raise KafkaApiError(
                ErrorCode.INVALID_RECORD, f"batch declares {count} records but last offset delta {last_delta}"
            )
        if attributes & ATTR_CONTROL:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, "clients may not write control batches")
        if pid >= 0 and base_seq < 0:
            raise KafkaApiError(
                ErrorCode.INVALID_RECORD, f"invalid sequence number {base_seq} in a batch of producer {pid}"
            )
        limit = min(MAX_UNCOMPRESSED_BYTES, inflation_limit - inflated)
        records_max, records_size = _validate_records(
            view[pos + RECORDS : pos + size], attributes, count, base_ts, compacted, limit, timestamp_window
        )
        inflated += records_size
        if attributes & ATTR_LOG_APPEND_TIME:
            # Every record of such a batch reads as its header's max timestamp (Kafka's LogValidator).
            if log_append_time or max_ts == NO_TIMESTAMP:
                message = "a producer may not set the timestamp type LogAppendTime"
                raise KafkaApiError(ErrorCode.INVALID_TIMESTAMP, message, [(i, message) for i in range(count)])
            attributes &= ~ATTR_LOG_APPEND_TIME  # stored as CreateTime, its records' own timestamps
        batches.append(
            BatchHeader(
                pos, size, attributes, last_delta, base_ts, records_max, pid, epoch, base_seq, count, records_size
            )
        )
        pos += size
    return batches


def check_cost(records: bytes | bytearray) -> int | None:
    """What checking one partition's produced records will cost, in bytes of uncompressed records that cost
    as much (`records.CHECK_COST`), from the sizes their batch headers and payload headers declare
    (`records.inflation_hint`); None if one does not say or the batches do not parse. A decompression never
    keeps more than its payload declares, so a payload that lies costs no more than it said."""
    view = memoryview(records)
    total, pos = 0, 0
    while pos < len(view):
        if len(view) - pos < HEADER_SIZE:
            return None
        size = LOG_OVERHEAD + INT32.unpack_from(view, pos + BATCH_LENGTH)[0]
        if size < HEADER_SIZE or pos + size > len(view):
            return None
        codec = INT16.unpack_from(view, pos + ATTRIBUTES)[0] & ATTR_COMPRESSION_MASK
        hint = records_inflation_hint(codec, view[pos + RECORDS : pos + size])
        if hint is None or codec not in CHECK_COST:
            return None
        total += hint * CHECK_COST[codec]
        pos += size
    return total


def first_batch_codec(records: bytes | bytearray) -> int | None:
    """The compression codec of the first batch in a partition's records, if it is a v2 batch header."""
    if len(records) <= ATTRIBUTES + 1 or records[MAGIC] != 2:
        return None
    return int(records[ATTRIBUTES + 1] & ATTR_COMPRESSION_MASK)


def _validate_records(
    payload: memoryview, attributes: int, count: int, base_ts: int, require_keys: bool, limit: int,
    timestamp_window: tuple[int, int] | None,
) -> tuple[int, int]:
    """The records' max timestamp and decompressed size of a batch's records section (compressed or not, to
    at most `limit` bytes); raise the Kafka error for its first bad record."""
    section = decompress(attributes & ATTR_COMPRESSION_MASK, payload, one_frame=True, limit=limit)
    if timestamp_window is None:
        answer = validate_records(section, count, base_ts, require_keys)
    else:
        answer = validate_records(section, count, base_ts, require_keys, *timestamp_window)
    if isinstance(answer, int):
        return answer, len(section)
    code, index, message = answer
    # The walker calls bytes that do not parse CORRUPT_MESSAGE (as read_batch does for a stored batch);
    # Kafka's broker answers a produced batch whose records do not parse with INVALID_RECORD
    # (DefaultRecord's InvalidRecordException) and no record index. Per-record problems (timestamps,
    # header keys, keys) carry the record's index.
    if code == ErrorCode.CORRUPT_MESSAGE:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, message)
    raise KafkaApiError(ErrorCode(code), message, [(index, message)] if index >= 0 else [])


def repair_headers(buffer: bytearray, batches: list[BatchHeader]) -> None:
    """Write what Kafka's LogValidator stores into each batch header that says otherwise (the records' max
    timestamp, the attributes: `parse_produced_batches`), and that batch's CRC; a right header costs a read."""
    for batch in batches:
        at = batch.position
        if INT64.unpack_from(buffer, at + MAX_TIMESTAMP)[0] != batch.max_timestamp or (
            INT16.unpack_from(buffer, at + ATTRIBUTES)[0] != batch.attributes
        ):
            INT16.pack_into(buffer, at + ATTRIBUTES, batch.attributes)
            INT64.pack_into(buffer, at + MAX_TIMESTAMP, batch.max_timestamp)
            UINT32.pack_into(buffer, at + CRC, batch_crc(buffer, at, batch.size))


def assign_offsets(buffer: bytearray, batches: list[BatchHeader], base_offset: int) -> int:
    """Write consecutive base offsets into the batches in place; return the next offset."""
    offset = base_offset
    for batch in batches:
        INT64.pack_into(buffer, batch.position + BASE_OFFSET, offset)
        offset += batch.last_offset_delta + 1
    return offset


def shift_offsets(data: bytes | memoryview, delta: int) -> bytes:
    """Stored batches with `delta` added to each base offset (bytes 0-7, outside the CRC): what a sequencing
    store serves, its batches stored with offsets relative to their chunk. `data` itself is never changed."""
    if delta == 0:
        return bytes(data)
    out = bytearray(data)
    pos = 0
    total = len(out)
    while pos + HEADER_SIZE <= total:
        INT64.pack_into(out, pos + BASE_OFFSET, INT64.unpack_from(out, pos + BASE_OFFSET)[0] + delta)
        pos += LOG_OVERHEAD + INT32.unpack_from(out, pos + BATCH_LENGTH)[0]
    return bytes(out)


def rebase_offsets(buffer: bytearray, base_offset: int) -> int:
    """Write consecutive base offsets from `base_offset` into stored batches in place; return the next offset."""
    offset = base_offset
    pos = 0
    total = len(buffer)
    while pos + HEADER_SIZE <= total:
        INT64.pack_into(buffer, pos + BASE_OFFSET, offset)
        offset += INT32.unpack_from(buffer, pos + LAST_OFFSET_DELTA)[0] + 1
        pos += LOG_OVERHEAD + INT32.unpack_from(buffer, pos + BATCH_LENGTH)[0]
    return offset


def set_log_append_time(buffer: bytearray, batches: list[BatchHeader], timestamp_ms: int) -> None:
    """Stamp LogAppendTime on every batch (this changes the CRC, so recompute it)."""
    for batch in batches:
        attributes_pos = batch.position + ATTRIBUTES
        attributes = INT16.unpack_from(buffer, attributes_pos)[0] | ATTR_LOG_APPEND_TIME
        INT16.pack_into(buffer, attributes_pos, attributes)
        INT64.pack_into(buffer, batch.position + MAX_TIMESTAMP, timestamp_ms)
        crc = batch_crc(buffer, batch.position, batch.size)
        UINT32.pack_into(buffer, batch.position + CRC, crc)


def iter_stored_batches(data: bytes | memoryview) -> list[tuple[int, int, int, int]]:
    """(position, size, base_offset, last_offset) of each batch in stored (offset-assigned) bytes."""
    out = []
    pos = 0
    total = len(data)
    while pos + HEADER_SIZE <= total:
        base = INT64.unpack_from(data, pos + BASE_OFFSET)[0]
        size = LOG_OVERHEAD + INT32.unpack_from(data, pos + BATCH_LENGTH)[0]
        last = base + INT32.unpack_from(data, pos + LAST_OFFSET_DELTA)[0]
        out.append((pos, size, base, last))
        pos += size
    return out


def batch_max_timestamp(data: bytes | memoryview, position: int) -> int:
    """The maxTimestamp field of the batch at `position`."""
    return int(INT64.unpack_from(data, position + MAX_TIMESTAMP)[0])


def first_record_at_or_after(batch: bytes | memoryview, timestamp_ms: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record in a stored batch whose timestamp is >= timestamp_ms."""
    for offset, timestamp, _key, _value, _headers in read_batch(batch).records:
        if timestamp >= timestamp_ms:
            return offset, timestamp
    return None


def empty_batch(first_offset: int, last_offset: int) -> bytes:
    """A batch with no records spanning [first_offset, last_offset], as log compaction leaves them.

    Consumers move their position past it (to lastOffset + 1), so offsets with no records left (rows
    deleted from the archive table) do not hold them where nothing else is returned.
    """
    out = bytearray(HEADER_SIZE)
    HEADER.pack_into(out, 0, first_offset, HEADER_SIZE - LOG_OVERHEAD, 0, 2, 0, 0, last_offset - first_offset,
                     -1, -1, -1, -1, -1, 0)
    UINT32.pack_into(out, CRC, batch_crc(out))
    return bytes(out)
