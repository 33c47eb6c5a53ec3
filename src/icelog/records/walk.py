"""The records inside a v2 batch: decompress them, check that they are what the header says, read them.

This is icelog's one record-batch reader. `validate_records` walks a produced batch's records without
building Python objects (the broker's checks before an append); `read_batch` returns a stored batch's
header fields and records (offset, timestamp, key, value, headers) for every caller that reads records:
the archiver's decode in Spark workers, produce-time enforcement, timestamp look-ups. Both walkers are the
compiled `icelog.records._records` (built from `_records.c` by `pip install`) when that extension is
importable, and the pure-Python `validate_records_py` / `read_records_py` below otherwise (chosen once,
below); each pair gives the same answer for every input (tests/records/test_records.py checks it on generated
and corrupt inputs, every codec).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import lz4.frame
import snappy
import zstandard

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.record_format import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
)
from icelog.records.varint import VARINT_BYTES, VARLONG_BYTES, VarintError, read_uvarint, read_varint

# A batch whose records decompress to more than this is refused (MESSAGE_TOO_LARGE, Java's
# RecordTooLargeException) as soon as its decompression passes it, never all in memory: a few kilobytes of
# zstd or gzip can otherwise expand to gigabytes. It is what librdkafka reads back: its decompression stops
# at receive.message.max.bytes (default 100000000) and answers _BAD_COMPRESSION past it.
MAX_UNCOMPRESSED_BYTES = 100_000_000
# Decompression writes at most this much per library call (gzip, lz4): what one call allocates, and so what a
# count-only pass holds at a time (a thread reading a big batch, as enforcement does, also lets go of the GIL
# between steps).
DECOMPRESS_STEP = 1 << 20
# Records that decompress to at most this are read where they are (enforcement's reads, the produce path's
# count-first rule below); more are read off the event loop.
INLINE_INFLATION = 1 << 20
# What checking a MiB of decompressed records costs, per codec, relative to uncompressed records (~0.25 ms a
# MiB here; lz4 and snappy ~0.7, zstd ~1.1, gzip ~3): the produce path's measure of event-loop work.
CHECK_COST = {CODEC_NONE: 1, CODEC_LZ4: 3, CODEC_SNAPPY: 3, CODEC_ZSTD: 4, CODEC_GZIP: 12}

_NO_TIMESTAMP = -1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# (error code, record index or -1, message): what both implementations answer for a bad batch.
RecordsProblem = tuple[int, int, str]
# A record header: (key, value or None).
Header = tuple[str, bytes | None]
# A record as read_records gives it: (offset, timestamp ms, key, value, headers).
Record = tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]


class _Invalid(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def validate_records_py(
    buffer: bytes | bytearray | memoryview, count: int, base_timestamp: int, require_keys: bool = False,
    earliest: int = _INT64_MIN, latest: int = _INT64_MAX,
) -> int | RecordsProblem:
    """Check that `buffer` (a batch's decompressed records section) holds exactly `count` good records (each
    with a key when `require_keys`: Kafka refuses a keyless record on a compacted topic with INVALID_RECORD;
    each timestamp but -1 within [earliest, latest]: the topic's message.timestamp.before.max.ms and
    after.max.ms around the broker's clock, INVALID_TIMESTAMP as Kafka's LogValidator answers).

    The records' max timestamp (-1 if none has one) if it does: what Kafka's LogValidator writes into the
    batch header whatever the producer put there. Else (error code, index of the offending record or -1,
    message) for the first problem.
    """
    data = memoryview(buffer).cast("B")
    end = len(data)
    pos = 0
    index = 0
    max_timestamp = _NO_TIMESTAMP
    try:
        for index in range(count):
            if pos >= end:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE, f"record {index} is missing: the batch declares {count} records"
                )
            length, pos = _varint(data, pos, end, VARINT_BYTES, index, "length")
            if length < 0:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: length {length} is negative")
            if length > end - pos:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: length {length} runs past the end of the batch ({end - pos} bytes left)",
                )
            rec_end = pos + length
            if pos >= rec_end:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: attributes: truncated")
            pos += 1  # attributes: unused in v2 records
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif pos + 1 < rec_end and (c := data[pos + 1]) < 0x80:
                raw = (b & 0x7F) | c << 7
                ts_delta, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                ts_delta, pos = _varint(data, pos, rec_end, VARLONG_BYTES, index, "timestamp delta")
            offset_delta, pos = _varint(data, pos, rec_end, VARINT_BYTES, index, "offset delta")
            if offset_delta != index:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: offset delta {offset_delta}, expected {index} (deltas run 0..count-1)",
                )
            timestamp = base_timestamp + ts_delta
            if not _INT64_MIN <= timestamp <= _INT64_MAX:
                raise _Invalid(
                    ErrorCode.INVALID_TIMESTAMP,
                    f"record {index}: base timestamp {base_timestamp} + delta {ts_delta} overflows",
                )
            if timestamp < _NO_TIMESTAMP:
                raise _Invalid(
                    ErrorCode.INVALID_TIMESTAMP,
                    f"record {index}: timestamp {timestamp} is negative (only -1, no timestamp, is allowed)",
                )
            if timestamp != _NO_TIMESTAMP and not earliest <= timestamp <= latest:
                raise _Invalid(
                    ErrorCode.INVALID_TIMESTAMP,
                    f"record {index}: timestamp {timestamp} is out of range: it must be within [{earliest}, {latest}]",
                )
            if timestamp > max_timestamp:
                max_timestamp = timestamp
            key_length, pos = _length(data, pos, rec_end, index, "key length", nullable=True)
            if require_keys and key_length < 0:
                raise _Invalid(
                    ErrorCode.INVALID_RECORD, f"record {index}: a compacted topic cannot accept a record without a key"
                )
            pos += max(key_length, 0)
            value_length, pos = _length(data, pos, rec_end, index, "value length", nullable=True)
            pos += max(value_length, 0)
            header_count, pos = _varint(data, pos, rec_end, VARINT_BYTES, index, "header count")
            if header_count < 0:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: header count {header_count} is negative")
            for header in range(header_count):
                key_length, pos = _length(data, pos, rec_end, index, f"header {header} key length", nullable=False)
                try:
                    bytes(data[pos : pos + key_length]).decode("utf-8")
                except UnicodeDecodeError:
                    raise _Invalid(
                        ErrorCode.INVALID_RECORD, f"record {index}: header {header} key is not valid UTF-8"
                    ) from None
                pos += key_length
                value_length, pos = _length(data, pos, rec_end, index, f"header {header} value length", nullable=True)
                pos += max(value_length, 0)
            if pos != rec_end:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: its fields end {rec_end - pos} bytes before the end its length gives",
                )
        index = -1
        if pos != end:
            raise _Invalid(
                ErrorCode.CORRUPT_MESSAGE, f"{end - pos} bytes follow the {count} records the batch declares"
            )
    except _Invalid as problem:
        return int(problem.code), index, problem.message
    return max_timestamp


def _varint(data: bytes | memoryview, pos: int, end: int, max_bytes: int, index: int, field: str) -> tuple[int, int]:
    try:
        return read_varint(data, pos, end, max_bytes)
    except VarintError as exc:
        raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: {field}: {exc}") from None


def _length(data: bytes | memoryview, pos: int, end: int, index: int, field: str, nullable: bool) -> tuple[int, int]:
    """(length, position after its varint) of a length-prefixed field that must fit before `end`.

    -1 is a null field, allowed only if `nullable` (keys, values and header values; not header keys).
    """
    length, pos = _varint(data, pos, end, VARINT_BYTES, index, field)
    if length < (-1 if nullable else 0):
        raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: {field} {length} is negative")
    if length > end - pos:
        raise _Invalid(
            ErrorCode.CORRUPT_MESSAGE,
            f"record {index}: {field} {length} runs past the record's end ({end - pos} bytes left)",
        )
    return length, pos


def read_records_py(
    buffer: bytes | bytearray | memoryview, count: int, base_offset: int, base_timestamp: int,
    log_append_time: int | None = None,
) -> list[Record]:
    """The `count` records of a batch's (decompressed) records section, as (offset, timestamp, key, value,
    headers); every timestamp is `log_append_time` when given (a LogAppendTime batch's maxTimestamp).

    The structural checks of `validate_records_py` with its messages (not the produce rules: offset deltas
    may have gaps, as after compaction, and any timestamp is read, even below -1); raises
    ValueError(message) for the first problem. One-byte varints (nearly all of them) are read inline.
    """
    data = buffer if isinstance(buffer, bytes) else bytes(buffer)
    end = len(data)
    pos = 0
    out: list[Record] = []
    append = out.append
    try:
        for index in range(count):
            if pos >= end:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE, f"record {index} is missing: the batch declares {count} records"
                )
            b = data[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif pos + 1 < end and (c := data[pos + 1]) < 0x80:
                raw = (b & 0x7F) | c << 7
                length, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                length, pos = _varint(data, pos, end, VARINT_BYTES, index, "length")
            if length < 0:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: length {length} is negative")
            if length > end - pos:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: length {length} runs past the end of the batch ({end - pos} bytes left)",
                )
            rec_end = pos + length
            if pos >= rec_end:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: attributes: truncated")
            pos += 1  # attributes: unused in v2 records
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif pos + 1 < rec_end and (c := data[pos + 1]) < 0x80:
                raw = (b & 0x7F) | c << 7
                ts_delta, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                ts_delta, pos = _varint(data, pos, rec_end, VARLONG_BYTES, index, "timestamp delta")
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80:
                offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif pos + 1 < rec_end and (c := data[pos + 1]) < 0x80:
                raw = (b & 0x7F) | c << 7
                offset_delta, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                offset_delta, pos = _varint(data, pos, rec_end, VARINT_BYTES, index, "offset delta")
            offset = base_offset + offset_delta
            if not _INT64_MIN <= offset <= _INT64_MAX:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: base offset {base_offset} + delta {offset_delta} overflows",
                )
            timestamp = base_timestamp + ts_delta
            if not _INT64_MIN <= timestamp <= _INT64_MAX:
                raise _Invalid(
                    ErrorCode.INVALID_TIMESTAMP,
                    f"record {index}: base timestamp {base_timestamp} + delta {ts_delta} overflows",
                )
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80 and -1 <= (key_length := (b >> 1) ^ -(b & 1)) <= rec_end - pos - 1:
                pos += 1
            else:
                key_length, pos = _length(data, pos, rec_end, index, "key length", nullable=True)
            key = None if key_length < 0 else data[pos : pos + key_length]
            pos += max(key_length, 0)
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80 and -1 <= (value_length := (b >> 1) ^ -(b & 1)) <= rec_end - pos - 1:
                pos += 1
            elif (
                b >= 0x80 and pos + 1 < rec_end and (c := data[pos + 1]) < 0x80
                and 0 <= (value_length := ((raw := (b & 0x7F) | c << 7) >> 1) ^ -(raw & 1)) <= rec_end - pos - 2
            ):
                pos += 2
            else:
                value_length, pos = _length(data, pos, rec_end, index, "value length", nullable=True)
            value = None if value_length < 0 else data[pos : pos + value_length]
            pos += max(value_length, 0)
            b = data[pos] if pos < rec_end else 0x80
            if b < 0x80:
                header_count, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                header_count, pos = _varint(data, pos, rec_end, VARINT_BYTES, index, "header count")
            if header_count < 0:
                raise _Invalid(ErrorCode.CORRUPT_MESSAGE, f"record {index}: header count {header_count} is negative")
            headers: list[Header] = []
            for header in range(header_count):
                key_length, pos = _length(data, pos, rec_end, index, f"header {header} key length", nullable=False)
                try:
                    hkey = data[pos : pos + key_length].decode("utf-8")
                except UnicodeDecodeError:
                    raise _Invalid(
                        ErrorCode.INVALID_RECORD, f"record {index}: header {header} key is not valid UTF-8"
                    ) from None
                pos += key_length
                value_length, pos = _length(data, pos, rec_end, index, f"header {header} value length", nullable=True)
                headers.append((hkey, None if value_length < 0 else data[pos : pos + value_length]))
                pos += max(value_length, 0)
            if pos != rec_end:
                raise _Invalid(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"record {index}: its fields end {rec_end - pos} bytes before the end its length gives",
                )
            append((offset, timestamp if log_append_time is None else log_append_time, key, value, tuple(headers)))
        if pos != end:
            raise _Invalid(
                ErrorCode.CORRUPT_MESSAGE, f"{end - pos} bytes follow the {count} records the batch declares"
            )
    except _Invalid as problem:
        raise ValueError(problem.message) from None
    return out


# The one place the compiled walkers or their pure-Python twins are chosen.
try:
    from icelog.records._records import read_records as read_records  # exported: the compiled ones
    from icelog.records._records import validate_records as validate_records

    COMPILED = True
except ImportError:  # not built (a source tree without `pip install -e .`, or no C compiler at install)
    read_records = read_records_py
    validate_records = validate_records_py
    COMPILED = False


class CorruptRecordsError(KafkaApiError):
    """A batch whose bytes are not one whole v2 batch holding the records its header declares."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A v2 batch as read by `read_batch`: the header fields callers use and its records."""

    base_offset: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[Record]

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


def read_batch(batch: bytes | bytearray | memoryview, compiled: bool = COMPILED) -> RecordBatch:
    """The header fields and records of the one v2 batch `batch` holds (decompressed as its attributes say).

    Raises CorruptRecordsError (CORRUPT_MESSAGE) if the bytes are not one whole v2 batch, its records do not
    decompress or are malformed; KafkaApiError (MESSAGE_TOO_LARGE) for a decompression bomb (`decompress`). The CRC is
    not checked here (`record_format.batch_crc`). `compiled=False` reads with the pure-Python walker.
    """
    view = memoryview(batch)
    if len(view) < HEADER_SIZE:
        raise CorruptRecordsError(f"a batch of {len(view)} bytes is shorter than its header")
    (base_offset, length, _, magic, _, attributes, _, base_ts, max_ts, pid, epoch, base_seq, count) = (
        HEADER.unpack_from(view)
    )
    if magic != 2:
        raise CorruptRecordsError(f"record batch magic {magic} is not supported (only 2)")
    if LOG_OVERHEAD + length != len(view):
        raise CorruptRecordsError(f"batch length {length} does not match its {len(view)} bytes")
    try:
        section = decompress(attributes & ATTR_COMPRESSION_MASK, view[HEADER_SIZE:])
    except KafkaApiError as exc:
        if exc.code != ErrorCode.CORRUPT_MESSAGE:
            raise
        raise CorruptRecordsError(exc.message) from None
    reader = read_records if compiled else read_records_py
    try:
        records = reader(section, count, base_offset, base_ts, max_ts if attributes & ATTR_LOG_APPEND_TIME else None)
    except ValueError as exc:
        raise CorruptRecordsError(str(exc)) from None
    return RecordBatch(base_offset, attributes, base_ts, max_ts, pid, epoch, base_seq, records)


# -- decompression -----------------------------------------------------------------------------------
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, version int32, compatible version int32
_BLOCK_SIZE = struct.Struct(">i")


class _TooLarge(Exception):
    pass


class InflationLimitError(KafkaApiError):
    """Records that decompress to more than the `limit` their caller allowed (MESSAGE_TOO_LARGE)."""

    def __init__(self, codec: int, limit: int) -> None:
        message = f"{CODEC_NAMES[codec]} records decompress to more than {limit} bytes"
        super().__init__(ErrorCode.MESSAGE_TOO_LARGE, message)
        self.codec = codec
        self.limit = limit


def decompress(
    codec: int, payload: bytes | memoryview, one_frame: bool = False, limit: int | None = None
) -> bytes | bytearray | memoryview:
    """The records section of a batch compressed with `codec` (0-4), decompressed.

    Raises CORRUPT_MESSAGE if the payload does not decompress completely, InflationLimitError
    (MESSAGE_TOO_LARGE) as soon as the output passes `limit` bytes (default MAX_UNCOMPRESSED_BYTES), and
    CORRUPT_MESSAGE for a codec id Kafka does not define. With `one_frame`
    (a produced batch) also CORRUPT_MESSAGE for a gzip payload of more than one member or with bytes after
    it, and an lz4 payload of more than one frame or that starts with a skippable frame: librdkafka cannot
    read those (it stops after the first member or frame) and Kafka's Java consumer reads them otherwise.
    Without it (a stored batch, accepted before this was checked) every member and frame is read.

    What is kept is bounded by the size the payload declares (a gzip member's trailer, an lz4 frame's
    content size): more output than that is CORRUPT_MESSAGE at once. Past INLINE_INFLATION, a gzip or lz4
    payload that declares no size or more than `limit` is first decompressed without keeping the output,
    only counting it: a bomb is refused without ever holding (and then freeing) `limit` bytes.
    """
    if codec == CODEC_NONE:
        return payload
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, f"compression codec {codec} is not one of 0-4")
    if limit is None:
        limit = MAX_UNCOMPRESSED_BYTES
    try:
        if codec in (CODEC_GZIP, CODEC_LZ4) and limit > INLINE_INFLATION:
            declared = inflation_hint(codec, payload)
            if declared is None or declared > limit:
                decoder(payload, limit, one_frame, False)
        return decoder(payload, limit, one_frame, True)
    except _TooLarge:
        raise InflationLimitError(codec, limit) from None
    except Exception as exc:  # noqa: BLE001 - each codec library raises its own types for bad input
        raise KafkaApiError(
            ErrorCode.CORRUPT_MESSAGE, f"{CODEC_NAMES[codec]} records do not decompress: {exc or type(exc).__name__}"
        ) from None


