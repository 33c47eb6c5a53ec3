"""Planning a live read: the table's snapshot pinned first, then the committed records after its offsets.

A topic is two things that meet at an offset: its Iceberg table (what is archived) and its tail (what is not yet).
A cut is both, fixed when the read is planned:
  1. the table's current snapshot is taken and its id kept: the read never sees a later commit;
  2. the offsets that snapshot holds are read from its summary (or the newest ancestor's that records them:
     `icelog.archive.offsets`, written by every archive commit; from the data when none is left), as the archiver
     reconciles them (archive/reconcile.py);
  3. only then each partition's last stable offset is asked for (read_committed: nothing past an open
     transaction), and the tail is planned from the snapshot's offsets up to it, as the archiver plans a pass
     (archive/plan.py, with its aborted transactions), or as offset ranges fetched over the Kafka protocol.
A pass that commits after 1 moves neither side of the cut: its records are read from the tail, once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icelog.archive.reconcile import OFFSETS_PROPERTY, TOPIC_ID_PROPERTY, decode_offsets
from icelog.config import Settings
from icelog.errors import ConfigError, IcelogError
from icelog.lake.catalog import pyiceberg_catalog_opener
from icelog.live.sides import NO_DECODING, Decodings, decodings
from icelog.live.tail import TailSource, open_tail
from icelog.table.config import LAYOUT_TABLE, archive_config, table_config
from icelog.table.layout import TableSpec, table_spec

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icelog.archive.intake_source import ChunkSource
    from icelog.archive.plan import PlannedArchive

log = logging.getLogger(__name__)

MAX_ANCESTORS = 1000  # snapshots walked back at most for the newest one recording the offsets (as reconcile.py)


class LiveReadError(IcelogError):
    """A live read cannot be planned: the topic is unknown, not archived, or its table is another topic's."""


@dataclass(frozen=True)
class LiveCut:
    """What one live read returns: the table at `snapshot_id` and the tail's archives after its offsets."""

    topic: str
    topic_id: uuid.UUID | None
    namespace: str
    table: str
    spec: TableSpec
    snapshot_id: int | None  # None: the table has no snapshot yet (every record is in the tail)
    table_offsets: Mapping[int, int]  # the next offset per partition the snapshot holds
    stable_offsets: Mapping[int, int]  # each partition's last stable offset when the read was planned
    tail: tuple[PlannedArchive, ...]  # the committed records in between, as the archiver would plan them
    chunks: ChunkSource  # where the tail's batches are read from (the intake, or Fetch requests); picklable
    planned_ms: int
    sides: Decodings = NO_DECODING  # the sides the table holds as columns, decoded with the registry's schemas
    table_handle: Table | None = field(default=None, compare=False, repr=False)  # pyiceberg's, as loaded to plan

    @property
    def tail_records(self) -> int:
        """Offsets the tail spans (aborted transactions' records and markers included)."""
        return sum(archive.record_count for archive in self.tail)

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)


def snapshot_offsets(table: Table, snapshot_id: int | None) -> tuple[dict[int, int], str | None] | None:
    """The offsets recorded by the newest snapshot at or before `snapshot_id` on its lineage, with the topic id it
    names; None when no snapshot there records them (expired, or only foreign commits)."""
    current = None if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    for _ in range(MAX_ANCESTORS):
        if current is None:
            return None
        summary = current.summary
        text = None if summary is None else summary.get(OFFSETS_PROPERTY)
        if text is not None:
            topic_id = summary.get(TOPIC_ID_PROPERTY) if summary is not None else None
            return decode_offsets(str(text)), topic_id
        parent = current.parent_snapshot_id
        current = None if parent is None else table.snapshot_by_id(parent)
    return None


