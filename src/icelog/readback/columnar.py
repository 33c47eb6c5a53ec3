"""Record batches from columns: every record of a data file framed at once with pyarrow / numpy kernels.

The same bytes as `batches.encode_batch` (tests check they are equal), without a Python loop per record:
varints come from a precomputed table by `take`, a record is one `binary_join_element_wise` of its
parts, and a batch's records are one slice of the joined array's data buffer. Only the header of each
batch (a few hundred records) is packed in Python. Rows whose headers are not empty, and deltas outside
the table (a batch spanning more than a minute of timestamps), fall back to Python for that column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, cast

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icelog.records.record_format import ATTR_LOG_APPEND_TIME, CRC, CRC_START, HEADER, LOG_OVERHEAD, UINT32
from icelog.records.varint import encode_varint

BinaryArray: TypeAlias = "pa.Array[pa.LargeBinaryScalar]"  # large_binary: payloads, varints, framed records

_LOW, _HIGH = -(1 << 16), 1 << 16
_TABLE: BinaryArray | None = None
_ZERO = pa.scalar(b"\x00", pa.large_binary())
_EMPTY = pa.scalar(b"", pa.large_binary())
_NULL_LENGTH = -1


def _table() -> BinaryArray:
    global _TABLE
    if _TABLE is None:
        _TABLE = pa.array([encode_varint(i) for i in range(_LOW, _HIGH)], pa.large_binary())
    return _TABLE


def _varints(values: np.ndarray) -> BinaryArray:
    """The zigzag varint of each value, as a binary array."""
    if len(values) == 0 or (values.min() >= _LOW and values.max() < _HIGH):
        return _table().take(pa.array(values - _LOW))
    return pa.array([encode_varint(int(v)) for v in values], pa.large_binary())


def _sized(payloads: BinaryArray) -> tuple[BinaryArray, BinaryArray]:
    """(length varints, bytes) of a nullable binary column; a null has length -1 and no bytes."""
    lengths = pc.fill_null(pc.binary_length(payloads), _NULL_LENGTH).to_numpy(zero_copy_only=False)
    return _varints(lengths.astype(np.int64)), pc.fill_null(payloads, _EMPTY)


def encode_batches(
    offsets: np.ndarray, timestamps: np.ndarray, starts: np.ndarray, keys: BinaryArray, values: BinaryArray,
    headers: Sequence[bytes] | None, log_append_time: bool = False,
) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, batch bytes) per run of rows sharing a batch start (rows in offset order).

    `keys`/`values`: large_binary arrays (null: a null payload); `headers`: each row's encoded headers
    section (count and headers) or None when no row has any.
    """
    n = len(offsets)
    if n == 0:
        return []
    firsts = np.concatenate(([0], np.flatnonzero(np.diff(starts)) + 1))
    sizes = np.diff(np.concatenate((firsts, [n])))
    bases = np.minimum(starts[firsts], offsets[firsts])
    max_ts = np.maximum.reduceat(timestamps, firsts)
    base_ts = max_ts if log_append_time else timestamps[firsts]
    ts_delta = np.zeros(n, np.int64) if log_append_time else timestamps - np.repeat(base_ts, sizes)
    key_len, key_bytes = _sized(keys)
    value_len, value_bytes = _sized(values)
    header_part = _ZERO if headers is None else pa.array(headers, pa.large_binary())
    body = pc.binary_join_element_wise(
        _ZERO, _varints(ts_delta), _varints(offsets - np.repeat(bases, sizes)), key_len, key_bytes, value_len,
        value_bytes, header_part, _EMPTY,
    )
    lengths = pc.binary_length(body).to_numpy(zero_copy_only=False).astype(np.int64)
    framed = pc.binary_join_element_wise(_varints(lengths), body, _EMPTY)
    if isinstance(framed, pa.ChunkedArray):
        framed = framed.combine_chunks()
    positions = np.frombuffer(framed.buffers()[1], np.int64)[framed.offset : framed.offset + n + 1]
    data = memoryview(framed.buffers()[2])
    attributes = ATTR_LOG_APPEND_TIME if log_append_time else 0
    out = []
    for g, first in enumerate(firsts.tolist()):
        end = first + int(sizes[g])
        records = data[positions[first] : positions[end]]
        base, last = int(bases[g]), int(offsets[end - 1])
        head = bytearray(HEADER.size)
        HEADER.pack_into(head, 0, base, HEADER.size - LOG_OVERHEAD + len(records), 0, 2, 0, attributes,
                         last - base, int(base_ts[g]), int(max_ts[g]), -1, -1, -1, end - first)
        crc = crc32c.crc32c(records, crc32c.crc32c(memoryview(head)[CRC_START:]))
        UINT32.pack_into(head, CRC, crc)
        out.append((base, last, bytes(head) + bytes(records)))
    return out


def as_binary(payloads: Sequence[bytes | None] | BinaryArray | pa.ChunkedArray[pa.LargeBinaryScalar]) -> BinaryArray:
    """A Python list (or arrow array) of payloads as a large_binary array."""
    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    if isinstance(payloads, pa.Array):  # (pyarrow-stubs type a cast's result by its DataType, not by its scalar)
        return cast(BinaryArray, payloads.cast(pa.large_binary()))
    return pa.array(payloads, pa.large_binary())