def inflation_hint(codec: int, payload: bytes | memoryview) -> int | None:
    """The size `payload` says it decompresses to, read from its headers without decompressing (None: it does
    not say, or they do not parse). Only a hint: a payload may lie, which decompression finds."""
    try:
        if codec == CODEC_NONE:
            return len(payload)
        if codec == CODEC_GZIP:
            return _gzip_size(payload)
        if codec == CODEC_LZ4:
            return int(lz4.frame.get_frame_info(bytes(payload[:32]))["content_size"]) or None
        if codec == CODEC_ZSTD:
            size = int(zstandard.frame_content_size(bytes(payload[:32])))
            return size if size >= 0 else None
        if codec == CODEC_SNAPPY:
            return _snappy_size(memoryview(payload))
    except Exception:  # noqa: BLE001 - each codec library raises its own types for bad headers
        return None
    return None


def _gzip_size(payload: bytes | memoryview) -> int | None:
    # ISIZE, the last four bytes of a gzip member: its size mod 2**32 (more than that is no valid batch).
    return int.from_bytes(payload[-4:], "little") if len(payload) >= 18 else None


def _snappy_size(data: memoryview) -> int | None:
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return read_uvarint(data, 0, max_bytes=VARINT_BYTES)[0]
    total, pos = 0, _XERIAL_HEADER
    while pos + _BLOCK_SIZE.size <= len(data):
        (block_size,) = _BLOCK_SIZE.unpack_from(data, pos)
        pos += _BLOCK_SIZE.size
        if not 0 < block_size <= len(data) - pos:
            return None
        total += read_uvarint(data, pos, max_bytes=VARINT_BYTES)[0]
        pos += block_size
    return total


