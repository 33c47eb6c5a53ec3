"""The primary-key index's merge rule, on a real LMDB environment (no Spark): which row a key held twice keeps,
which become stale, and that an upsert commit clears the stale rows. The end-to-end behaviour (a Spark SQL
INSERT of an existing key between archive passes) is in test_pk_tables.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icelog.archive.pk_index import (
    IndexEntry,
    IndexRows,
    PrimaryKeyIndex,
    describe_index,
    encode_key,
    encode_keys,
    settle,
)


def file_rows(location: str, rows: list[tuple[bytes, int, int]]) -> IndexRows:
    """One data file's rows: (key, position, offset)."""
    return IndexRows([encode_key((k,)) for k, _p, _o in rows], [location], [0] * len(rows),
                     [p for _k, p, _o in rows], [o for _k, _p, o in rows])


def test_vectorised_key_encoding_matches_encode_key() -> None:
    keys = [b"k1", b"", b"\x00\xff"]
    assert encode_keys([pa.array(keys, pa.binary())]) == [encode_key((k,)) for k in keys]
    assert encode_keys([pa.array(["eu", "us"]), pa.array([1, 2])]) == [encode_key(("eu", 1)), encode_key(("us", 2))]


def test_a_key_held_twice_keeps_the_later_commit_then_the_higher_offset(tmp_path: Path) -> None:
    index = PrimaryKeyIndex(tmp_path / "index")
    try:
        count = index.rebuild(7, [
            (1, file_rows("f1", [(b"a", 0, 10), (b"b", 1, 11), (b"c", 2, 12)]), []),
            (2, file_rows("f2", [(b"a", 0, 5)]), [3]),  # a later commit with a lower offset: it wins
            (2, file_rows("f3", [(b"b", 0, 9), (b"d", 1, 1)]), []),  # same commit as f2; f1's b is older
            (2, file_rows("f4", [(b"d", 0, 0)]), []),  # same commit as f3, lower offset: stale itself
        ])
        assert count == 4 and index.snapshot_id() == 7
        assert dict(index.items()) == {
            encode_key((b"a",)): IndexEntry("f2", 0, 5), encode_key((b"b",)): IndexEntry("f3", 0, 9),
            encode_key((b"c",)): IndexEntry("f1", 2, 12), encode_key((b"d",)): IndexEntry("f3", 1, 1),
        }
        assert {f: sorted(p) for f, p in index.stale().items()} == {"f1": [0, 1], "f2": [3], "f4": [0]}

        # A foreign APPEND: its rows win over the index's (an earlier commit), whatever their offsets.
        marked = index.follow_append(8, [(3, file_rows("f5", [(b"c", 0, 1), (b"e", 1, 2)]), [])])
        assert marked == 1 and index.snapshot_id() == 8
        found = index.lookup([encode_key((b"c",)), encode_key((b"zz",))])
        assert found == {encode_key((b"c",)): IndexEntry("f5", 0, 1)}
        assert sorted(index.stale()["f1"]) == [0, 1, 2]

        # The next upsert commit marks the stale rows deleted: the index forgets them with its update.
        index.apply(9, file_rows("f6", [(b"a", 0, 20)]), [encode_key((b"b",))], stale_marked=True)
        assert index.stale() == {} and index.snapshot_id() == 9
        assert dict(index.items())[encode_key((b"a",))] == IndexEntry("f6", 0, 20)
        assert encode_key((b"b",)) not in dict(index.items())
    finally:
        index.close()


def test_data_file_numbers_survive_a_reopen_and_an_aborted_update(tmp_path: Path) -> None:
    index = PrimaryKeyIndex(tmp_path / "index")
    try:
        index.rebuild(1, [(1, file_rows("f1", [(b"a", 0, 1)]), [])])

        def parts_then_crash() -> Iterator[tuple[int, IndexRows, list[int]]]:
            yield 2, file_rows("lost", [(b"b", 0, 2)]), []
            raise RuntimeError("the pass died while reading a data file")

        with pytest.raises(RuntimeError):
            index.follow_append(2, parts_then_crash())
        assert index.snapshot_id() == 1  # the aborted transaction left nothing, not even its file number
        index.apply(3, file_rows("f2", [(b"c", 4, 3)]), [])
    finally:
        index.close()
    reopened = PrimaryKeyIndex(tmp_path / "index")
    try:
        assert dict(reopened.items()) == {encode_key((b"a",)): IndexEntry("f1", 0, 1),
                                          encode_key((b"c",)): IndexEntry("f2", 4, 3)}
    finally:
        reopened.close()


