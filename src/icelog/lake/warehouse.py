"""Where the tables' files live, and how every engine reaches them: a local (or shared) directory, or a bucket of
any S3-compatible store (`archive.warehouse=s3://BUCKET/PATH`).

- **Spark** (the archiver, maintenance, `icelog sql`, the sink) reaches a bucket through Hadoop's S3A filesystem
  (hadoop-aws and the AWS SDK bundle it was built with, jars/pom.xml), registered for both `s3://` and `s3a://`,
  so the tables' metadata names `s3://` paths that pyiceberg, DuckDB and Trino read as they are.
- **pyiceberg and pyarrow** (the broker's read-back, `icelog status --tables`, the workers that write data files,
  the primary-key index) reach it through pyiceberg's FileIO, given `io_properties`.

Endpoint, region and credentials are read the way every AWS tool reads them: `AWS_ENDPOINT_URL_S3` or
`AWS_ENDPOINT_URL`, `AWS_REGION` (or `AWS_DEFAULT_REGION`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`. Credentials are never copied into Spark's conf or pyiceberg's properties (where a conf dump
or an error could show them): the JVM and the Python workers inherit the environment, and S3A's and Arrow's
default credential chains read them from it (S3A's `fs.s3a.*` keys in `archive.spark_conf`, or pyiceberg's
`s3.*` in `archive.catalog_properties`, override any of this).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from icelog.config import Settings
from icelog.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io.pyarrow import PyArrowFileIO

OBJECT_STORE_SCHEMES = ("s3", "s3a")
DEFAULT_REGION = "us-east-1"  # what AWS's SDKs assume when nothing names one
# The jars of jars/pom.xml S3A needs (file name prefixes, one version each in the jars directory).
S3A_JARS = ("hadoop-aws-", "aws-java-sdk-bundle-")


def on_object_storage(warehouse: str) -> bool:
    """Whether the warehouse is a bucket (s3:// or s3a://) rather than a filesystem path."""
    return urlsplit(warehouse).scheme in OBJECT_STORE_SCHEMES


def check_warehouse(warehouse: str) -> None:
    """Refuse a warehouse URL no engine here can reach, saying what would work."""
    parts = urlsplit(warehouse)
    if parts.scheme in OBJECT_STORE_SCHEMES and not parts.netloc:
        raise ConfigError(f"archive.warehouse {warehouse!r} names no bucket: use s3://BUCKET/PATH")
    if parts.scheme not in ("", "file", *OBJECT_STORE_SCHEMES):
        raise ConfigError(
            f"archive.warehouse {warehouse!r}: a {parts.scheme}:// warehouse is not supported; use a directory "
            "(file:///PATH) or an S3-compatible bucket (s3://BUCKET/PATH)")


def endpoint() -> str | None:
    """The S3 endpoint the environment names (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL), or None for AWS's."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def s3a_jars(jars: Path) -> list[Path]:
    """hadoop-aws and the AWS SDK bundle from the set-up's jars directory (never downloaded here)."""
    found = []
    for prefix in S3A_JARS:
        matches = sorted(jars.glob(f"{prefix}*.jar"))
        if len(matches) != 1:
            raise ConfigError(
                f"a warehouse on S3 needs exactly one {prefix}*.jar in {jars} (found {len(matches)}): run "
                f"`make setup`, or scripts/fetch-jars.sh {jars}")
        found.append(matches[0])
    return found


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Hadoop conf (spark.hadoop.*) Spark needs to reach the warehouse: none for a filesystem path."""
    if not on_object_storage(settings.warehouse):
        return {}
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint.region": region(),
        # Iceberg never renames (every file has a unique name; the catalog swaps metadata pointers), so S3A's
        # directory markers only cost requests.
        "spark.hadoop.fs.s3a.directory.marker.retention": "keep",
    }
    url = endpoint()
    if url is not None:
        conf["spark.hadoop.fs.s3a.endpoint"] = url
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(urlsplit(url).scheme == "https").lower()
        # S3-compatible stores (SeaweedFS, MinIO, Ceph) serve buckets by path, not as virtual hosts.
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
    return conf


def environment_io_properties() -> dict[str, str]:
    """pyiceberg FileIO properties for the S3 endpoint and region the environment names (never credentials)."""
    props = {"s3.region": region()}
    url = endpoint()
    if url is not None:
        props["s3.endpoint"] = url
        props["s3.force-virtual-addressing"] = "false"  # path-style requests, as S3-compatible stores serve
    return props


def io_properties(settings: Settings) -> dict[str, str]:
    """pyiceberg FileIO properties that reach the warehouse (archive.catalog_properties win)."""
    props = environment_io_properties() if on_object_storage(settings.warehouse) else {}
    props.update(settings.archive.catalog_properties)
    return props


def open_file(location: str, properties: Mapping[str, str] | None = None) -> pa.NativeFile:
    """A file of the warehouse (a data file, a Puffin file) opened for random reads, through the filesystem
    pyiceberg's FileIO picks and configures for its scheme, as for scans (`properties`: io_properties; by default
    the environment's endpoint and region)."""
    props = environment_io_properties() if properties is None else properties
    io = _file_io(tuple(sorted(props.items())))
    scheme, netloc, path = io.parse_location(location)
    return io.fs_by_scheme(scheme, netloc).open_input_file(path)


@functools.lru_cache(maxsize=8)
def _file_io(properties: tuple[tuple[str, str], ...]) -> PyArrowFileIO:
    """One FileIO per set of properties: it keeps its filesystems (an S3 client each), so the primary-key index's
    reads of many files do not set one up per file."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(properties))
