"""Where an archive task gets its planned record batches: the broker's intake storage, or Fetch requests.

Both sources hand the decoder the same thing, chunk by planned chunk: the stored batches as the broker
holds them. The intake's own reader (log/storage.py) is the fast path; Kafka lets executors run on any
machine that reaches the broker (`archive.read_via`). A source is pickled into each Spark task with the
task's closure, never put in the Spark conf, so a SASL password is not shown in Spark's UI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from icelog.archive.plan import ChunkRef, PlannedArchive
from icelog.client.cluster import SourceCluster
from icelog.client.fetch import FETCH_MAX_BYTES, CommittedFilter
from icelog.client.properties import ClientProperties, parse
from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.log.backends import open_reader
from icelog.log.intake import IntakeFiles
from icelog.log.storage import IntakeReader
from icelog.records.batch import iter_stored_batches
from icelog.records.record_format import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    ATTRIBUTES_LOW_BYTE,
    HEADER_SIZE,
    INT64,
    PRODUCER_ID,
)


class ChunkSource(Protocol):
    """The bytes of each planned chunk of an archive, in order."""

    def chunks(self, archive: PlannedArchive) -> Iterator[tuple[ChunkRef, memoryview]]: ...


class IncompleteReadError(IcelogError):
    """The broker served less of a planned range than the plan holds (trimmed meanwhile): the pass is retried."""

    retriable = True


@dataclass(frozen=True)
class StoredChunks:
    """Reads the planned chunks where the broker stored them, through the intake's own reader (log/storage.py),
    which a task unpickles with it and closes when the archive is read."""

    reader: IntakeReader

    def chunks(self, archive: PlannedArchive) -> Iterator[tuple[ChunkRef, memoryview]]:
        try:
            for ref in archive.chunks:
                yield ref, memoryview(self.reader.read(ref))
        finally:
            self.reader.close()


@dataclass(frozen=True)
class KafkaFetch:
    """Reads an archive's offsets [start, end) of `topic` with Fetch requests to the broker.

    Whole batches come back, the first possibly starting before `start` (the decoder drops its earlier
    records, as with files); fetching stops at `end`, and each batch goes with the planned chunk its base
    offset falls in, so the decoder sees each chunk's ingest time as with files. A chunk whose first batch
    starts before the planned chunk (a sink's runs are cut at any offset, not at batch boundaries) goes with
    its ref's base offset lowered to that batch's, since the decoder takes a batch below its chunk's base
    for broken framing. Fetches are read_committed
    and aborted transactions' batches are left out here (client/fetch.CommittedFilter), so the driver needs
    no transaction index of its own: it plans up to the last stable offset the broker names.
    """

    bootstrap: tuple[str, ...]
    properties: ClientProperties
    topic: str

    def check(self) -> None:
        """Connect and log in once, from the driver: an unreachable broker or a refused login is one line here
        (BrokerUnreachableError, BrokerLoginError) instead of failed tasks and Spark's stack traces."""
        with SourceCluster(self.bootstrap, self.properties) as cluster:
            cluster.connect()

    def chunks(self, archive: PlannedArchive) -> Iterator[tuple[ChunkRef, memoryview]]:
        with SourceCluster(self.bootstrap, self.properties) as cluster:
            yield from _split(cluster, self.topic, archive)


def _from_first(ref: ChunkRef, first_base: int) -> ChunkRef:
    """`ref`, starting at the first batch it got (base `first_base`, -1: none) if that starts before it."""
    return dataclasses.replace(ref, base_offset=first_base) if 0 <= first_base < ref.base_offset else ref


def _split(cluster: SourceCluster, topic: str, archive: PlannedArchive) -> Iterator[tuple[ChunkRef, memoryview]]:
    refs: Sequence[ChunkRef] = archive.chunks
    if not refs:
        return
    end = archive.end_offset
    remaining = [0] * (len(refs) + 1)  # planned bytes of refs[i:], to ask for no more than the plan holds
    for n in range(len(refs) - 1, -1, -1):
        remaining[n] = remaining[n + 1] + refs[n].length
    i = 0
    current = bytearray()
    first_base = -1  # base offset of the first batch in `current` (-1: none yet)

    offset = max(refs[0].base_offset, archive.start_offset)
    while offset < end:
        budget = min(FETCH_MAX_BYTES, max(remaining[i] - len(current), HEADER_SIZE))
        fetched = cluster.fetch(topic, archive.partition, offset, budget, committed=True)
        data = memoryview(fetched.records)
        committed = CommittedFilter(fetched.aborted)
        positions = iter_stored_batches(data)
        if not positions:
            raise IncompleteReadError(
                f"the broker served {topic}-{archive.partition} up to offset {offset}, the plan reaches {end}")
        for pos, size, base, last in positions:
            if size < HEADER_SIZE or pos + size > len(data) or last < base:
                # Broken framing: the rest goes with this chunk (the decoder makes it a dead letter); go on
                # with the next planned chunk.
                current += data[pos:]
                if i + 1 >= len(refs):
                    offset = end
                    break
                yield _from_first(refs[i], first_base), memoryview(bytes(current))
                i, current, first_base = i + 1, bytearray(), -1
                offset = refs[i].base_offset
                break
            while i + 1 < len(refs) and base >= refs[i + 1].base_offset:
                yield _from_first(refs[i], first_base), memoryview(bytes(current))
                i, current, first_base = i + 1, bytearray(), -1
            if base >= end:
                offset = end
                break
            attributes = data[pos + ATTRIBUTES_LOW_BYTE]
            if committed.keeps(INT64.unpack_from(data, pos + PRODUCER_ID)[0], last,
                               bool(attributes & ATTR_TRANSACTIONAL), bool(attributes & ATTR_CONTROL)):
                if not current:
                    first_base = base
                current += data[pos : pos + size]
            offset = last + 1
    yield _from_first(refs[i], first_base), memoryview(bytes(current))
    for ref in refs[i + 1 :]:  # chunks past the end of what was read (none when the plan is whole)
        yield ref, memoryview(b"")


def source_of(where: str | Path | ChunkSource) -> ChunkSource:
    """A source for a decoder's first argument: a local intake directory (tools and tests) or a ChunkSource."""
    return StoredChunks(IntakeFiles(Path(where))) if isinstance(where, str | Path) else where


def chunk_source(settings: Settings, topic: str) -> ChunkSource:
    """The source archive tasks of `topic` read from, as `archive.read_via` says."""
    if not settings.archive_reads_via_kafka:
        return StoredChunks(open_reader(settings))
    return KafkaFetch(tuple(settings.archive_bootstrap), parse(settings.archive.client_properties), topic)