def _grown(size: int, chunk: bytes, limit: int, declared_end: int | None, declared_by: str) -> int:
    """`size` plus the chunk just decompressed; _TooLarge past `limit`, and CORRUPT_MESSAGE (ValueError) past
    the end the payload declared (it lies: the codec would find it at the end, after keeping all of it)."""
    size += len(chunk)
    if size > limit:
        raise _TooLarge()
    if declared_end is not None and size > declared_end:
        raise ValueError(f"the payload holds more than its {declared_by} says")
    return size


def _gzip(payload: bytes | memoryview, limit: int, one_frame: bool, keep: bool) -> bytearray:
    # Java's GZIPInputStream reads concatenated members as one stream, librdkafka only the first (and then
    # finds the record count wrong: _BAD_MSG): a produced batch must be one member and nothing after it.
    out = bytearray()
    size = 0
    rest = bytes(payload)
    declared = _gzip_size(rest) if one_frame else None
    while True:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = rest
        while True:
            chunk = member.decompress(data, min(DECOMPRESS_STEP, limit - size + 1))
            size = _grown(size, chunk, limit, declared, "gzip member's trailer")
            if keep:
                out += chunk
            data = member.unconsumed_tail
            if member.eof or not data and not chunk:
                break
        if not member.eof:
            raise ValueError("gzip stream is truncated")
        rest = member.unused_data
        if rest and one_frame:
            raise ValueError(f"{len(rest)} bytes follow the first gzip member (one member per batch)")
        if not rest:
            return out


