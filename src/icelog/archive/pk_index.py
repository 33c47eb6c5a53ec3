"""The primary-key index of an upsert table: key → (data file, position, offset), in an embedded LMDB.

Nobu's design: an upsert batch finds the rows it replaces by a local lookup instead of scanning the table.
The index is a cache of the table, never the truth: it records the snapshot it reflects, and the upsert
writer (archive/upsert.py) rebuilds it from the table whenever that is not the table's current snapshot
and it cannot follow the snapshots since (the directory deleted by hand, a copy-on-write DELETE or MERGE, an
INSERT OVERWRITE or equality deletes by someone else).
Updates after a commit go in one LMDB transaction with the new snapshot id, so the index is either wholly
before or wholly after a commit. Rows the table holds that are not their key's latest (a foreign INSERT of an
existing key) are kept as *stale* rows until the next upsert commit marks them deleted.

One LMDB environment per table, under `<data_dir>/pk-index/<table uuid>` (a table dropped and made again
has another uuid, so another index). Keys are the encoded primary key (encode_key); values pack the row's
offset, position and a number standing for its data file (24 bytes: a location is ~120), so a pass reads and
writes a fifth of the pages it would with locations in every row. The numbers are assigned in the `files`
database (both ways) and never reused; a rebuild starts them over. An index of an older format is emptied
when opened, so the next pass rebuilds it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import decimal
import logging
import queue
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lmdb

    from icelog.table.arrow import ArrowArray

log = logging.getLogger(__name__)

_ROW = struct.Struct(">qqQ")  # offset, position, data file number
_NUMBER = struct.Struct(">Q")
_POS = struct.Struct(">q")  # a stale row's key: its position, then its data file's location
_SNAPSHOT_KEY = b"snapshot"
_FORMAT_KEY, FORMAT = b"format", b"2"  # 2: data files by number (1: a location in every row)
_NAME, _LOCATION = b"n", b"l"  # files database: n<number> -> location, l<location> -> number
MAP_SIZE = 1 << 36  # LMDB's address-space reservation (sparse): 64 GiB of index at most

# Index updates a pass left committing in their thread (PreparedUpdate.commit_later), by index directory: the next
# PrimaryKeyIndex of the directory, describe_index and settle() wait for them (and interpreter exit, below).
_SETTLING: dict[Path, threading.Thread] = {}
_SETTLING_LOCK = threading.Lock()


def settle(directory: Path | None = None) -> None:
    """Wait until the index updates still committing (of one index directory, or of all) have ended."""
    with _SETTLING_LOCK:
        threads = [_SETTLING.pop(directory, None)] if directory is not None else list(_SETTLING.values())
        if directory is None:
            _SETTLING.clear()
    for thread in threads:
        if thread is not None:
            thread.join()


atexit.register(settle)  # runs before the interpreter stops daemon threads: no decided update is cut short


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


def encode_keys(columns: Sequence[ArrowArray]) -> list[bytes]:
    """encode_key of each row of pyarrow key columns (no nulls): one vectorised concat for a binary key."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(columns) == 1 and (pa.types.is_binary(columns[0].type) or pa.types.is_large_binary(columns[0].type)):
        prefix, empty = pa.scalar(b"b", columns[0].type), pa.scalar(b"", columns[0].type)
        return list(pc.binary_join_element_wise(prefix, columns[0], empty).to_pylist())
    values = [c.to_pylist() for c in columns]
    return [encode_key(row) for row in zip(*values, strict=True)]


def _normal(value: object) -> object:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return stamp.astimezone(datetime.UTC).isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


