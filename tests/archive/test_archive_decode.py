"""The archiver's decode (archive/decode.py) without Spark: stored batches to Arrow rows, read by icelog's one
record-batch reader, compiled and pure alike, against what kafka-python's reader reads from the same bytes."""

from __future__ import annotations

import dataclasses
import random
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from icelog.archive import decode
from icelog.archive.plan import ChunkRef, PlannedArchive
from icelog.log import intake_file
from icelog.log.transactions import encode_marker_batch
from icelog.records.batch import empty_batch
from icelog.records.record_format import CRC, UINT32, batch_crc
from icelog.records.walk import CorruptRecordsError

INGEST_MS = 1_700_000_123_000


def stored_batches(rng: random.Random) -> list[bytes]:
    """Batches of every codec with offsets assigned from 0, an empty (compacted) batch and a commit marker."""
    out: list[bytes] = []
    offset = 0
    for i in range(12):
        if i == 5:
            out.append(empty_batch(offset, offset + 2))
            offset += 3
            continue
        if i == 8:
            marker = bytearray(encode_marker_batch(7, 0, True, 0, INGEST_MS))
            struct.pack_into(">q", marker, 0, offset)
            out.append(bytes(marker))
            offset += 1
            continue
        builder = DefaultRecordBatchBuilder(2, i % 5, 0, -1, -1, -1, 1 << 22)
        for j in range(rng.randrange(1, 12)):
            headers = [("h", None if rng.random() < 0.3 else rng.randbytes(3))] * rng.randrange(3) if i % 3 else []
            value = None if rng.random() < 0.1 else rng.randbytes(20) + bytes(rng.randrange(80))
            key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(9))
            builder.append(j, timestamp=1_700_000_000_000 + rng.randrange(9999), key=key, value=value, headers=headers)
        data = bytearray(builder.build())
        struct.pack_into(">q", data, 0, offset)  # the base offset is outside the CRC
        offset += len(list(DefaultRecordBatch(bytes(data))))
        out.append(bytes(data))
    return out


def write_archive(tmp_path: Path, batches: list[bytes], start: int, end: int) -> PlannedArchive:
    data = b"".join(batches)
    intake_file.file_path(tmp_path, 1).write_bytes(data)
    last = DefaultRecordBatch(batches[-1])
    chunk = ChunkRef(1, 0, len(data), 0, last.base_offset + last.last_offset_delta + 1, INGEST_MS)
    return PlannedArchive(uuid.uuid4(), 3, start, end, (chunk,), "forced")


def expected_rows(batches: list[bytes], start: int, end: int) -> list[tuple[object, ...]]:
    rows = []
    for data in batches:
        parsed = DefaultRecordBatch(data)
        if parsed.is_control_batch:
            continue
        for r in parsed:
            if start <= r.offset < end:
                headers = [{"key": k, "value": v} for k, v in r.headers]
                key = None if r.key is None else {"__raw__": r.key}  # a null key is a null struct
                value = None if r.value is None else {"__raw__": r.value}
                rows.append((key, value, headers, r.offset, r.timestamp * 1000, parsed.base_offset))
    return rows


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
def test_decode_gives_the_records_kafka_python_reads_in_batches_of_the_row_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    monkeypatch.setattr(decode, "ROWS_PER_ARROW_BATCH", 7)
    rng = random.Random(42)
    batches = stored_batches(rng)
    total = sum(len(list(DefaultRecordBatch(b))) for b in batches if not DefaultRecordBatch(b).is_control_batch)
    for start, end in [(0, 10**6), (3, 40), (rng.randrange(5), rng.randrange(20, 60))]:
        archive = write_archive(tmp_path, batches, start, end)
        arrow = list(decode.decode_archive(tmp_path, archive, compiled=compiled))
        assert [b.num_rows for b in arrow[:-1]] == [7] * (len(arrow) - 1) and 0 < arrow[-1].num_rows <= 7
        rows = []
        for b in arrow:
            for row in b.to_pylist():
                kafka = row["kafka"]
                assert kafka["partition"] == 3
                assert kafka["ingest_timestamp"].timestamp() == INGEST_MS / 1000
                event_us = round(kafka["event_timestamp"].timestamp() * 1_000_000)
                rows.append((row["key"], row["value"], row["headers"], kafka["offset"], event_us, kafka["batch_start"]))
        assert rows == expected_rows(batches, start, end)
        assert start > 0 or end < 10**6 or len(rows) == total
        assert decode.find_dead_letters(tmp_path, archive, compiled=compiled) == []


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
@pytest.mark.parametrize(("which", "why"), [(0, "record "), (2, "snappy records do not decompress")],
                         ids=["plain", "snappy"])
