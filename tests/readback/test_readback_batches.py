"""The read-back batch builder against kafka-python's own v2 parser (a unit test beside the client tests)."""

from __future__ import annotations

import itertools
import random

import numpy as np
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from icelog.readback.batches import encode_batch, header_section
from icelog.readback.columnar import as_binary, encode_batches
from icelog.records.batch import empty_batch


def test_a_built_batch_parses_with_kafka_python_with_gaps_nulls_and_headers() -> None:
    rows = [
        (100, 1_700_000_000_123, b"k", b"v" * 300, [("h", b"1"), ("dup", None), ("dup", b"")]),
        (102, 1_700_000_000_100, None, b"", []),  # 101 was deleted; an earlier timestamp than the first
        (105, 1_700_000_000_200, b"", None, [("ключ", "значение".encode())]),
    ]
    data = encode_batch(99, rows)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert (batch.base_offset, batch.next_offset, batch.timestamp_type, batch.producer_id) == (99, 106, 0, -1)
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [tuple(r) for r in rows]


def test_log_append_time_batches_give_every_record_the_batch_time() -> None:
    batch = DefaultRecordBatch(encode_batch(0, [(0, 5, None, b"a", []), (1, 9, None, b"b", [])], True))
    assert batch.validate_crc() and batch.timestamp_type == 1
    assert [(r.timestamp, r.timestamp_type) for r in batch] == [(9, 1), (9, 1)]


def test_an_empty_batch_moves_a_reader_past_a_gap() -> None:
    records = MemoryRecords(empty_batch(10, 19) + encode_batch(20, [(20, 1, None, b"x", [])]))
    first = records.next_batch()
    assert first.validate_crc() and first.next_offset == 20 and list(first) == []
    second = records.next_batch()
    assert [r.offset for r in second] == [20]


def test_columnar_framing_gives_the_same_bytes_as_the_record_loop() -> None:
    """readback/columnar.py against batches.encode_batch: nulls, headers, gaps, negative and large deltas."""
    rnd = random.Random(5)
    rows = []
    offset, start = 10, 10
    for i in range(400):
        if i % 37 == 0:
            start = offset  # a new producer batch
        offset += 1 + (i % 9 == 0)  # some offsets deleted
        key = None if i % 5 == 0 else rnd.randbytes(rnd.randint(0, 20))
        value = None if i % 7 == 0 else rnd.randbytes(rnd.choice((0, 5, 300, 20000)))
        headers = [("h", b"x"), ("n", None)] if i % 11 == 0 else []
        timestamp = 1_700_000_000_000 + rnd.randint(-5000, 5000) + (200_000 if i == 100 else 0)  # a big jump
        rows.append((offset, timestamp, key, value, headers, start))
    for append_time in (False, True):
        built = encode_batches(
            np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[5] for r in rows]),
            as_binary([r[2] for r in rows]), as_binary([r[3] for r in rows]),
            [header_section(r[4]) for r in rows], append_time,
        )
        looped = []
        for _, group in itertools.groupby(rows, key=lambda r: r[5]):
            members = list(group)
            looped.append(encode_batch(members[0][5], [r[:5] for r in members], append_time))
        assert [b for _, _, b in built] == looped
        assert sum(len(list(DefaultRecordBatch(b))) for _, _, b in built) == len(rows)


def test_lazy_chunks_give_the_batches_of_framing_all_rows_at_once() -> None:
    """readback/source.py frames a segment a chunk at a time; a read from any offset gets the same batches."""
    from icelog.readback import source

    n = 5000
    offsets = np.arange(0, 2 * n, 2, dtype=np.int64)  # every other offset deleted
    starts = offsets - offsets % 64  # producer batches of 32 rows
    timestamps = 1_700_000_000_000 + offsets
    keys = as_binary([None if i % 3 == 0 else b"k%d" % i for i in range(n)])
    values = as_binary([b"v" * (i % 50) for i in range(n)])
    whole = encode_batches(offsets, timestamps, starts, keys, values, None)
    built = source.BuiltFile(source.Columns(offsets, timestamps, starts, keys, values, None), False)
    assert len(built.chunk_lasts) > 3  # several chunks
    for offset in (0, 1, 3001, 6400, 2 * n - 2):
        expected = [(last, batch) for _base, last, batch in whole if last >= offset]
        assert list(built.batches_from(offset)) == expected
    assert list(built.batches_from(2 * n)) == []
