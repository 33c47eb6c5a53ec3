"""Unit tests of the record format code the broker validates produced batches with.

* The compiled record walker (icelog.records._records) and its pure-Python twin give the same answer on the
  same inputs: valid batches from kafka-python's builder and thousands of corrupted copies of them.
* The one record-batch reader (records.read_batch, compiled and pure) reads what kafka-python's reader
  reads from generated batches of every codec, and both answer alike on corrupt ones.
* Decompression of every codec, refusing truncated payloads and decompression bombs.
* The varint codec, and Kafka error codes generated from kafka-python.
"""

from __future__ import annotations

import gzip
import random
import re
import struct
from pathlib import Path
from typing import Any

import kafka.codec
import kafka.errors
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.errors import ErrorCode, KafkaApiError, is_retriable
from icelog.records import walk as records
from icelog.records.batch import first_record_at_or_after, set_log_append_time
from icelog.records.record_format import HEADER, HEADER_SIZE, batch_crc
from icelog.records.varint import VarintError, encode_varint, read_uvarint, read_varint
from tests.support.hand_records import record, zz

SRC = Path(__file__).resolve().parents[2] / "src"


# -- the compiled walker and the pure-Python one agree -------------------------------------------------
def built_batch(rng: random.Random, count: int) -> tuple[bytes, int, int, int]:
    """(records section, count, base timestamp, max timestamp) of a random valid batch."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
    base = rng.choice([0, 1_700_000_000_000, -1])
    for i in range(count):
        ts = base if base < 0 else base + rng.randrange(5000)  # out of order within a batch is fine
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 300))
        headers = [
            (rng.choice(["h", "trace-id", "ünï", ""]), None if rng.random() < 0.2 else rng.randbytes(rng.randrange(9)))
            for _ in range(rng.randrange(4))
        ]
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    data = bytes(builder.build())
    _, _, _, _, _, _, _, base_ts, max_ts, _, _, _, n = HEADER.unpack_from(data)
    return data[HEADER_SIZE:], n, base_ts, max_ts


def mutations(rng: random.Random, data: bytes) -> list[bytes]:
    """Corrupted copies: flipped and set bytes, cuts, insertions, deletions."""
    out = []
    for _ in range(12):
        copy = bytearray(data)
        kind = rng.randrange(5)
        at = rng.randrange(len(copy))
        if kind == 0:
            copy[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            copy[at] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, 0xC3, 0xED, 0xF4])
        elif kind == 2:
            del copy[at:]
        elif kind == 3:
            copy[at:at] = rng.randbytes(rng.randrange(1, 4))
        else:
            del copy[at : at + rng.randrange(1, 4)]
        out.append(bytes(copy))
    return out


@pytest.fixture(scope="module")
def compiled():
    if not records.COMPILED:
        pytest.fail("icelog.records._records is not built: run `pip install -e .` (needs gcc and Python headers)")
    from icelog.records._records import validate_records

    return validate_records


def test_compiled_and_python_walkers_agree_on_valid_and_corrupt_batches(compiled) -> None:
    rng = random.Random(20261123)
    answers: dict[int, int] = {}
    for round_ in range(300):
        data, count, base_ts, max_ts = built_batch(rng, rng.randrange(1, 8))
        assert compiled(data, count, base_ts) == max_ts  # the records' max, as the builder wrote it
        assert records.validate_records_py(data, count, base_ts) == max_ts
        cases = [(m, count, base_ts) for m in mutations(rng, data)]
        cases += [(data, count + 1, base_ts), (data, count - 1, base_ts)]
        cases += [(data, count, base_ts - 7), (data, count, -(1 << 63))]
        for case in cases:
            expected = records.validate_records_py(*case)
            assert compiled(*case) == expected, (round_, case)
            code = -1 if isinstance(expected, int) else expected[0]
            answers[code] = answers.get(code, 0) + 1
    # the corpus exercised every kind of answer
    assert set(answers) == {-1, ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_TIMESTAMP, ErrorCode.INVALID_RECORD}


def test_a_compacted_topic_refuses_the_first_keyless_record_in_both_walkers(compiled) -> None:
    rng = random.Random(20261124)
    refused = 0
    for _ in range(200):
        data, count, base_ts, max_ts = built_batch(rng, rng.randrange(1, 8))
        builder_keys = [r.key for r in records_of(data, count, base_ts)]
        keyless = next((i for i, key in enumerate(builder_keys) if key is None), None)
        message = f"record {keyless}: a compacted topic cannot accept a record without a key"
        expected = max_ts if keyless is None else (ErrorCode.INVALID_RECORD, keyless, message)
        assert records.validate_records_py(data, count, base_ts, True) == expected
        assert compiled(data, count, base_ts, True) == expected
        assert compiled(data, count, base_ts) == max_ts  # other topics take keyless records
        refused += keyless is not None
        for case in mutations(rng, data)[:20]:  # broken bytes: the same answer from both, keys required
            assert compiled(case, count, base_ts, True) == records.validate_records_py(case, count, base_ts, True)
    assert 0 < refused < 200


def test_the_timestamp_window_refuses_the_first_record_outside_it_in_both_walkers(compiled) -> None:
    """message.timestamp.before.max.ms / after.max.ms: a timestamp outside [earliest, latest] is INVALID_TIMESTAMP
    with its record's index; -1 (no timestamp) is never out of the window; the bounds themselves are in it."""
    rng = random.Random(20261128)
    refused = 0
    for _ in range(300):
        data, count, base_ts, max_ts = built_batch(rng, rng.randrange(1, 8))
        stamps = [r.timestamp for r in records_of(data, count, base_ts)]
        real = [t for t in stamps if t != -1] or [0]
        earliest = rng.choice([min(real), min(real) + 1, -(1 << 63), 1_700_000_002_000])
        latest = rng.choice([max(real), max(real) - 1, (1 << 63) - 1, 1_700_000_003_000])
        outside = next((i for i, t in enumerate(stamps) if t != -1 and not earliest <= t <= latest), None)
        if outside is None:
            expected: Any = max_ts
        else:
            message = (f"record {outside}: timestamp {stamps[outside]} is out of range: it must be within "
                       f"[{earliest}, {latest}]")
            expected = (ErrorCode.INVALID_TIMESTAMP, outside, message)
        assert records.validate_records_py(data, count, base_ts, False, earliest, latest) == expected
        assert compiled(data, count, base_ts, False, earliest, latest) == expected
        refused += outside is not None
        for case in mutations(rng, data)[:10]:  # broken bytes: the same answer from both, window applied
            assert compiled(case, count, base_ts, False, earliest, latest) == records.validate_records_py(
                case, count, base_ts, False, earliest, latest)
    assert 0 < refused < 300


