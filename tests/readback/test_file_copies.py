"""Read-back's local copies of data files on object storage (a real SeaweedFS bucket): a file is copied whole on its
first read and read from the copy afterwards, the copies stay within their bound (least recently used out first,
even while a reader still has one open), a file larger than the bound is read from the bucket, and local files are
never copied."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from icelog.readback.file_copies import FileCopies
from tests.support.seaweedfs import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFS

MB = 1024 * 1024


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    store = SeaweedFS(tmp_path_factory.mktemp("copies") / "seaweedfs").start()
    yield store
    store.discard()


def test_copies_are_read_locally_and_stay_within_their_bound(bucket: SeaweedFS, tmp_path: Path) -> None:
    io = PyArrowFileIO({"s3.endpoint": bucket.endpoint, "s3.region": "us-east-1", "s3.access-key-id": ACCESS_KEY,
                        "s3.secret-access-key": SECRET_KEY})
    bodies = {f"s3://{BUCKET}/t/data/{i}.parquet": os.urandom(MB + i) for i in range(4)}
    for location, body in bodies.items():
        bucket.client().put_object(Bucket=BUCKET, Key=location.split(f"{BUCKET}/", 1)[1], Body=body)
    copies = FileCopies(tmp_path / "copies", max_bytes=int(2.5 * MB))
    first, second, third, _ = bodies
    held = copies.open(io, first)  # a reader still holds the first copy when it is evicted below
    for location in (second, first, third):  # first is used again: second is the least recently used
        with copies.open(io, location) as stream:
            assert stream.read() == bodies[location]
    assert copies.entries == 2 and copies.size_bytes == len(bodies[first]) + len(bodies[third])
    assert len(list((tmp_path / "copies").glob("*.parquet"))) == 2
    assert held.read() == bodies[first]
    held.close()

    # Read again from the copy: the object may be gone from the bucket and the copy still serves it.
    bucket.client().delete_object(Bucket=BUCKET, Key=third.split(f"{BUCKET}/", 1)[1])
    with copies.open(io, third) as stream:
        assert stream.read() == bodies[third]

    small = FileCopies(tmp_path / "small", max_bytes=MB // 2)  # every file is larger: read from the bucket
    with small.open(io, first) as stream:
        assert stream.read() == bodies[first]
    assert small.entries == 0 and not list((tmp_path / "small").iterdir())

    local = tmp_path / "local.parquet"
    local.write_bytes(b"local bytes")
    with copies.open(io, local.as_uri()) as stream:  # a local file is never copied
        assert stream.read() == b"local bytes"
    assert copies.entries == 2


def test_a_restart_starts_with_no_copies(tmp_path: Path) -> None:
    (tmp_path / "copies").mkdir()
    (tmp_path / "copies" / "stale.parquet").write_bytes(b"of a file that may be gone")
    copies = FileCopies(tmp_path / "copies", max_bytes=MB)
    assert copies.entries == 0 and not list((tmp_path / "copies").iterdir())
