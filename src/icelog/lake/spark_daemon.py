"""Spark's Python daemon for icelog's workers: pyspark's own, started without Spark's archives on sys.path.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip`, `py4j-*-src.zip` and the spark-core jar first on every Python
worker's path. With pyspark installed from PyPI these are copies of the installed packages, and they cost on
every task: the worker calls `importlib.invalidate_caches()` per task, which makes each zipimporter re-read its
archive's whole directory in pure Python (~0.1 s a task on this 2-core machine, more than decoding a 25 k-record
archive), and modules imported from a zip are compiled again at each daemon start (zipimport writes no .pyc).
Dropped here (when pyspark is importable without them), pyspark comes from site-packages: the same version,
with its cached bytecode. Selected by `spark.python.daemon.module` (lake/spark.py).

The daemon forks every worker, so it also imports once what every archive task imports (PRELOADED): a new
worker then starts with them loaded instead of paying for them in its first task (pyiceberg's pyarrow module,
which upsert workers write with, alone takes ~0.9 s to import on this machine).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys


def spark_archive(entry: str) -> str | None:
    """The Spark archive a sys.path (or importer cache) entry is, or lies inside: `x/pyspark.zip/pyspark/sql`
    is in `x/pyspark.zip`."""
    for suffix in (".zip", ".jar"):
        cut = entry.find(suffix + os.sep)
        archive = entry[: cut + len(suffix)] if cut >= 0 else entry
        name = os.path.basename(archive)
        if archive.endswith(suffix) and os.path.isfile(archive) and (
            name == "pyspark.zip" or name.startswith("py4j-" if suffix == ".zip" else "spark-core")
        ):
            return archive
    return None


PRELOADED = (
    "pyarrow",
    "pyarrow.parquet",
    "pyiceberg.io.pyarrow",
    "icelog.archive.decode",
    "icelog.archive.decode_table",
    "icelog.archive.decode_schema",
    "icelog.lake.data_files",
)


def preload() -> None:
    """Import the archive tasks' modules in the daemon, before it forks workers (a module that fails to import is
    left for the task that needs it, which reports the error)."""
    for name in PRELOADED:
        with contextlib.suppress(Exception):  # the task importing it reports the error
            importlib.import_module(name)


def main() -> None:
    path = list(sys.path)
    sys.path[:] = [entry for entry in path if spark_archive(entry) is None]
    if importlib.util.find_spec("pyspark") is None:  # pyspark only in Spark's zip (a Spark distribution)
        sys.path[:] = path
    else:  # finding this module made zipimporters for them, and invalidate_caches() walks this cache
        for entry in [e for e in sys.path_importer_cache if spark_archive(e) is not None]:
            del sys.path_importer_cache[entry]
    from pyspark import daemon

    preload()
    daemon.manager()  # type: ignore[no-untyped-call]  # pyspark leaves it unannotated


if __name__ == "__main__":
    main()
