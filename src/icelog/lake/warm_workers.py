"""Keep Spark's Python workers alive between bursts: a new worker makes the next pass ~0.3–0.4 s slower.

Spark 3.5 stops a Python worker that has been idle for 60 s (PythonWorkerFactory; not configurable), and the
worker forked in its place is slow in its first task although the daemon preloaded its modules
(lake/spark_daemon.py): building Arrow columns and writing Parquet take 3–5x longer in a fresh process (first
use of pyarrow's memory and thread pools). Measured on a 100 k-record upsert pass: 0.72 s after 50 s idle,
1.05 s after 70 s, 0.76 s after 70 s with this keeper.

The archive's jobs are RDD jobs (every pass's file writers, lake/data_files.py), so they use Spark's pool of
workers for RDD jobs. (SQL's Python functions, e.g. mapInArrow, have a pool of their own; the archive runs none.)
A pool the archiver used within the last KEEP_FOR_S gets a trivial job on every task slot after PING_EVERY_S of
idleness, which hands each idle worker a task and resets its idle clock. An archiver idle for longer lets its
workers go (and runs no job at all).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

RDD = "rdd"  # the pool of Python workers the archive's jobs use (RDD jobs)
PING_EVERY_S = 45.0  # under Spark's 60 s idle timeout
KEEP_FOR_S = 600.0  # after the last pass of a kind, its workers are kept this long
JOB_DESCRIPTION = "icelog: keep the archive's Python workers alive between passes"


def worker_pid(tasks: Iterable[int]) -> Iterator[int]:
    """An RDD task: the worker's pid. The input must be read to its end, or pyspark does not reuse the worker."""
    for _ in tasks:
        pass
    yield os.getpid()


def ping(spark: SparkSession, kind: str, slots: int) -> list[int]:
    """Run a trivial job of `slots` tasks in the pool of `kind`; the pids of the workers that ran them."""
    context = spark.sparkContext
    context.setJobDescription(JOB_DESCRIPTION)
    try:
        if kind != RDD:
            raise ValueError(f"no pool of Python workers named {kind!r}")
        return [int(pid) for pid in context.parallelize(range(slots), slots).mapPartitions(worker_pid).collect()]
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]  # None clears it; pyspark's annotation says str


class WorkerKeeper:
    """Remembers when the archive last used each pool and pings the pools that would otherwise go idle."""

    def __init__(
        self, spark: SparkSession, slots: Callable[[], int], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.spark = spark
        self.slots = slots
        self.clock = clock
        self._used: dict[str, float] = {}  # kind → when a pass last ran a job in its pool
        self._busy: dict[str, float] = {}  # kind → when a job (a pass's or a ping) last ran there
        self.pids: dict[str, list[int]] = {}  # kind → the workers the last ping reached (logs, tests)

    def used(self, kind: str) -> None:
        """A pass just ran a job in the pool of `kind`."""
        self._used[kind] = self._busy[kind] = self.clock()

    def poll(self) -> dict[str, list[int]]:
        """Ping each pool that is due (idle PING_EVERY_S, used within KEEP_FOR_S); {kind: worker pids} pinged."""
        pinged: dict[str, list[int]] = {}
        for kind, used in list(self._used.items()):
            now = self.clock()
            if now - used >= KEEP_FOR_S or now - self._busy[kind] < PING_EVERY_S:
                continue
            self._busy[kind] = now  # a failed ping is not retried at once
            try:
                pinged[kind] = ping(self.spark, kind, self.slots())
            except Exception as exc:  # Spark gone: the next pass finds out and reports it
                log.warning("could not keep the %s Python workers alive: %s", kind, exc)
                continue
            self._busy[kind] = self.clock()
            self.pids[kind] = pinged[kind]
            log.debug("kept the %s Python workers alive: %s", kind, pinged[kind])
        return pinged