_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204 little-endian; a skippable frame's is 0x184D2A5?


def _lz4(payload: bytes | memoryview, limit: int, one_frame: bool, keep: bool) -> bytes | bytearray:
    # librdkafka stops at the end of the first frame and answers _BAD_MSG for bytes after it (refetching
    # that offset forever); Kafka's KafkaLZ4BlockInputStream reads one frame and refuses another magic, a
    # skippable frame's included: a produced batch must be one lz4 frame and nothing after it.
    out: list[bytes] = []
    size = 0
    rest = bytes(payload)
    if one_frame and rest[:4] != _LZ4_FRAME_MAGIC:
        raise ValueError("the payload does not start with an lz4 frame (a skippable frame or another magic)")
    while True:
        declared = lz4.frame.get_frame_info(rest)["content_size"]  # 0: the frame does not say
        if declared > limit - size:
            raise _TooLarge()
        frame_end = size + declared if declared else None
        frame = lz4.frame.LZ4FrameDecompressor()
        data = rest
        while True:
            # max_length is allocated up front: a step, not the whole limit.
            chunk = frame.decompress(data, max_length=min(DECOMPRESS_STEP, limit - size + 1))
            data = b""
            size = _grown(size, chunk, limit, frame_end, "lz4 frame's header")
            if keep:
                out.append(chunk)
            if frame.eof or frame.needs_input:
                break
        if not frame.eof:
            raise ValueError("lz4 frame is truncated")
        rest = frame.unused_data
        if rest and one_frame:
            raise ValueError(f"{len(rest)} bytes follow the first lz4 frame (one frame per batch)")
        if not rest:
            return out[0] if len(out) == 1 else _joined(out)  # empty when not kept