@dataclass
class IndexRows:
    """Rows for the index, columnar: each row's encoded key, data file (a number into `files`), position and offset."""

    keys: list[bytes]
    files: list[str]
    file_of: list[int]
    positions: list[int]
    offsets: list[int]

    def __len__(self) -> int:
        return len(self.keys)

    def entries(self) -> Iterator[tuple[bytes, IndexEntry]]:
        for key, number, pos, offset in zip(self.keys, self.file_of, self.positions, self.offsets, strict=True):
            yield key, IndexEntry(self.files[number], pos, offset)

    def packed(self, numbers: Sequence[int]) -> list[tuple[bytes, bytes]]:
        """(key, LMDB value) pairs in key order (LMDB then writes a sorted run, page after page); `numbers`: the
        index's number of each of `files`."""
        pack = _ROW.pack
        columns = zip(self.keys, self.file_of, self.positions, self.offsets, strict=True)
        pairs = [(key, pack(offset, pos, numbers[number])) for key, number, pos, offset in columns]
        pairs.sort(key=_first)  # already in order for a binary key: timsort makes it one linear pass
        return pairs

    @classmethod
    def of(cls, entries: Mapping[bytes, IndexEntry]) -> IndexRows:
        files: dict[str, int] = {}
        file_of = [files.setdefault(e.file, len(files)) for e in entries.values()]
        return cls(list(entries), list(files), file_of, [e.pos for e in entries.values()],
                   [e.offset for e in entries.values()])