def records_of(section: bytes, count: int, base_ts: int) -> list[Any]:
    """The records of a records section, read by kafka-python (a batch header put back in front)."""
    from kafka.record.default_records import DefaultRecordBatch

    header = bytearray(HEADER_SIZE)
    HEADER.pack_into(header, 0, 0, HEADER_SIZE - 12 + len(section), 0, 2, 0, 0, count - 1, base_ts, base_ts, -1, -1,
                     -1, count)
    return list(DefaultRecordBatch(bytes(header) + section))


def test_compiled_utf8_check_of_header_keys_is_pythons(compiled) -> None:
    rng = random.Random(7)
    alphabet = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xA0, 0x9F, 0xED, 0xEF, 0xF0, 0x90,
                0x8F, 0xF4, 0xF5, 0xFF]
    for _ in range(5000):
        key = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 6)))
        data = record(0, headers=[(key, b"v")])
        try:
            key.decode("utf-8")
            expected: int | tuple[int, int, str] = 0  # the record's timestamp
        except UnicodeDecodeError:
            expected = (ErrorCode.INVALID_RECORD, 0, "record 0: header 0 key is not valid UTF-8")
        assert compiled(data, 1, 0) == expected, key
        assert records.validate_records_py(data, 1, 0) == expected, key


HAND_MADE: dict[str, tuple[bytes, int, int, int]] = {  # records, count, base ts, expected code
    "valid": (record(0) + record(1, headers=[(b"k", None)]), 2, 100, 0),
    "null key, value and header value": (record(0, value=None, headers=[(b"", None)]), 1, 5, 0),
    "length too long": (record(0, length_delta=+3) + b"\x00\x00", 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "length too short": (record(0, length_delta=-1), 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "length past the end": (record(0, length_delta=+3), 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "negative length": (zz(-5) + b"\x00" * 8, 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "truncated varint": (zz(7) + b"\x00\x00\x00\x01\x01v\x80", 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "varint of 6 bytes": (zz(10) + b"\x00\x00" + b"\x80" * 5 + b"\x00\x01\x00\x00", 1, 0,
                          ErrorCode.CORRUPT_MESSAGE),
    "varint past 32 bits": (zz(10) + b"\x00\x00" + b"\x80" * 4 + b"\x10\x01\x00\x00", 1, 0,
                            ErrorCode.CORRUPT_MESSAGE),
    "fewer records than the count": (record(0) + record(1), 3, 0, ErrorCode.CORRUPT_MESSAGE),
    "more records than the count": (record(0) + record(1), 1, 0, ErrorCode.CORRUPT_MESSAGE),
    "offset deltas 0, 2": (record(0) + record(2), 2, 0, ErrorCode.CORRUPT_MESSAGE),
    "offset deltas 1, 0": (record(1) + record(0), 2, 0, ErrorCode.CORRUPT_MESSAGE),
    "value length -70": (record(0, value=b"v" * 100).replace(zz(100) + b"v", zz(-70) + b"v", 1), 1, 0,
                         ErrorCode.CORRUPT_MESSAGE),
    "value length past the record": (record(0, value=b"v" * 100).replace(zz(100) + b"v", zz(101) + b"v", 1), 1, 0,
                                     ErrorCode.CORRUPT_MESSAGE),
    "key length -2": (record(0, key=b"ab").replace(zz(2) + b"ab", zz(-2) + b"ab", 1), 1, 0,
                      ErrorCode.CORRUPT_MESSAGE),
    "null header key": (record(0, headers=[(b"k", b"v")]).replace(zz(1) + b"k", zz(-1) + b"k", 1), 1, 0,
                        ErrorCode.CORRUPT_MESSAGE),
    "header key past the record": (record(0, headers=[(b"k", None)]).replace(zz(1) + b"k", zz(9) + b"k"),
                                   1, 0, ErrorCode.CORRUPT_MESSAGE),
    "header key not UTF-8": (record(0, headers=[(b"\xff\xfe", b"v")]), 1, 0, ErrorCode.INVALID_RECORD),
    "header key a surrogate": (record(0, headers=[(b"\xed\xa0\x80", b"v")]), 1, 0, ErrorCode.INVALID_RECORD),
    "negative header count": (zz(6) + b"\x00" + zz(0) + zz(0) + zz(-1) + zz(-1) + zz(-3), 1, 0,
                              ErrorCode.CORRUPT_MESSAGE),
    "negative timestamp": (record(0, ts_delta=-2000), 1, 1000, ErrorCode.INVALID_TIMESTAMP),
    "no timestamp (-1)": (record(0, ts_delta=-1001), 1, 1000, 0),
    "timestamps out of order": (record(0, ts_delta=5) + record(1, ts_delta=-3), 2, 1000, 0),
    "empty": (b"", 1, 0, ErrorCode.CORRUPT_MESSAGE),
}


@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_hand_made_records(compiled, case: str) -> None:
    data, count, base_ts, expected = HAND_MADE[case]
    python = records.validate_records_py(data, count, base_ts)
    assert compiled(data, count, base_ts) == python
    assert (0 if isinstance(python, int) else python[0]) == expected, python


@pytest.mark.parametrize(("deltas", "base_ts", "expected"), [
    ([0, 20, -3], 1000, 1020),  # out of order: the largest, not the last
    ([0, 0], -1, -1),  # no timestamps (Sarama before v1.x, kafka-python 1.x without one): -1
    ([0, 1001, 0], -1, 1000),  # -1 and real ones mixed: the real max
    ([7], 1_700_000_000_000, 1_700_000_000_007),
])
def test_validation_answers_the_records_max_timestamp_whatever_the_header_says(
    compiled, deltas: list[int], base_ts: int, expected: int
) -> None:
    # Kafka's LogValidator stores this max in the batch header, whatever the producer wrote there.
    data = b"".join(record(i, ts_delta=d) for i, d in enumerate(deltas))
    assert records.validate_records_py(data, len(deltas), base_ts) == expected
    assert compiled(data, len(deltas), base_ts) == expected


# -- reading records: read_batch, compiled and pure ------------------------------------------------
@pytest.fixture(scope="module")
def compiled_reader():
    if not records.COMPILED:
        pytest.fail("icelog.records._records is not built: run `pip install -e .` (needs gcc and Python headers)")
    from icelog.records._records import read_records

    return read_records


def read_outcome(reader: Any, *args: Any) -> Any:
    """A reader's records, or the message of the ValueError it raised."""
    try:
        return reader(*args)
    except ValueError as exc:
        return f"ValueError: {exc}"


def generated_batch(rng: random.Random, codec: int) -> bytes:
    """A whole random v2 batch as a producer writes it (kafka-python's builder), offsets assigned."""
    builder = DefaultRecordBatchBuilder(2, codec, rng.random() < 0.3, rng.choice([-1, 7]), rng.choice([-1, 3]),
                                        rng.choice([-1, 0, 41]), 1 << 22)
    base = rng.choice([0, 1_700_000_000_000, -1])
    for i in range(rng.randrange(1, 40)):
        ts = base if base < 0 else base + rng.randrange(5000)
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 150)) + bytes(rng.randrange(150))
        headers = [
            (rng.choice(["h", "trace-id", "ünï", ""]), None if rng.random() < 0.2 else rng.randbytes(rng.randrange(9)))
            for _ in range(rng.randrange(4))
        ]
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, rng.choice([0, 5, 1 << 40]))  # the base offset the broker assigns
    if rng.random() < 0.2:
        set_log_append_time(data, [type("B", (), {"position": 0, "size": len(data)})()], 1_800_000_000_000)
    return bytes(data)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_read_batch_reads_what_kafka_python_reads_compiled_and_pure(compiled_reader, codec: int) -> None:
    from kafka.record.default_records import DefaultRecordBatch

    rng = random.Random(20261125 + codec)
    compressed = 0
    for _ in range(150):
        data = generated_batch(rng, codec)
        theirs = DefaultRecordBatch(data)
        expected = [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers)) for r in theirs]
        for compiled in (True, False):
            batch = records.read_batch(data, compiled=compiled)
            assert batch.records == expected
            assert (batch.base_offset, batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
                theirs.base_offset, theirs.producer_id, theirs.producer_epoch, theirs.base_sequence)
            assert (batch.is_transactional, batch.is_control, batch.compression) == (
                theirs.is_transactional, theirs.is_control_batch, theirs.compression_type)
        compressed += theirs.compression_type == codec  # (kafka-python writes a batch plain if that is smaller)
        # timestamp look-ups read the same records
        stamps = sorted({ts for _, ts, _, _, _ in expected})
        wanted = rng.choice(stamps) if rng.random() < 0.8 else stamps[-1] + 1
        first = next(((o, ts) for o, ts, _, _, _ in expected if ts >= wanted), None)
        assert first_record_at_or_after(data, wanted) == first
    assert compressed > 100