def test_a_batch_that_does_not_read_is_a_dead_letter_and_stops_decode(
    tmp_path: Path, compiled: bool, which: int, why: str
) -> None:
    batches = stored_batches(random.Random(7))
    broken = bytearray(batches[which])
    broken[-2:] = b"\x7f\x7f"  # the last two bytes: a plain record's fields run past it, snappy's block breaks
    UINT32.pack_into(broken, CRC, batch_crc(broken))  # a well-formed CRC: only the reader can tell
    batches[which] = bytes(broken)
    archive = write_archive(tmp_path, batches, 0, 10**6)
    [dead] = decode.find_dead_letters(tmp_path, archive, compiled=compiled)
    assert dead.base_offset == DefaultRecordBatch(batches[which]).base_offset and dead.batch == batches[which]
    assert dead.error.startswith(f"CorruptRecordsError: CORRUPT_MESSAGE: {why}"), dead.error
    with pytest.raises(CorruptRecordsError, match=why):
        list(decode.decode_archive(tmp_path, archive, compiled=compiled))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
@pytest.mark.parametrize("timestamp", [decode.TABLE_MAX_TIMESTAMP_MS + 1, (1 << 63) - 1], ids=["year-10000", "max"])
def test_a_timestamp_no_table_row_holds_is_a_dead_letter_found_as_decode_fails(
    tmp_path: Path, compiled: bool, timestamp: int
) -> None:
    """decode_archive refuses the batch (the worker fails) and find_dead_letters names the same batch, with why."""
    batches = stored_batches(random.Random(11))
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"fine", headers=[])
    builder.append(1, timestamp=timestamp, key=b"k", value=b"far", headers=[])
    far = bytearray(builder.build())
    base = DefaultRecordBatch(batches[3]).base_offset
    struct.pack_into(">q", far, 0, base)
    batches[3] = bytes(far)
    batches = batches[:4]  # (the batches after it would overlap its offsets)
    archive = write_archive(tmp_path, batches, 0, 10**6)
    with pytest.raises(decode.UndecodableBatchError, match="outside the years 1 to 9999"):
        list(decode.decode_archive(tmp_path, archive, compiled=compiled))
    [dead] = decode.find_dead_letters(tmp_path, archive, compiled=compiled)
    assert (dead.base_offset, dead.last_offset, dead.batch) == (base, base + 1, batches[3])
    assert f"record timestamp {timestamp} ms is outside the years 1 to 9999" in dead.error
    # The boundary itself is a row.
    assert decode.timestamp_problem([decode.TABLE_MAX_TIMESTAMP_MS, decode.TABLE_MIN_TIMESTAMP_MS, -1, 0]) is None


@pytest.mark.parametrize("bad", [0, 4, 11], ids=["first", "middle", "last"])
def test_the_pass_decoder_failing_on_a_batch_the_checks_pass_is_isolated_to_that_batch(
    tmp_path: Path, bad: int
) -> None:
    """find_failing_batch: the driver's fallback when a worker failed for good and no batch check explains it. A
    decoder that fails on one batch's records (a stand-in for a bug in a decoder: every known one is fixed) is
    bisected to that batch, with the decoder's error; an archive the decoder takes gives None."""
    batches = stored_batches(random.Random(5))
    archive = write_archive(tmp_path, batches, 0, 10**6)
    poisoned = DefaultRecordBatch(batches[bad])
    records = list(DefaultRecordBatch(batches[bad]))
    assert not poisoned.is_control_batch and records
    poison_offset = records[-1].offset
    decoded: list[int] = []

    def decoder(planned: PlannedArchive) -> Iterator[Any]:
        for batch in decode.decode_archive(tmp_path, planned):
            offsets = batch.column(3).field("offset").to_pylist()
            decoded.append(len(offsets))
            if poison_offset in offsets:
                raise OverflowError("a value the writer cannot take")
            yield batch

    assert decode.find_failing_batch(tmp_path, write_archive(tmp_path, batches, 0, poison_offset), decoder) is None
    found = decode.find_failing_batch(tmp_path, archive, decoder)
    assert found is not None
    assert (found.base_offset, found.batch) == (poisoned.base_offset, batches[bad])
    assert found.error == "the archive's decoder failed on it: OverflowError: a value the writer cannot take"
    # The plan without it decodes.
    assert decode.find_failing_batch(
        tmp_path, dataclasses.replace(archive, dead_letters=(found.base_offset,)), decoder) is None
