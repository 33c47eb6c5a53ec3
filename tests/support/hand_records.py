"""Kafka v2 records written by hand, independently of the broker's code, for the bad-input tests."""

from __future__ import annotations


def zz(value: int) -> bytes:
    """A zigzag varint."""
    raw = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while raw > 0x7F:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def record(offset_delta: int, value: bytes | None = b"v", ts_delta: int = 0, key: bytes | None = None,
           headers: list[tuple[bytes, bytes | None]] | None = None, length_delta: int = 0) -> bytes:
    """One record (length prefix included); `length_delta` makes the length prefix lie by that much."""
    def field(data: bytes | None) -> bytes:
        return zz(-1) if data is None else zz(len(data)) + data

    hdrs = headers or []
    body = (b"\x00" + zz(ts_delta) + zz(offset_delta) + field(key) + field(value) + zz(len(hdrs))
            + b"".join(zz(len(k)) + k + field(v) for k, v in hdrs))
    return zz(len(body) + length_delta) + body