def test_read_records_compiled_and_pure_agree_on_valid_and_corrupt_sections(compiled_reader) -> None:
    rng = random.Random(20261126)
    outcomes = {"read": 0, "refused": 0}
    for round_ in range(300):
        data, count, base_ts, max_ts = built_batch(rng, rng.randrange(1, 8))
        base_offset = rng.choice([0, 1000, (1 << 63) - 3])
        append_time = rng.choice([None, max_ts])
        cases = [(data, count), (data, count + 1), (data, count - 1)] + [(m, count) for m in mutations(rng, data)]
        for section, n in cases:
            args = (section, n, base_offset, base_ts, append_time)
            expected = read_outcome(records.read_records_py, *args)
            assert read_outcome(compiled_reader, *args) == expected, (round_, args)
            outcomes["refused" if isinstance(expected, str) else "read"] += 1
            # the invariant: a section the produce checks accept reads as exactly its records, offsets in order
            if base_offset < 1 << 62 and isinstance(records.validate_records_py(section, n, base_ts), int):
                assert [r[0] for r in expected] == list(range(base_offset, base_offset + n))
    assert min(outcomes.values()) > 100, outcomes


@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_hand_made_records_read_alike(compiled_reader, case: str) -> None:
    data, count, base_ts, _expected = HAND_MADE[case]
    expected = read_outcome(records.read_records_py, data, count, 10, base_ts)
    assert read_outcome(compiled_reader, data, count, 10, base_ts) == expected
    # Reading keeps the structural checks only: gaps in offset deltas (as after compaction) and any
    # timestamps read; broken bytes and bad header keys do not.
    structural = case not in {"offset deltas 0, 2", "offset deltas 1, 0", "negative timestamp"}
    assert isinstance(expected, str) == (structural and _expected != 0), expected