def _joined(chunks: list[bytes]) -> bytearray:
    """The chunks as one buffer, copied a chunk at a time (one join of 100 MB holds the GIL for ~20 ms)."""
    out = bytearray()
    for chunk in chunks:
        out += chunk
    return out


def _zstd(payload: bytes | memoryview, limit: int, one_frame: bool, keep: bool) -> bytes | bytearray:
    # Several frames are one stream for librdkafka (ZSTD_decompress) and zstd-jni alike: `one_frame` does
    # not apply.
    data = bytes(payload)
    declared = zstandard.frame_content_size(data)  # -1: the frame header does not say
    if declared >= 0:
        if declared > limit:
            raise _TooLarge()
        # One pass: fails on a cut-off frame, on content of another size and on bytes after the frame.
        out: bytes = zstandard.ZstdDecompressor().decompress(data, allow_extra_data=False)
        return out
    # No size in the header (zstd-jni's streams): count a bounded streaming read first (zstd expands up
    # to ~40000x), then decode in full, which also proves the last frame complete (the streaming reader
    # returns a cut-off frame's output without an error).
    total = 0
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        while chunk := reader.read(1 << 20):
            total += len(chunk)
            if total > limit:
                raise _TooLarge()
    frames: list[bytes] = []
    rest = data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frames.append(frame.decompress(rest))
        if not frame.eof:
            raise ValueError("zstd frame is truncated")
        rest = frame.unused_data
    return frames[0] if len(frames) == 1 else _joined(frames)


