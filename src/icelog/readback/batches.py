"""Kafka RecordBatch v2 bytes from archived rows: one batch per producer batch (`kafka.batch_start`).

Batches are written uncompressed (a consumer decodes them with no codec work, and building one costs no
compression CPU on the broker), with no producer id (the table holds committed records only, so nothing
is transactional) and the original offsets: records missing from the table (deleted rows, aborted
transactions, control batches) leave gaps in the offset deltas, as after Kafka's log compaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from icelog.log.record_format import ATTR_LOG_APPEND_TIME, CRC, CRC_START, HEADER, LOG_OVERHEAD, UINT32
from icelog.log.varint import write_varint

Header = tuple[str, bytes | None]
# (offset, timestamp ms, key, value, headers)
Row = tuple[int, int, bytes | None, bytes | None, Sequence[Header]]


def _write_bytes(value: bytes | None, out: bytearray) -> None:
    if value is None:
        out.append(1)  # zigzag(-1)
    else:
        write_varint(len(value), out)
        out += value


def encode_batch(base_offset: int, rows: Sequence[Row], log_append_time: bool = False) -> bytes:
    """One uncompressed batch holding `rows` (offset order, all >= base_offset)."""
    if not rows:
        raise ValueError("a record batch needs at least one record")
    timestamps = [row[1] for row in rows]
    base_ts, max_ts = (timestamps[0], max(timestamps))
    if log_append_time:
        base_ts = max_ts  # LogAppendTime: every record's timestamp is the batch's maxTimestamp
    body = bytearray()
    record = bytearray()
    for offset, timestamp, key, value, headers in rows:
        record.clear()
        record.append(0)  # record attributes
        write_varint(0 if log_append_time else timestamp - base_ts, record)
        write_varint(offset - base_offset, record)
        _write_bytes(key, record)
        _write_bytes(value, record)
        write_varint(len(headers), record)
        for hkey, hvalue in headers:
            _write_bytes(hkey.encode(), record)
            _write_bytes(hvalue, record)
        write_varint(len(record), body)
        body += record
    attributes = ATTR_LOG_APPEND_TIME if log_append_time else 0
    last_delta = rows[-1][0] - base_offset
    out = bytearray(HEADER.size)
    HEADER.pack_into(
        out, 0, base_offset, HEADER.size - LOG_OVERHEAD + len(body), 0, 2, 0, attributes, last_delta,
        base_ts, max_ts, -1, -1, -1, len(rows),
    )
    out += body
    UINT32.pack_into(out, CRC, crc32c.crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