def test_archived_rows_served_back_read_with_their_offset_gaps() -> None:
    from icelog.readback.batches import encode_batch

    rows = [(100, 5, None, b"a", [("h", b"x")]), (103, 9, b"k", None, []), (107, 7, b"", b"c", [("", None)])]
    data = encode_batch(100, rows)
    for compiled in (True, False):
        batch = records.read_batch(data, compiled=compiled)
        assert batch.records == [(o, ts, k, v, tuple(h)) for o, ts, k, v, h in rows]
    logged = encode_batch(100, rows, log_append_time=True)
    assert [r[1] for r in records.read_batch(logged).records] == [9, 9, 9]


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_read_batch_refuses_broken_batches_alike(compiled_reader, monkeypatch: pytest.MonkeyPatch, codec: int) -> None:
    rng = random.Random(codec)
    data = generated_batch(rng, codec)
    broken = {
        "truncated payload": data[:-3],
        "short header": data[:HEADER_SIZE - 1],
        "magic 1": data[:16] + b"\x01" + data[17:],
        "records count + 1": data[:57] + struct.pack(">i", HEADER.unpack_from(data)[12] + 1) + data[61:],
        "payload not of the codec": data[:HEADER_SIZE] + b"\x00" * 40,
    }
    for name, bad in broken.items():
        bad = bad[:8] + struct.pack(">i", len(bad) - 12) + bad[12:] if len(bad) >= 12 else bad
        answers = []
        for compiled in (True, False):
            with pytest.raises(KafkaApiError) as caught:
                records.read_batch(bad, compiled=compiled)
            answers.append((caught.value.code, str(caught.value)))
        assert answers[0] == answers[1] and answers[0][0] == ErrorCode.CORRUPT_MESSAGE, (name, answers)
    with pytest.raises(KafkaApiError, match="does not match"):
        records.read_batch(data + b"\x00")
    monkeypatch.setattr(records, "MAX_UNCOMPRESSED_BYTES", 1 << 20)
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 24)
    builder.append(0, timestamp=0, key=None, value=b"\x00" * (2 << 20), headers=[])
    with pytest.raises(KafkaApiError) as caught:
        records.read_batch(bytes(builder.build()))
    assert caught.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_read_batch_does_not_check_the_crc() -> None:
    data = bytearray(generated_batch(random.Random(3), 0))
    data[-1] ^= 0xFF  # a changed value byte: the decode path checks the CRC itself, before reading
    assert batch_crc(data) != HEADER.unpack_from(data)[4]
    assert len(records.read_batch(bytes(data)).records) == HEADER.unpack_from(data)[12]