class PrimaryKeyIndex:
    """One table's index (an LMDB environment); single writer: the archiver's thread for the table.

    Besides key → row, it keeps the *stale* rows: rows the table holds that are not their key's latest (a
    foreign commit, such as an analyst's INSERT of an existing key, added a newer row for the key). The next
    upsert commit marks them deleted in its deletion vectors and clears the list in the same index update.
    """

    def __init__(self, directory: Path) -> None:
        import lmdb

        settle(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._handed_off = False  # a PreparedUpdate committing in its thread closes the environment
        self._env: lmdb.Environment = lmdb.open(str(directory), map_size=MAP_SIZE, max_dbs=4, subdir=True)
        self._rows = self._env.open_db(b"rows")
        self._meta = self._env.open_db(b"meta")
        self._stale = self._env.open_db(b"stale")
        self._files = self._env.open_db(b"files")
        self._names: dict[int, str] = {}  # data file numbers read so far (a number never changes its file)
        with self._write() as txn:
            if txn.get(_FORMAT_KEY, db=self._meta) != FORMAT:  # new, or an older format: empty (rebuilt next pass)
                self._clear(txn)
                txn.put(_FORMAT_KEY, FORMAT, db=self._meta)

    @contextlib.contextmanager
    def _write(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A write transaction; if it aborts, the file numbers it assigned are forgotten with it."""
        try:
            with self._env.begin(write=True) as txn:
                yield txn
        except BaseException:
            self._names.clear()
            raise

    def _clear(self, txn: lmdb.Transaction[bytes]) -> None:
        for db in (self._rows, self._stale, self._files):
            txn.drop(db, delete=False)
        txn.delete(_SNAPSHOT_KEY, db=self._meta)
        self._names.clear()

    def _numbers(self, txn: lmdb.Transaction[bytes], locations: Sequence[str]) -> list[int]:
        """The number of each data file location, assigning the next free ones to new files (in `txn`)."""
        numbers = []
        for location in locations:
            raw = txn.get(_LOCATION + location.encode(), db=self._files)
            if raw is None:
                number = int(txn.stat(self._files)["entries"]) // 2
                txn.put(_LOCATION + location.encode(), _NUMBER.pack(number), db=self._files)
                txn.put(_NAME + _NUMBER.pack(number), location.encode(), db=self._files)
                self._names[number] = location
            else:
                (number,) = _NUMBER.unpack(raw)
            numbers.append(number)
        return numbers

    def _unpack(self, txn: lmdb.Transaction[bytes], raw: bytes) -> IndexEntry:
        offset, pos, number = _ROW.unpack(raw)
        name = self._names.get(number)
        if name is None:
            found = txn.get(_NAME + _NUMBER.pack(number), db=self._files)
            if found is None:
                raise KeyError(f"primary-key index {self.directory}: row names data file number {number}, unknown")
            name = self._names[number] = bytes(found).decode()
        return IndexEntry(name, pos, offset)

    @classmethod
    def for_table(cls, data_dir: str | Path, table_uuid: str) -> PrimaryKeyIndex:
        return cls(index_directory(data_dir, table_uuid))

    def close(self) -> None:
        if not self._handed_off:
            self._env.close()

    def snapshot_id(self) -> int | None:
        """The table snapshot the index reflects (None: empty or never built)."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_SNAPSHOT_KEY)
        return None if raw is None else int(raw.decode())

    def lookup(self, keys: Iterable[bytes]) -> dict[bytes, IndexEntry]:
        """The live row of each key that has one (one sorted multi-get: neighbouring keys share pages)."""
        with self._env.begin(db=self._rows) as txn:
            found = txn.cursor().getmulti(sorted(keys))
            return {bytes(key): self._unpack(txn, raw) for key, raw in found}

    def apply(
        self, snapshot_id: int, rows: IndexRows, deleted: Iterable[bytes], stale_marked: bool = False
    ) -> None:
        """After a commit: keys' new rows, keys deleted, and the new snapshot id, in one transaction.
        stale_marked: the commit marked the stale rows deleted, so the list is cleared."""
        with self._write() as txn:
            self._put_rows(txn, rows, deleted, stale_marked)
            txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)

    def prepare(self, rows: IndexRows, deleted: Iterable[bytes], stale_marked: bool = False) -> PreparedUpdate:
        """apply's work, done now in its own thread while the caller commits to the table: the write transaction
        stays open, invisible to readers, until the caller's PreparedUpdate.commit(snapshot_id) or abort(). The
        caller must not write to the index before then (LMDB has one writer: it would wait for this one)."""
        return PreparedUpdate(self, rows, list(deleted), stale_marked)

    def _put_rows(
        self, txn: lmdb.Transaction[bytes], rows: IndexRows, deleted: Iterable[bytes], stale_marked: bool
    ) -> None:
        for key in deleted:
            txn.delete(key, db=self._rows)
        txn.cursor(db=self._rows).putmulti(rows.packed(self._numbers(txn, rows.files)))
        if stale_marked:
            txn.drop(self._stale, delete=False)

    def follow_append(self, snapshot_id: int, files: Iterable[tuple[int, IndexRows, list[int]]]) -> int:
        """A snapshot that only added rows (e.g. a foreign INSERT): `files` as for rebuild, all of that snapshot.
        Its rows become their keys' rows (the key's latest among them), a key's previous row becomes stale. One
        transaction with the new snapshot id; the driver holds one data file's keys at a time. Returns how many
        rows became stale."""
        with self._write() as txn:
            marked = self._merge(txn, files)
            txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)
        return marked

    def follow_delta(
        self, snapshot_id: int, files: Iterable[tuple[int, IndexRows, list[int]]],
        deleted: Iterable[tuple[str, list[bytes], list[int]]],
    ) -> tuple[int, int]:
        """A snapshot that added rows and deletion vectors without moving rows (a merge-on-read DELETE, UPDATE or
        MERGE): its added files' live rows as follow_append takes them, then, per data file one of its DVs
        covers, the keys and positions of the rows the DV deletes: a key whose row is one of them leaves the
        index, and a stale row among them is stale no more (deleted already). One transaction with the new
        snapshot id. Returns (rows that became stale, keys dropped)."""
        with self._write() as txn:
            marked = self._merge(txn, files)
            rows, dropped = txn.cursor(db=self._rows), 0
            for location, keys, positions in deleted:
                found = {bytes(k): self._unpack(txn, raw) for k, raw in rows.getmulti(sorted(set(keys)))}
                for key, pos in zip(keys, positions, strict=True):
                    entry = found.get(key)
                    if entry is not None and entry.file == location and entry.pos == pos:
                        txn.delete(key, db=self._rows)
                        found.pop(key)
                        dropped += 1
                    txn.delete(_stale_key(location, pos), db=self._stale)
            txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)
        return marked, dropped

    def stale(self) -> dict[str, list[int]]:
        """The stale rows' positions per data file."""
        found: dict[str, list[int]] = {}
        with self._env.begin(db=self._stale) as txn:
            for raw, _value in txn.cursor():
                (pos,) = _POS.unpack_from(raw)
                found.setdefault(bytes(raw[_POS.size :]).decode(), []).append(pos)
        return found

    def rebuild(self, snapshot_id: int | None, files: Iterable[tuple[int, IndexRows, list[int]]]) -> int:
        """Replace the whole index by the live rows of a snapshot (one transaction). Returns the key count.

        `files`: per data file, in commit order (data sequence number, then any order), the sequence number,
        the latest row per key of the file, and the positions of the file's rows that are not (stale). A key
        met again in a later file keeps the row of the later commit, or within one commit the higher offset
        (the later file on a tie); the other row becomes stale.
        """
        with self._write() as txn:
            self._clear(txn)
            self._merge(txn, files)
            if snapshot_id is not None:
                txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=self._meta)
            return int(txn.stat(self._rows)["entries"])

    def _merge(self, txn: lmdb.Transaction[bytes], files: Iterable[tuple[int, IndexRows, list[int]]]) -> int:
        """Put files' rows (see rebuild) into the index; a key's row of an earlier commit (a file not among
        `files`: the index's rows before) or of a lower offset becomes stale. Returns how many rows did."""
        rows, stale = txn.cursor(db=self._rows), txn.cursor(db=self._stale)
        sequence: dict[str, int] = {}
        count = 0
        for seq, part, stale_positions in files:
            [location] = part.files
            sequence[location] = seq
            marked = [(location, p) for p in stale_positions]
            pairs = part.packed(self._numbers(txn, part.files))
            consumed, added = rows.putmulti(pairs, overwrite=False)
            if added < consumed:  # keys already met in an earlier file: the newer row wins
                ours = dict(pairs)
                for key, raw in rows.getmulti([k for k, _v in pairs]):
                    if raw == ours[key]:
                        continue
                    old, mine = self._unpack(txn, raw), self._unpack(txn, ours[key])
                    if (sequence.get(old.file, -1), old.offset) <= (seq, mine.offset):
                        rows.put(key, ours[key])
                        marked.append((old.file, old.pos))
                    else:
                        marked.append((location, mine.pos))
            stale.putmulti(sorted((_stale_key(f, p), b"") for f, p in marked))
            count += len(marked)
        return count

    def forget_snapshot(self) -> None:
        """Mark the index as reflecting no snapshot: the next refresh rebuilds it."""
        with self._write() as txn:
            txn.delete(_SNAPSHOT_KEY, db=self._meta)

    def items(self) -> Iterator[tuple[bytes, IndexEntry]]:
        """Every key and its row (a consistent read)."""
        with self._env.begin(db=self._rows) as txn:
            for key, raw in txn.cursor():
                yield bytes(key), self._unpack(txn, raw)

    def __len__(self) -> int:
        with self._env.begin(db=self._rows) as txn:
            return int(txn.stat(self._rows)["entries"])


