"""The zigzag varint codec of Kafka records (and of Confluent's message indexes, which use the same one).

Kafka writes signed integers zigzag-encoded in base-128 varints: at most 5 bytes for an int32 field
(`varint`) and 10 for an int64 one (`varlong`). Reading refuses a truncated varint and one longer than its
field allows, as Kafka's `ByteUtils.readVarint` does, and also one whose last byte carries bits beyond the
field's width (Kafka drops those silently; a client that sends them has a bug worth reporting).
"""

from __future__ import annotations

VARINT_BYTES = 5  # int32 fields: record length, offset delta, key/value/header lengths, header count
VARLONG_BYTES = 10  # int64 fields: the record's timestamp delta


class VarintError(ValueError):
    """The bytes at a position do not hold a well-formed varint."""


def zigzag_encode(value: int) -> int:
    """The unsigned zigzag form of a signed 64-bit value."""
    return ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF


def zigzag_decode(raw: int) -> int:
    """The signed value of an unsigned zigzag form."""
    return (raw >> 1) ^ -(raw & 1)


def read_uvarint(
    data: bytes | bytearray | memoryview, pos: int, end: int | None = None, max_bytes: int = VARLONG_BYTES
) -> tuple[int, int]:
    """(unsigned value, position after it) of the base-128 varint at `pos`, reading no further than `end`.

    Raises VarintError if it is truncated (reaches `end`), longer than `max_bytes` (5: an int32 field,
    10: an int64 one) or carries bits beyond that width in its last byte.
    """
    limit = len(data) if end is None else end
    raw = 0
    for i in range(max_bytes):
        if pos >= limit:
            raise VarintError("varint is truncated")
        byte = data[pos]
        pos += 1
        if i == max_bytes - 1:
            if byte & 0x80:
                raise VarintError(f"varint is longer than {max_bytes} bytes")
            width = 32 if max_bytes == VARINT_BYTES else 64
            if byte >> (width - 7 * i):
                raise VarintError(f"varint overflows {width} bits")
        raw |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return raw, pos
    raise VarintError(f"varint is longer than {max_bytes} bytes")  # only for max_bytes < 1


def read_varint(
    data: bytes | bytearray | memoryview, pos: int, end: int | None = None, max_bytes: int = VARLONG_BYTES
) -> tuple[int, int]:
    """(signed value, position after it) of the zigzag varint at `pos`; errors as `read_uvarint`."""
    raw, pos = read_uvarint(data, pos, end, max_bytes)
    return zigzag_decode(raw), pos


def write_varint(value: int, out: bytearray) -> None:
    """Append the zigzag varint of `value` to `out`."""
    raw = zigzag_encode(value)
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def encode_varint(value: int) -> bytes:
    """The zigzag varint of `value`."""
    out = bytearray()
    write_varint(value, out)
    return bytes(out)
