"""What a replay reads: an archive table of the record layout at one snapshot, one Kafka partition at a time.

The record layout keeps every record as produced (`key.__raw__`, `value.__raw__`, `headers`, `kafka.partition`,
`kafka.offset`, `kafka.event_timestamp`: table/layout.py), so the records come back byte for byte. pyiceberg scans
the snapshot (deletes and deletion vectors applied: a primary-key table replays its live rows, a DELETE's rows are
gone from snapshots after it), pruned to one source partition by the identity partition on `kafka.partition`, and
the rows are sorted by offset: each key's records in the order they were produced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icelog.errors import IcelogError
from icelog.table.config import LAYOUT_RECORD
from icelog.table.layout import OFFSETS_PROPERTY, layout_of_properties

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Record:
    """One archived record: its source partition and offset, and what a producer sends again."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]


class UnknownTableError(IcelogError):
    """The table (or the snapshot asked for) does not exist."""


@dataclass(frozen=True)
class TableAt:
    """A table pinned to one snapshot, with the Kafka partitions its archive came from."""

    name: str
    table: Table
    snapshot: Snapshot
    partitions: int  # the source topic's partition count (as its archive commits recorded it)

    @property
    def snapshot_id(self) -> int:
        return int(self.snapshot.snapshot_id)

    def rows(self, partition: int) -> PartitionRows:
        """The partition's records at the snapshot, in offset order, as columns."""
        import pyarrow.compute as pc

        scan = self.table.scan(row_filter=f"kafka.partition == {int(partition)}", snapshot_id=self.snapshot_id,
                               selected_fields=("key", "value", "headers", "kafka"))
        rows = scan.to_arrow().combine_chunks()
        rows = rows.take(pc.sort_indices(pc.struct_field(rows.column("kafka"), "offset")))
        kafka = rows.column("kafka")
        key = rows.column("key")
        value = rows.column("value")
        return PartitionRows(
            offsets=pc.struct_field(kafka, "offset").to_pylist(),
            # Microseconds in the table (Kafka's milliseconds times 1000): back to milliseconds exactly.
            timestamps_ms=pc.divide(pc.struct_field(kafka, "event_timestamp").cast("int64"), 1000).to_pylist(),
            keys=pc.if_else(pc.is_null(key), None, pc.struct_field(key, "__raw__")).combine_chunks(),
            values=pc.if_else(pc.is_null(value), None, pc.struct_field(value, "__raw__")).to_pylist(),
            headers=_headers(rows.column("headers").combine_chunks()),
        )

    def records(self, partition: int) -> Iterator[Record]:
        """The partition's records at the snapshot, in offset order, one by one."""
        rows = self.rows(partition)
        for offset, timestamp, key, value, headers in zip(rows.offsets, rows.timestamps_ms, rows.keys.to_pylist(),
                                                           rows.values, rows.headers, strict=True):
            yield Record(partition, offset, timestamp, key, value, headers or [])


@dataclass(frozen=True)
class PartitionRows:
    """One source partition's records in offset order, column by column (what producing them needs)."""

    offsets: list[int]
    timestamps_ms: list[int]
    keys: pa.Array[Any]  # binary; null: no key (Arrow: the producer's placement reads it as a whole)
    values: list[bytes | None]
    headers: list[list[Header] | None]  # None: no headers


def _headers(column: pa.Array[Any]) -> list[list[Header] | None]:
    """Each row's headers as (name, value) pairs (None for a row without): one conversion of all the names and values,
    then a slice per row that has headers (most rows have none)."""
    import pyarrow.compute as pc

    counts = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    if not counts.any():
        return [None] * len(column)
    flat = pc.list_flatten(column)
    names = pc.struct_field(flat, "key").to_pylist()
    values = pc.struct_field(flat, "value").to_pylist()
    out: list[list[Header] | None] = []
    start = 0
    for count in counts.tolist():
        if count:
            out.append(list(zip(names[start:start + count], values[start:start + count], strict=True)))
            start += count
        else:
            out.append(None)
    return out


def open_table(catalog: Catalog, name: str) -> Table:
    """The table `NAMESPACE.TABLE`, or an error saying how to list the tables."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    namespace, dot, table = name.rpartition(".")
    if not dot or not namespace or not table:
        raise UnknownTableError(f"--table {name!r}: expected NAMESPACE.TABLE, e.g. icelog.orders")
    try:
        loaded = catalog.load_table((namespace, table))
    except (NoSuchTableError, NoSuchNamespaceError):
        known = sorted(".".join(i) for ns in catalog.list_namespaces() for i in catalog.list_tables(ns))
        listed = ", ".join(known[:20]) + (" …" if len(known) > 20 else "") if known else "none"
        raise UnknownTableError(f"no table {name} in the catalog (tables: {listed}); "
                                "pass --data-dir or --config of the broker whose archive it is") from None
    if layout_of_properties(loaded.properties) != LAYOUT_RECORD:
        raise IcelogError(f"table {name} is not an archive table of the record layout (icelog.archive.layout="
                          "record): only that layout keeps every record's key and value bytes as produced")
    return loaded


def pin(name: str, table: Table, snapshot_id: int | None, as_of_ms: int | None) -> TableAt:
    """The table at the snapshot asked for (`snapshot_id`, the one current at `as_of_ms`, else the current one)."""
    if snapshot_id is not None:
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise UnknownTableError(f"table {name} has no snapshot {snapshot_id}; list them with "
                                    f"`icelog sql \"SELECT snapshot_id, committed_at FROM {name}.snapshots\"`")
    elif as_of_ms is not None:
        snapshot = table.snapshot_as_of_timestamp(as_of_ms)
        if snapshot is None:
            raise UnknownTableError(f"table {name} has no snapshot at or before {as_of_ms} ms; list them with "
                                    f"`icelog sql \"SELECT snapshot_id, committed_at FROM {name}.snapshots\"`")
    else:
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise UnknownTableError(f"table {name} has no snapshot yet (nothing archived): nothing to replay")
    return TableAt(name, table, snapshot, _source_partitions(table, snapshot))


def _source_partitions(table: Table, snapshot: Snapshot) -> int:
    """The source topic's partition count: the partitions of the newest archive commit's offsets map at or before
    the snapshot (every commit carries all partitions), else one past the highest partition with a data file."""
    current: Snapshot | None = snapshot
    for _ in range(1000):
        if current is None:
            break
        text = (current.summary.additional_properties if current.summary else {}).get(OFFSETS_PROPERTY)
        if text:
            offsets = json.loads(text)
            if offsets:
                return max(int(p) for p in offsets) + 1
        current = None if current.parent_snapshot_id is None else table.snapshot_by_id(current.parent_snapshot_id)
    highest = -1
    for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
        highest = max(highest, int(task.file.partition[0]))
    return highest + 1