def test_an_index_of_the_older_format_is_emptied_so_the_next_pass_rebuilds_it(tmp_path: Path) -> None:
    import struct

    import lmdb

    from icelog.archive.pk_index import describe_index, index_directory

    directory = index_directory(tmp_path, "uuid-1")
    directory.mkdir(parents=True)
    env = lmdb.open(str(directory), max_dbs=3, subdir=True)  # format 1: the location inside every row
    with env.begin(write=True) as txn:
        txn.put(encode_key((b"a",)), struct.pack(">qq", 1, 0) + b"file:/w/f1.parquet", db=env.open_db(b"rows", txn=txn))
        txn.put(b"snapshot", b"42", db=env.open_db(b"meta", txn=txn))
    env.close()
    assert describe_index(tmp_path, "uuid-1", 42) == "stale (older format)"
    index = PrimaryKeyIndex.for_table(tmp_path, "uuid-1")
    try:
        assert index.snapshot_id() is None and len(index) == 0
    finally:
        index.close()
    assert describe_index(tmp_path, "uuid-1", 42) == "stale (empty)"


def test_a_prepared_update_shows_nothing_until_the_table_commit_and_then_everything(tmp_path: Path) -> None:
    """The index writes a pass's rows while the table commit runs (PreparedUpdate): readers (and a crash) see the
    index before the commit until commit(snapshot id); an abort, a failed commit or leaving the block leaves it so."""
    index = PrimaryKeyIndex(tmp_path / "index")
    a, b, c = (encode_key((k,)) for k in (b"a", b"b", b"c"))
    try:
        index.rebuild(1, [(1, file_rows("f1", [(b"a", 0, 1), (b"b", 1, 2)]), [5])])
        with index.prepare(file_rows("f2", [(b"a", 0, 3), (b"c", 1, 4)]), [b], stale_marked=True) as update:
            # Another thread writes the rows now; a reader still sees the index at snapshot 1.
            assert index.snapshot_id() == 1 and index.lookup([a, b, c]) == {
                a: IndexEntry("f1", 0, 1), b: IndexEntry("f1", 1, 2)}
            update.commit(2)
        assert index.snapshot_id() == 2 and index.stale() == {}
        assert dict(index.items()) == {a: IndexEntry("f2", 0, 3), c: IndexEntry("f2", 1, 4)}

        with index.prepare(file_rows("f3", [(b"a", 0, 9)]), [c]) as update:
            update.abort()  # the table commit failed
        with index.prepare(file_rows("f4", [(b"b", 0, 9)]), [a]):
            pass  # the pass raised before committing: leaving the block aborts
        assert index.snapshot_id() == 2
        assert dict(index.items()) == {a: IndexEntry("f2", 0, 3), c: IndexEntry("f2", 1, 4)}
        index.forget_snapshot()  # the writer is free again after an abort (LMDB has one writer)
        assert index.snapshot_id() is None

        broken = IndexRows([a, c], ["f5"], [0], [0], [1])  # columns of unequal length: the update fails
        with index.prepare(broken, []) as update, pytest.raises(ValueError):
            update.commit(3)
        assert index.snapshot_id() is None and dict(index.items())[a] == IndexEntry("f2", 0, 3)
    finally:
        index.close()


def test_an_update_committed_later_is_what_the_next_opener_of_the_index_sees(tmp_path: Path, caplog: Any) -> None:
    """commit_later: the pass returns while the index's thread ends the transaction and closes the index; the next
    PrimaryKeyIndex of the directory and describe_index wait for it. A later update that fails leaves the index
    before its commit (logged), so the next pass brings it up to the table."""
    directory = tmp_path / "pk-index" / "uuid-1"
    a, b = encode_key((b"a",)), encode_key((b"b",))
    index = PrimaryKeyIndex(directory)
    index.rebuild(1, [(1, file_rows("f1", [(b"a", 0, 1)]), [])])
    with index.prepare(file_rows("f2", [(b"a", 0, 2), (b"b", 1, 3)]), []) as update:
        update.commit_later(2)
    index.close()  # the thread closes it (after its commit), not the caller
    assert describe_index(tmp_path, "uuid-1", 2) == "at snapshot 2"
    reopened = PrimaryKeyIndex(directory)
    assert reopened.snapshot_id() == 2 and dict(reopened.items()) == {a: IndexEntry("f2", 0, 2),
                                                                      b: IndexEntry("f2", 1, 3)}
    broken = IndexRows([a, b], ["f3"], [0], [0], [4])  # columns of unequal length: the update fails
    with caplog.at_level(logging.WARNING, logger="icelog.archive.pk_index"), reopened.prepare(broken, []) as update:
        update.commit_later(3)
    reopened.close()
    settle()
    assert "the next pass brings it up to the table" in caplog.text
    again = PrimaryKeyIndex(directory)
    try:
        assert again.snapshot_id() == 2 and again.lookup([a])[a] == IndexEntry("f2", 0, 2)
    finally:
        again.close()
