"""A live read as Arrow: the pinned snapshot's rows (pyiceberg, deletes applied), then the tail's rows.

The tail is decoded by the archiver's own decoders (archive/decode.py, decode_table.py) from the cut's ChunkSource
and cast to the snapshot's Arrow schema, so its rows carry the columns and values a pass would write. A
primary-key topic's tail is applied over the table as a pass would apply it (archive/upsert.py): the latest row of
each key in the tail (highest offset, then highest partition) replaces the table's row of that key, a tombstone
(null value) deletes it, and rows without a key are dropped; the tail is decoded first (its keys are needed before
the first table row goes out), the table's rows then stream.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from icelog.archive.pk_index import encode_keys
from icelog.config import Settings, load_settings
from icelog.live.cut import LiveCut, LiveReadError, iter_tail, load_table, plan_cut
from icelog.live.tail_rows import as_schema, tail_rows
from icelog.table.arrow import struct_array
from icelog.table.config import BUCKET, LAYOUT_TABLE, OFFSET, VALUE_BYTES, VALUE_ERR, VALUE_PREFIX

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

    from icelog.table.arrow import ArrowArray

DEFAULT_DATA_DIR = "./icelog-data"
TAIL_PREFETCH_BATCHES = 16  # tail batches (of up to 65,536 rows) decoded ahead while the table's rows are read


def scan(topic: str, *, data_dir: str = DEFAULT_DATA_DIR, config: str | None = None) -> pa.RecordBatchReader:
    """The topic's table at its current snapshot plus every committed record after it, as one Arrow reader.

    `config`: an icelog.yaml (the catalog, `archive.read_via: kafka` with the broker's address and client settings
    when the data dir is not at hand); else the data dir's embedded catalog and store."""
    settings = live_settings(data_dir, config)
    return read_cut(settings, plan_cut(settings, topic))


def live_settings(data_dir: str, config: str | None) -> Settings:
    """The settings of a live read: the config file's (its data_dir unless another is given), else the data dir's."""
    if config is not None and data_dir == DEFAULT_DATA_DIR:
        return load_settings(config)
    return load_settings(config, data_dir=data_dir)


def read_cut(settings: Settings, cut: LiveCut) -> pa.RecordBatchReader:
    """An Arrow reader of a planned cut."""
    import pyarrow as pa

    table = cut.table_handle if cut.table_handle is not None else load_table(settings, cut.namespace, cut.table)
    # The snapshot's files are planned now; its rows are read as the reader is read. Its schema (pyiceberg's, with
    # field ids) is the reader's: the tail's rows take it, so the table's rows go out as pyiceberg reads them.
    snapshot = None if table is None or cut.snapshot_id is None else \
        table.scan(snapshot_id=cut.snapshot_id).to_arrow_batch_reader()
    schema = snapshot.schema if snapshot is not None else table_schema(table, cut)
    if cut.spec.primary_key:
        tail = pa.Table.from_batches(list(tail_batches(cut, schema)), schema=schema)
        latest, replaced = latest_per_key(tail, cut)
        batches = _upserted(snapshot, cut, schema, latest, replaced)
    else:
        batches = _appended(snapshot, cut, schema)
    return pa.RecordBatchReader.from_batches(schema, batches)


def table_schema(table: Table | None, cut: LiveCut) -> pa.Schema:
    """The Arrow schema of the table's rows at the cut's snapshot (the layout's own when there is no table)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    if table is None:
        if cut.spec.layout == LAYOUT_TABLE:
            raise LiveReadError(f"topic {cut.topic!r}: its table does not exist yet (the archiver creates it)")
        from icelog.table.layout import arrow_schema

        return arrow_schema()
    snapshot = None if cut.snapshot_id is None else table.snapshot_by_id(cut.snapshot_id)
    schema = table.schemas().get(snapshot.schema_id) if snapshot is not None and snapshot.schema_id is not None \
        else None
    return schema_to_pyarrow(schema or table.schema(), include_field_ids=False)


def tail_batches(cut: LiveCut, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The tail's rows in partition and offset order, decoded as a pass would and cast to `schema`."""
    for archive in iter_tail(cut):
        yield from tail_rows(cut.chunks, archive, cut.spec.layout, schema, cut.sides)


