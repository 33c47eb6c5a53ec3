"""Kafka RecordBatch v2 bytes from archived rows: one batch per producer batch (`kafka.batch_start`).

Batches are written uncompressed (a consumer decodes them with no codec work, and building one costs no
compression CPU on the broker), with no producer id (the table holds committed records only, so nothing
is transactional) and the original offsets: records missing from the table (deleted rows, aborted
transactions, control batches) leave gaps in the offset deltas, as after Kafka's log compaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from icelog.records.record_format import ATTR_LOG_APPEND_TIME, CRC, HEADER, LOG_OVERHEAD, UINT32, batch_crc
from icelog.records.varint import encode_varint

Header = tuple[str, bytes | None]
# (offset, timestamp ms, key, value, headers)
Row = tuple[int, int, bytes | None, bytes | None, Sequence[Header]]


# Zigzag varints of -1 .. 2**14-1 (null lengths, deltas, lengths of ordinary keys and values), precomputed:
# building a batch is one bytes join per record instead of a loop per varint.
_SMALL = 1 << 14
_VARINTS = [encode_varint(i) for i in range(-1, _SMALL)]


def _varint(value: int) -> bytes:
    return _VARINTS[value + 1] if -1 <= value < _SMALL else encode_varint(value)


def header_section(headers: Sequence[Header]) -> bytes:
    """A record's headers as stored: the count, then each key and value, length-prefixed."""
    out = [_varint(len(headers))]
    for hkey, hvalue in headers:
        raw = hkey.encode()
        out += (_varint(len(raw)), raw, b"\x01" if hvalue is None else _varint(len(hvalue)) + hvalue)
    return b"".join(out)


def encode_batch(base_offset: int, rows: Sequence[Row], log_append_time: bool = False) -> bytes:
    """One uncompressed batch holding `rows` (offset order, all >= base_offset)."""
    if not rows:
        raise ValueError("a record batch needs at least one record")
    timestamps = [row[1] for row in rows]
    base_ts, max_ts = (timestamps[0], max(timestamps))
    if log_append_time:
        base_ts = max_ts  # LogAppendTime: every record's timestamp is the batch's maxTimestamp
    parts: list[bytes] = []
    append = parts.append
    varints, small = _VARINTS, _SMALL
    for offset, timestamp, key, value, headers in rows:
        ts_delta = 0 if log_append_time else timestamp - base_ts
        delta = offset - base_offset
        record = b"".join((
            b"\x00",  # record attributes
            varints[ts_delta + 1] if -1 <= ts_delta < small else encode_varint(ts_delta),
            varints[delta + 1] if delta < small else encode_varint(delta),
            b"\x01" if key is None else _varint(len(key)) + key,
            b"\x01" if value is None else _varint(len(value)) + value,
            header_section(headers) if headers else b"\x00",
        ))
        size = len(record)
        append(varints[size + 1] if size < small else encode_varint(size))
        append(record)
    body = b"".join(parts)
    attributes = ATTR_LOG_APPEND_TIME if log_append_time else 0
    last_delta = rows[-1][0] - base_offset
    out = bytearray(HEADER.size)
    HEADER.pack_into(
        out, 0, base_offset, HEADER.size - LOG_OVERHEAD + len(body), 0, 2, 0, attributes, last_delta,
        base_ts, max_ts, -1, -1, -1, len(rows),
    )
    out += body
    UINT32.pack_into(out, CRC, batch_crc(out))
    return bytes(out)
