"""A seeded fuzzer of the Kafka protocol: mutated requests of every API and version icelog serves.

Seeds are well-formed requests built from Kafka's own message specs (kafka-python's generated classes): every
field of every API and version filled in (arrays with one element, strings naming the fuzz topic, Produce
records a real batch of each codec). Each is then mutated (bit flips, boundary integers over length and count
fields, truncation, junk appended, slices duplicated) and sent over a few raw connections, reconnecting
whenever the broker closes one. The suite runs it for seconds (tests/wire/test_fuzz.py); `bench/fuzz_broker.py`
for as long as asked.
"""

from __future__ import annotations

import random
import re
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_key import ApiKey
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.wire.codec import REQUEST_CLASSES
from icelog.wire.versions import SUPPORTED_VERSIONS

FUZZ_TOPIC = "fuzz"
_BOUNDARY_INTS = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 0x40000000)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _batch(codec: int, rng: random.Random) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    for i in range(rng.randint(1, 5)):
        builder.append(i, timestamp=None, key=b"k%d" % i if rng.random() < 0.5 else None,
                       value=bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))), headers=[])
    return bytes(builder.build())


def _fill(cls: Any, fields: list[dict[str, Any]], rng: random.Random) -> Any:
    """An instance of a generated message class with every field set (nested structs: one element)."""
    values: dict[str, Any] = {}
    for field in fields:
        kind: str = field["type"]
        name = _snake(field["name"])
        inner = kind[2:] if kind.startswith("[]") else kind
        value: Any
        if inner in ("int8", "int16", "int32", "int64", "uint16"):
            value = rng.choice((0, 1, 0, 100))
        elif inner == "float64":
            value = 1.0
        elif inner == "bool":
            value = rng.random() < 0.5
        elif inner == "string":
            value = FUZZ_TOPIC
        elif inner == "bytes":
            value = b"\x00\x01fuzz"
        elif inner == "records":
            value = _batch(rng.choice((0, 0, 1, 2, 3, 4)), rng)
        elif inner == "uuid":
            value = None
        else:
            value = _fill(getattr(cls, inner), field.get("fields", []), rng)
        values[name] = [value] if kind.startswith("[]") else value
    return cls(**values)


def seed_frames(rng: random.Random) -> list[tuple[str, bytes]]:
    """(name, request frame without its size prefix) for every API and version icelog serves."""
    frames = []
    for key, (low, high) in sorted(SUPPORTED_VERSIONS.items()):
        cls = REQUEST_CLASSES[key]
        for version in range(low, high + 1):
            request = _fill(cls, cls._json["fields"], rng)
            request.API_VERSION = version
            request.with_header(correlation_id=rng.randrange(1 << 31), client_id="fuzz")
            frame = bytes(request.encode(version=version, header=True, framed=False))
            frames.append((f"{ApiKey(key).name} v{version}", frame))
    return frames


def mutate(frame: bytes, rng: random.Random, corpus: list[tuple[str, bytes]]) -> bytes:
    """`frame` changed by one to four mutations; the api key and version (first four bytes) kept most times."""
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        start = 4 if rng.random() < 0.9 and len(data) > 4 else 0
        if len(data) <= start:
            data += bytes(rng.randrange(256) for _ in range(8))
            continue
        at = rng.randrange(start, len(data))
        kind = rng.randrange(7)
        if kind == 0:  # bit flips
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a boundary integer over a length or count field
            width = rng.choice((1, 2, 4))
            value = rng.choice(_BOUNDARY_INTS) & ((1 << (8 * width)) - 1)
            data[at : at + width] = value.to_bytes(width, "big")
        elif kind == 2:  # truncated
            del data[at:]
        elif kind == 3:  # junk appended
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif kind == 4:  # a slice repeated
            end = min(len(data), at + rng.randint(1, 32))
            data[at:at] = data[at:end] * rng.randint(1, 8)
        elif kind == 5:  # bytes replaced by 0xff (-1 lengths, invalid UTF-8)
            data[at : at + rng.randint(1, 4)] = b"\xff" * rng.randint(1, 4)
        else:  # spliced with another request
            other = rng.choice(corpus)[1]
            cut = rng.randrange(4, max(5, len(other)))
            data[at:] = other[cut:]
    return bytes(data)


@dataclass
class FuzzStats:
    sent: int = 0
    reconnects: int = 0
    answered_bytes: int = 0


class _Connection:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sent = 0

    def send(self, frame: bytes) -> bool:
        """Send one framed request; False if the broker has closed the connection."""
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        except OSError:
            return False
        self.sent += 1
        return True

    def drain(self) -> int | None:
        """Bytes the broker has sent so far (not waited for); None once it has closed the connection."""
        total = 0
        while select.select([self.sock], [], [], 0)[0]:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            total += len(chunk)
        return total

    def close(self) -> None:
        self.sock.close()


def fuzz(host: str, port: int, seed: int, seconds: float, connections: int = 4) -> FuzzStats:
    """Send mutated requests for `seconds` over `connections` raw connections (each replaced after 100
    requests or when the broker closes it); every connection is closed on return."""
    rng = random.Random(seed)
    corpus = seed_frames(rng)
    stats = FuzzStats()
    pool = [_Connection(host, port) for _ in range(connections)]
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            slot = rng.randrange(connections)
            conn = pool[slot]
            frame = mutate(rng.choice(corpus)[1], rng, corpus) if rng.random() < 0.97 else rng.choice(corpus)[1]
            alive = conn.send(frame)
            stats.sent += alive
            drained = conn.drain() if alive else None
            if drained is None or conn.sent >= 100:
                conn.close()
                pool[slot] = _Connection(host, port)
                stats.reconnects += 1
            else:
                stats.answered_bytes += drained
    finally:
        for conn in pool:
            conn.close()
    return stats