# -- decompression ---------------------------------------------------------------------------------
PLAIN = b"".join(record(i, value=bytes([i % 7]) * 300) for i in range(200))
ENCODERS = {
    1: kafka.codec.gzip_encode,
    2: kafka.codec.snappy_encode,  # xerial framing, as kafka-python and the Java client write it
    3: kafka.codec.lz4_encode,
    4: kafka.codec.zstd_encode,
}


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["gzip", "snappy", "lz4", "zstd"])
def test_every_codec_decompresses_and_truncation_is_corrupt(codec: int) -> None:
    payload = ENCODERS[codec](PLAIN)
    assert bytes(records.decompress(codec, payload)) == PLAIN
    for cut in (1, 7, len(payload) // 2):
        with pytest.raises(KafkaApiError) as caught:
            records.decompress(codec, payload[:-cut])
        assert caught.value.code == ErrorCode.CORRUPT_MESSAGE, (cut, caught.value)
    with pytest.raises(KafkaApiError) as caught:
        records.decompress(codec, b"\x00" * 20 + payload)
    assert caught.value.code == ErrorCode.CORRUPT_MESSAGE


def test_raw_snappy_and_concatenated_gzip_members() -> None:
    import snappy

    assert records.decompress(2, snappy.compress(PLAIN)) == PLAIN  # librdkafka may send raw snappy
    two_members = gzip.compress(PLAIN[:999]) + gzip.compress(PLAIN[999:])
    assert records.decompress(1, two_members) == PLAIN  # a stored batch (accepted before) is read whole
    # A produced one is refused: librdkafka reads only the first member, Java's client both.
    for payload in (two_members, gzip.compress(PLAIN) + b"\x00"):
        with pytest.raises(KafkaApiError) as caught:
            records.decompress(1, payload, one_frame=True)
        assert caught.value.code == ErrorCode.CORRUPT_MESSAGE
    assert records.decompress(1, gzip.compress(PLAIN), one_frame=True) == PLAIN


def test_zstd_without_content_size_in_the_frame() -> None:
    import zstandard

    payload = zstandard.ZstdCompressor(write_content_size=False).compress(PLAIN)
    assert records.decompress(4, payload) == PLAIN
    with pytest.raises(KafkaApiError) as caught:
        records.decompress(4, payload[:-3])
    assert caught.value.code == ErrorCode.CORRUPT_MESSAGE


def test_lz4_frames_without_content_size_and_concatenated() -> None:
    import lz4.frame

    unsized = lz4.frame.compress(PLAIN, store_size=False)
    assert records.decompress(3, unsized) == PLAIN
    assert records.decompress(3, unsized, one_frame=True) == PLAIN
    assert records.decompress(3, unsized + lz4.frame.compress(PLAIN)) == PLAIN * 2  # stored before: read whole
    # Produced: librdkafka stops after the first frame (_BAD_MSG), Kafka's lz4 reader refuses a skippable one.
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"skip"
    for payload in (unsized + lz4.frame.compress(PLAIN), skippable + unsized, unsized + skippable):
        with pytest.raises(KafkaApiError) as caught:
            records.decompress(3, payload, one_frame=True)
        assert caught.value.code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(KafkaApiError) as caught:
        records.decompress(3, unsized[:-5])
    assert caught.value.code == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["gzip", "snappy", "lz4", "zstd"])