class _Aborted(Exception):
    """Ends a prepared update's transaction without committing it."""


class PreparedUpdate:
    """An index update whose rows are being written by its own thread (PrimaryKeyIndex.prepare) while the table
    commit runs; the transaction commits with the commit's snapshot id, or aborts, when the caller says so. A
    crash or a failed table commit leaves the index wholly before the commit, as apply after the commit would.
    Use as a context manager: leaving it without commit() aborts."""

    def __init__(self, index: PrimaryKeyIndex, rows: IndexRows, deleted: list[bytes], stale_marked: bool) -> None:
        self._index = index
        self._decision: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._decided = False
        self._close_after = False  # commit_later: the thread closes the index once its transaction ended
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(rows, deleted, stale_marked), name="pk-index-update", daemon=True
        )
        self._thread.start()

    def _run(self, rows: IndexRows, deleted: list[bytes], stale_marked: bool) -> None:
        index = self._index
        # LMDB ties a write transaction to its thread: it is begun, filled and ended here. The thread always waits
        # for the caller's decision, so that commit_later's hand-over is seen whatever happened before.
        snapshot_id = None
        try:
            with index._write() as txn:
                try:
                    index._put_rows(txn, rows, deleted, stale_marked)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller with the decision
                    self._error = exc
                snapshot_id = self._decision.get()
                if snapshot_id is None or self._error is not None:
                    raise _Aborted
                txn.put(_SNAPSHOT_KEY, str(snapshot_id).encode(), db=index._meta)
        except _Aborted:
            pass
        except BaseException as exc:  # the transaction's commit failed
            self._error = exc
        finally:
            if self._close_after:  # commit_later: nobody waits for this thread but the next user of the index
                if self._error is not None:  # the index stays before the table commit: the next pass catches up
                    log.warning("primary-key index %s: the update of snapshot %s failed (%s); the next pass brings "
                                "it up to the table", index.directory, snapshot_id, self._error)
                index._env.close()

    def commit(self, snapshot_id: int) -> None:
        """The table commit landed as `snapshot_id`: the index takes the rows with it (raises what the update met)."""
        self._finish(snapshot_id)
        if self._error is not None:
            raise self._error

    def commit_later(self, snapshot_id: int) -> None:
        """As commit, without waiting for the index transaction to be written and synced: the thread ends it and
        closes the index; whoever opens the index next (PrimaryKeyIndex, describe_index, settle) waits for it.
        The table commit is the record of the pass: should this update fail or the process die first, the index
        is behind the table, and the next pass brings it up to it (follows that commit, or rebuilds)."""
        with _SETTLING_LOCK:
            self._close_after = True
            self._index._handed_off = True
            _SETTLING[self._index.directory] = self._thread
        self._decided = True
        self._decision.put(snapshot_id)

    def abort(self) -> None:
        """Nothing of the update reaches the index."""
        self._finish(None)

    def _finish(self, snapshot_id: int | None) -> None:
        if not self._decided:
            self._decided = True
            self._decision.put(snapshot_id)
        self._thread.join()

    def __enter__(self) -> PreparedUpdate:
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self._decided:
            self.abort()