def _appended(
    snapshot: pa.RecordBatchReader | None, cut: LiveCut, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    # The tail is decoded on a thread while the snapshot's Parquet is read (pyiceberg's reads leave the GIL free
    # most of the time): a tenth of the rows in the tail costs little more than reading them from the table.
    with Prefetched(tail_batches(cut, schema), TAIL_PREFETCH_BATCHES) as tail:
        if snapshot is not None:
            for batch in snapshot:
                yield as_schema(batch, schema)
        yield from tail


class Prefetched:
    """An iterator run on a thread of its own, up to `depth` items ahead of its reader; an error it raises is raised
    to the reader, and leaving the `with` block early stops it."""

    _END = object()

    def __init__(self, items: Iterator[pa.RecordBatch], depth: int) -> None:
        self._items = items
        self._queue: queue.Queue[object] = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-tail", daemon=True)

    def __enter__(self) -> Iterator[pa.RecordBatch]:
        self._thread.start()
        return self._read()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the reader
            self._put(_Failed(exc))
            return
        self._put(self._END)

    def _read(self) -> Iterator[pa.RecordBatch]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield cast("pa.RecordBatch", item)


@dataclass(frozen=True)
class _Failed:
    error: BaseException


# -- primary-key topics ---------------------------------------------------------------------------------------------


def _column(rows: pa.Table | pa.RecordBatch, path: str) -> ArrowArray:
    """A column by its path (`key.__raw__`, `__key`), one array."""
    import pyarrow as pa

    head, *rest = path.split(".")
    column = rows.column(head)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    for part in rest:
        array = struct_array(array).field(part)
    return array


def _key_mask_and_bytes(rows: pa.Table | pa.RecordBatch, cut: LiveCut) -> tuple[pa.BooleanArray, list[bytes]]:
    """Which rows have a whole primary key, and the encoded keys of those rows (pk_index.encode_keys)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = [_column(rows, path) for path in cut.spec.primary_key]
    has_key = pa.array([True] * rows.num_rows, pa.bool_())
    for key in keys:
        has_key = pc.and_(has_key, pc.is_valid(key))
    return has_key, encode_keys([pc.filter(key, has_key) for key in keys])


def _tombstones(rows: pa.Table, cut: LiveCut) -> ArrowArray:
    """Rows whose value is null (every value column the layout keeps it in)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = [VALUE_BYTES, VALUE_PREFIX, VALUE_ERR] if cut.spec.layout == LAYOUT_TABLE else ["value"]
    present = [v for v in values if v in rows.schema.names]
    out = pa.array([bool(present)] * rows.num_rows, pa.bool_())
    for value in present:
        out = pc.and_(out, pc.is_null(_column(rows, value)))
    return out


def latest_per_key(tail: pa.Table, cut: LiveCut) -> tuple[pa.Table, set[bytes]]:
    """The tail's rows that stay (each key's latest, unless a tombstone) and every key the tail writes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not tail.num_rows:
        return tail, set()
    has_key, keys = _key_mask_and_bytes(tail, cut)
    keyed = tail.filter(has_key)
    offsets = _column(keyed, OFFSET if cut.spec.layout == LAYOUT_TABLE else "kafka.offset")
    buckets = _column(keyed, BUCKET if cut.spec.layout == LAYOUT_TABLE else "kafka.partition")
    order = pa.table({"k": pa.array(keys, pa.binary()), "o": offsets, "b": buckets,
                      "i": pa.array(range(keyed.num_rows), pa.int64())})
    order = order.sort_by([("k", "ascending"), ("o", "descending"), ("b", "descending")])
    sorted_keys = order.column("k").combine_chunks()
    n = order.num_rows
    first = pa.array([True] * min(n, 1), pa.bool_())
    if n > 1:
        first = pa.concat_arrays([first, pc.not_equal(sorted_keys.slice(1), sorted_keys.slice(0, n - 1))])
    latest = order.filter(first).column("i").combine_chunks()
    rows = keyed.take(pc.take(latest, pc.sort_indices(latest)))  # back in partition and offset order
    rows = rows.filter(pc.invert(_tombstones(rows, cut)))
    return rows, set(keys)


def _upserted(
    snapshot: pa.RecordBatchReader | None, cut: LiveCut, schema: pa.Schema, latest: pa.Table, replaced: set[bytes]
) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.compute as pc

    written = pa.array(sorted(replaced), pa.binary())
    for batch in () if snapshot is None else snapshot:
        batch = as_schema(batch, schema)
        if len(written) and batch.num_rows:
            has_key, keys = _key_mask_and_bytes(batch, cut)
            if not pc.all(has_key).as_py():  # (the archiver never leaves a row without a key in the table)
                batch = batch.filter(has_key)
            batch = batch.filter(pc.invert(pc.is_in(pa.array(keys, pa.binary()), value_set=written)))
        yield batch
    yield from latest.to_batches()