def test_decompression_bomb_is_refused(codec: int) -> None:
    bomb = ENCODERS[codec](b"\x00" * (4 << 20))
    with pytest.raises(KafkaApiError) as caught:
        records.decompress(codec, bomb, limit=1 << 20)
    assert caught.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert len(records.decompress(codec, bomb, limit=4 << 20)) == 4 << 20, "exactly the limit is allowed"


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_records_over_what_librdkafka_reads_are_refused(codec: int) -> None:
    # librdkafka's decompression stops at receive.message.max.bytes (100000000): _BAD_COMPRESSION. (Snappy
    # cannot expand that far within max.message.bytes: at most ~21x.)
    bomb = ENCODERS[codec](b"\x00" * (records.MAX_UNCOMPRESSED_BYTES + 1))
    with pytest.raises(KafkaApiError) as caught:
        records.decompress(codec, bomb, one_frame=True)
    assert caught.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_unknown_codec_is_corrupt() -> None:
    for codec in (5, 6, 7):
        with pytest.raises(KafkaApiError) as caught:
            records.decompress(codec, b"abc")
        assert caught.value.code == ErrorCode.CORRUPT_MESSAGE


# -- the varint codec ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 300, -(2**31), 2**31 - 1, -(2**63), 2**63 - 1])
def test_varint_round_trip_matches_kafka_python(value: int) -> None:
    from kafka.record.util import decode_varint

    encoded = encode_varint(value)
    assert encoded == zz(value)
    assert read_varint(encoded, 0) == (value, len(encoded))
    assert decode_varint(bytearray(encoded), 0) == (value, len(encoded))


