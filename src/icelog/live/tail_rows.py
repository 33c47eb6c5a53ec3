"""One tail archive's rows as a pass writes them, in the live read's Arrow schema (the Arrow reader and the Spark
tasks both call this).

The archiver's decoders turn the stored batches into rows (archive/decode.py, decode_table.py). A batch they cannot
decode (broken framing, a CRC that no longer matches, a record that does not parse, a timestamp no table holds)
goes to the dead-letter table in a pass, not to the table: here it is skipped the same way, found by the
archiver's own checks (`find_dead_letters`, then `find_failing_batch`), and the archive is decoded on from the
first offset not yet returned, so no row is returned twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from icelog.archive.archiver import DEAD_LETTER_ROUNDS
from icelog.archive.decode import decode_archive, find_dead_letters, find_failing_batch
from icelog.archive.decode_schema import decode_archive_schema
from icelog.archive.decode_table import decode_archive_table
from icelog.archive.intake_source import ChunkSource
from icelog.archive.plan import PlannedArchive
from icelog.errors import IcelogError
from icelog.live.sides import NO_DECODING, Decodings
from icelog.table.arrow import struct_array
from icelog.table.config import LAYOUT_TABLE, OFFSET

if TYPE_CHECKING:
    import pyarrow as pa

    from icelog.schema.codec.sides import SideDecoder


class UndecodableTailError(IcelogError):
    """A tail archive keeps failing to decode after its undecodable batches were set aside."""


class TailTrimmedError(IcelogError):
    """Intake files the tail was planned on were deleted before they were read (a pass archived them and the intake's
    retention, `icelog.intake.retention.ms`, released them meanwhile): reading again plans a newer cut."""

    retriable = True


def as_schema(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` in `schema`: its arrays as they are when only field metadata differs (field ids), else cast."""
    import pyarrow as pa

    if batch.schema.equals(schema, check_metadata=False):
        return batch if batch.schema.equals(schema, check_metadata=True) else \
            pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    return pa.Table.from_batches([batch]).cast(schema).combine_chunks().to_batches()[0]


def _next_offset(batch: pa.RecordBatch, layout: str) -> int:
    """The offset after the batch's last row (rows are in offset order)."""
    if layout == LAYOUT_TABLE:
        offsets = batch.column(batch.schema.get_field_index(OFFSET))
    else:
        offsets = struct_array(batch.column(batch.schema.get_field_index("kafka"))).field("offset")
    return int(offsets[len(offsets) - 1].as_py()) + 1


def tail_rows(
    source: ChunkSource, archive: PlannedArchive, layout: str, schema: pa.Schema, sides: Decodings = NO_DECODING
) -> Iterator[pa.RecordBatch]:
    """The rows of one tail archive in offset order, in `schema`; batches a pass dead-letters are left out."""
    cache: dict[str, SideDecoder] = {}  # a side's decoder, built once for the archive's rounds

    def decode(planned: PlannedArchive) -> Iterator[pa.RecordBatch]:
        if sides.arrow is not None:  # as the archiver's decoder of a topic with a schema (archiver._decoder)
            if layout == LAYOUT_TABLE:
                return decode_archive_table(source, planned, sides.key, sides.value, sides.arrow, cache)
            return decode_archive_schema(source, planned, sides.key, sides.value, sides.arrow, cache)
        if layout == LAYOUT_TABLE:
            return decode_archive_table(source, planned, None, None, schema)
        return decode_archive(source, planned)

    done = archive.start_offset  # rows below it are returned
    for _ in range(DEAD_LETTER_ROUNDS):
        rest = dataclasses.replace(archive, start_offset=max(done, archive.start_offset))
        try:
            for batch in decode(rest):
                if batch.num_rows:
                    yield as_schema(batch, schema)
                    done = _next_offset(batch, layout)
            return
        except FileNotFoundError as exc:
            raise TailTrimmedError(
                f"partition {archive.partition}: the intake released the tail from offset {done} after the read was "
                f"planned ({exc.filename}); read again") from None
        except Exception as exc:
            if isinstance(exc, IcelogError) and exc.retriable:
                raise
            letters = find_dead_letters(source, rest)
            if not letters:
                failing = find_failing_batch(source, rest, decode)
                if failing is None:
                    raise
                letters = [failing]
            archive = dataclasses.replace(
                archive, dead_letters=archive.dead_letters + tuple(letter.base_offset for letter in letters))
    raise UndecodableTailError(
        f"partition {archive.partition}: the tail from offset {done} still fails to decode after "
        f"{DEAD_LETTER_ROUNDS} rounds of setting undecodable batches aside")
