"""The primary-key index of an upsert table: key → (data file, position, offset), in an embedded LMDB.

Nobu's design: an upsert batch finds the rows it replaces by a local lookup instead of scanning the table.
The index is a cache of the table, never the truth: it records the snapshot it reflects, and the upsert
writer (pipeline/upsert.py) rebuilds it from the table whenever that is not the table's current snapshot
(a crash between a commit and the index update, the directory deleted by hand, a commit by someone else
such as `rewrite_data_files`). Updates after a commit go in one LMDB transaction with the new snapshot id,
so the index is either wholly before or wholly after a commit.

One LMDB environment per table, under `<data_dir>/pk-index/<table uuid>` (a table dropped and made again
has another uuid, so another index). Keys are the encoded primary key (encode_key); values pack the row's
offset and position and the data file's location.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ROW = struct.Struct(">qq")  # offset, position; then the data file location (UTF-8)
_SNAPSHOT_KEY = b"snapshot"
MAP_SIZE = 1 << 36  # LMDB's address-space reservation (sparse): 64 GiB of index at most


@dataclass(frozen=True)
class IndexEntry:
    """Where a key's live row is: its data file, its position in that file, and its Kafka offset."""

    file: str
    pos: int
    offset: int


def encode_key(values: Sequence[object]) -> bytes:
    """A primary key's values as index key bytes: the same for a value read by pyarrow and by Spark."""
    if len(values) == 1 and isinstance(values[0], bytes | bytearray | memoryview):
        return b"b" + bytes(values[0])
    return b"t" + repr(tuple(_normal(v) for v in values)).encode()


def _normal(value: object) -> object:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return stamp.astimezone(datetime.UTC).isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


class PrimaryKeyIndex:
    """One table's index (an LMDB environment); single writer: the archiver's thread for the table."""

    def __init__(self, directory: Path) -> None:
        import lmdb

        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._env: Any = lmdb.open(str(directory), map_size=MAP_SIZE, max_dbs=2, subdir=True)
        self._rows = self._env.open_db(b"rows")
        self._meta = self._env.open_db(b"meta")

    @classmethod
    def for_table(cls, data_dir: str | Path, table_uuid: str) -> PrimaryKeyIndex:
        return cls(index_directory(data_dir, table_uuid))

    def close(self) -> None:
        self._env.close()

    def snapshot_id(self) -> int | None:
        """The table snapshot the index reflects (None: empty or never built)."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_SNAPSHOT_KEY)
        return None if raw is None else int(raw.decode())

    def lookup(self, keys: Iterable[bytes]) -> dict[bytes, IndexEntry]:
        """The live row of each key that has one."""
        found: dict[bytes, IndexEntry] = {}
        with self._env.begin(db=self._rows) as txn:
            for key in keys:
                raw = txn.get(key)
                if raw is not None:
                    found[key] = _unpack(raw)
        return found

    def apply(self, snapshot_id: int, rows: Mapping[bytes, IndexEntry], deleted: Iterable[bytes]) -> None:
        """After a commit: keys' new rows, keys deleted, and the new snapshot id, in one transaction."""
        with self._env.begin(write=True) as txn:
            for key in deleted:
                txn.delete(key, db=self._rows)
            for key, entry in rows.items():
                txn.put(key, _pack(entry), db=self._rows)
            txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)

    def rebuild(self, snapshot_id: int | None, rows: Iterable[tuple[bytes, IndexEntry]]) -> int:
        """Replace the whole index by the live rows of a snapshot (one transaction). Returns the row count."""
        count = 0
        with self._env.begin(write=True) as txn:
            txn.drop(self._rows, delete=False)
            txn.delete(_SNAPSHOT_KEY, db=self._meta)
            counted = 0

            def packed() -> Iterator[tuple[bytes, bytes]]:
                nonlocal counted
                for key, entry in rows:
                    counted += 1
                    yield key, _pack(entry)

            txn.cursor(db=self._rows).putmulti(packed())
            count = counted
            if snapshot_id is not None:
                txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)
        return count

    def forget_snapshot(self) -> None:
        """Mark the index as reflecting no snapshot: the next refresh rebuilds it."""
        with self._env.begin(write=True) as txn:
            txn.delete(_SNAPSHOT_KEY, db=self._meta)

    def items(self) -> Iterator[tuple[bytes, IndexEntry]]:
        """Every key and its row (a consistent read)."""
        with self._env.begin(db=self._rows) as txn:
            for key, raw in txn.cursor():
                yield bytes(key), _unpack(raw)

    def __len__(self) -> int:
        with self._env.begin(db=self._rows) as txn:
            return int(txn.stat(self._rows)["entries"])


def index_directory(data_dir: str | Path, table_uuid: str) -> Path:
    return Path(data_dir).resolve() / "pk-index" / table_uuid


def describe_index(data_dir: str | Path, table_uuid: str, table_snapshot: int | None) -> str:
    """For `icelog status --tables`: "at snapshot N" (current), "stale (at N)" / "stale (empty)" (the next pass
    refreshes it), or "missing" (the next pass builds it). Read-only: never creates or changes the index."""
    import lmdb

    directory = index_directory(data_dir, table_uuid)
    if not (directory / "data.mdb").exists():
        return "missing"
    env = lmdb.open(str(directory), readonly=True, max_dbs=2, subdir=True)
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin(db=meta) as txn:
            raw = txn.get(_SNAPSHOT_KEY)
    except lmdb.NotFoundError:
        raw = None
    finally:
        env.close()
    if raw is None:
        return "stale (empty)"
    snapshot = int(raw.decode())
    return f"at snapshot {snapshot}" if snapshot == table_snapshot else f"stale (at {snapshot})"


def _pack(entry: IndexEntry) -> bytes:
    return _ROW.pack(entry.offset, entry.pos) + entry.file.encode()


def _unpack(raw: bytes) -> IndexEntry:
    offset, pos = _ROW.unpack_from(raw)
    return IndexEntry(bytes(raw[_ROW.size :]).decode(), pos, offset)