def _snappy(payload: bytes | memoryview, limit: int, one_frame: bool, keep: bool) -> bytes | bytearray:
    # Kafka's Java clients and kafka-python write xerial's block framing; librdkafka reads both and the
    # Java consumer falls back to raw snappy when the xerial magic is absent (`one_frame` does not apply:
    # xerial's blocks are read one after another by both).
    data = memoryview(payload)
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return _snappy_block(data, limit)
    if len(data) < _XERIAL_HEADER:
        raise ValueError("xerial snappy header is truncated")
    out: list[bytes] = []
    size = 0
    pos = _XERIAL_HEADER
    while pos < len(data):
        if len(data) - pos < _BLOCK_SIZE.size:
            raise ValueError(f"xerial block size at byte {pos} is truncated")
        (block_size,) = _BLOCK_SIZE.unpack_from(data, pos)
        pos += _BLOCK_SIZE.size
        if not 0 < block_size <= len(data) - pos:
            raise ValueError(f"xerial block of {block_size} bytes at byte {pos} does not fit the payload")
        block = _snappy_block(data[pos : pos + block_size], limit - size)
        size += len(block)
        out.append(block)
        pos += block_size
    return out[0] if len(out) == 1 else _joined(out)


def _snappy_block(block: memoryview, limit: int) -> bytes:
    # A raw snappy block starts with its uncompressed length: refuse a bomb before allocating it.
    length, _ = read_uvarint(block, 0, max_bytes=VARINT_BYTES)
    if length > limit:
        raise _TooLarge()
    out: bytes = snappy.decompress(bytes(block))
    return out


# (payload, limit, one_frame, keep): gzip and lz4 only count the output unless `keep`; zstd and snappy know
# their size before decompressing (they count on their own when a zstd frame does not say).
_DECODERS: dict[int, Callable[[bytes | memoryview, int, bool, bool], bytes | bytearray]] = {
    CODEC_GZIP: _gzip,
    CODEC_SNAPPY: _snappy,
    CODEC_LZ4: _lz4,
    CODEC_ZSTD: _zstd,
}