def _offsets_from_data(table: Table, snapshot_id: int, spec: TableSpec) -> dict[int, int]:
    """max(offset) + 1 per partition of the snapshot's rows (what reconcile.py derives when no summary is left)."""
    import pyarrow as pa

    from icelog.table.arrow import struct_array

    if spec.layout == LAYOUT_TABLE:
        rows = table.scan(snapshot_id=snapshot_id, selected_fields=("__bucket", "__offset")).to_arrow()
        parts, offsets = rows.column("__bucket").combine_chunks(), rows.column("__offset").combine_chunks()
    else:
        kafka = struct_array(table.scan(snapshot_id=snapshot_id, selected_fields=("kafka",)).to_arrow()
                             .column("kafka").combine_chunks())
        parts, offsets = kafka.field("partition"), kafka.field("offset")
    grouped = pa.table({"p": parts, "o": offsets}).group_by("p").aggregate([("o", "max")]).to_pylist()
    return {int(row["p"]): int(row["o_max"]) + 1 for row in grouped}


def load_table(settings: Settings, namespace: str, name: str) -> Table | None:
    """The archive table as pyiceberg sees it through the archiver's catalog, or None if it does not exist."""
    from pyiceberg.exceptions import NoSuchTableError

    opener = pyiceberg_catalog_opener(settings)
    if opener is None:
        raise ConfigError(
            f"a live read opens the catalog with pyiceberg, which cannot open the {settings.archive.catalog_type} "
            "catalog as Spark does (JDBC on SQLite or PostgreSQL, and REST, can)")
    catalog = opener()
    if catalog is None:  # the embedded catalog does not exist yet: nothing archived
        return None
    try:
        return catalog.load_table((namespace, name))
    except NoSuchTableError:
        return None


def plan_cut(settings: Settings, topic: str, *, now_ms: int | None = None) -> LiveCut:
    """Pin the topic's table snapshot, then plan its tail up to each partition's last stable offset now."""
    source = open_tail(settings)
    try:
        return _plan(settings, source, topic, now_ms)
    finally:  # (the tail is read from the cut's `chunks`, which need nothing of the planner)
        source.close()


def _plan(settings: Settings, source: TailSource, topic: str, now_ms: int | None) -> LiveCut:
    view = source.topic(topic)
    config = archive_config(view.name, view.configs, settings.topic_defaults, settings.archive)
    if not config.enabled:
        raise LiveReadError(f"topic {topic!r} is not archived (icelog.archive.kind is none): it has no table to read")
    try:
        spec = table_spec(table_config(view.configs, settings.topic_defaults), view.partitions)
    except ValueError as exc:
        raise LiveReadError(f"topic {topic!r}: {exc}") from None
    table = load_table(settings, config.namespace, config.table)
    snapshot = None if table is None else table.current_snapshot()
    snapshot_id = None if snapshot is None else snapshot.snapshot_id
    offsets: dict[int, int] = {}
    if table is not None and snapshot_id is not None:
        found = snapshot_offsets(table, snapshot_id)
        if found is None:
            log.warning("%s.%s: no snapshot on the current lineage records %s; deriving offsets from the data",
                        config.namespace, config.table, OFFSETS_PROPERTY)
            offsets = _offsets_from_data(table, snapshot_id, spec)
        else:
            offsets, owner = found
            if owner is not None and view.topic_id is not None and owner != str(view.topic_id):
                raise LiveReadError(
                    f"table {config.namespace}.{config.table} holds the archive of another topic (id {owner}), not of "
                    f"{topic!r} (id {view.topic_id})")
    sides = NO_DECODING if table is None else decodings(settings, table, view.name, view.configs, spec.layout,
                                                        snapshot_id)
    planned_ms = int(time.time() * 1000) if now_ms is None else now_ms
    # Only now, after the snapshot is pinned: a pass committing from here on moves neither side of the cut.
    stable, tail = source.plan_tail(view, offsets, config, planned_ms)
    return LiveCut(view.name, view.topic_id, config.namespace, config.table, spec, snapshot_id, offsets, stable,
                   tuple(tail), source.chunk_source(view), planned_ms, sides, table)


def iter_tail(cut: LiveCut) -> Iterator[PlannedArchive]:
    """The cut's tail archives in partition and offset order."""
    yield from sorted(cut.tail, key=lambda a: (a.partition, a.start_offset))