@pytest.mark.parametrize(
    ("data", "max_bytes", "why"),
    [
        (b"", 5, "truncated"),
        (b"\x80\x80", 5, "truncated"),
        (b"\x80\x80\x80\x80\x80\x00", 5, "longer than 5 bytes"),
        (b"\x80\x80\x80\x80\x10", 5, "overflows 32 bits"),
        (b"\x80" * 9 + b"\x02", 10, "overflows 64 bits"),
        (b"\x80" * 10 + b"\x00", 10, "longer than 10 bytes"),
    ],
)
def test_malformed_varints_are_refused(data: bytes, max_bytes: int, why: str) -> None:
    with pytest.raises(VarintError, match=why):
        read_uvarint(data, 0, max_bytes=max_bytes)


def test_varint_reads_stop_at_end() -> None:
    with pytest.raises(VarintError, match="truncated"):
        read_varint(b"\x80\x01", 0, end=1)


# -- Kafka error codes come from kafka-python ------------------------------------------------------
def test_error_codes_equal_kafka_python() -> None:
    for code, error in kafka.errors.kafka_errors.items():
        if code is None:
            continue
        assert ErrorCode(code) == code
        assert getattr(ErrorCode, error.message) == code, error  # kafka-python's name works too
        assert is_retriable(code) == error.retriable
        assert KafkaApiError(ErrorCode(code)).retriable == error.retriable
    # icelog answers with the names of Kafka's own Errors.java where kafka-python's are older
    assert ErrorCode(6).name == "NOT_LEADER_OR_FOLLOWER"
    assert ErrorCode(10).name == "MESSAGE_TOO_LARGE"
    assert ErrorCode(0).name == "NONE"
    assert ErrorCode.CORRUPT_MESSAGE == 2 and ErrorCode.INVALID_RECORD == 87 and ErrorCode.INVALID_TIMESTAMP == 32
    assert KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR).retriable
    assert not KafkaApiError(ErrorCode.CORRUPT_MESSAGE).retriable


def test_every_error_code_name_used_in_src_exists() -> None:
    used = set()
    for path in SRC.rglob("*.py"):
        used |= set(re.findall(r"ErrorCode\.([A-Z][A-Z0-9_]*)", path.read_text()))
    assert used, "no ErrorCode use found"
    assert sorted(name for name in used if not hasattr(ErrorCode, name)) == []


def test_compiled_walker_codes_are_kafka_codes() -> None:
    source = (SRC / "icelog/records/_records.c").read_text()
    for name in ("CORRUPT_MESSAGE", "INVALID_TIMESTAMP", "INVALID_RECORD"):
        (value,) = re.findall(rf"#define {name} (\d+)", source)
        assert int(value) == ErrorCode[name]


def test_header_struct_is_61_bytes() -> None:
    assert struct.calcsize(HEADER.format) == HEADER_SIZE == 61