def index_directory(data_dir: str | Path, table_uuid: str) -> Path:
    return Path(data_dir).resolve() / "pk-index" / table_uuid


def describe_index(data_dir: str | Path, table_uuid: str, table_snapshot: int | None) -> str:
    """For `icelog status --tables`: "at snapshot N" (current), "stale (at N)" / "stale (empty)" (the next pass
    refreshes it), or "missing" (the next pass builds it). Read-only: never creates or changes the index."""
    import lmdb

    directory = index_directory(data_dir, table_uuid)
    settle(directory)
    if not (directory / "data.mdb").exists():
        return "missing"
    env = lmdb.open(str(directory), readonly=True, max_dbs=4, subdir=True)
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin(db=meta) as txn:
            raw, form = txn.get(_SNAPSHOT_KEY), txn.get(_FORMAT_KEY)
    except lmdb.NotFoundError:
        raw = form = None
    finally:
        env.close()
    if form != FORMAT:
        return "stale (older format)"
    if raw is None:
        return "stale (empty)"
    snapshot = int(raw.decode())
    return f"at snapshot {snapshot}" if snapshot == table_snapshot else f"stale (at {snapshot})"


def _first(pair: tuple[bytes, bytes]) -> bytes:
    return pair[0]


def _stale_key(file: str, pos: int) -> bytes:
    return _POS.pack(pos) + file.encode()
