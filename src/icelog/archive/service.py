"""The archiver as a long-running process: passes on a poll interval, backoff on failure, a single instance.

`icelog serve` starts it as a child process (`icelog archive`) so the Spark driver never shares the
broker's event loop or GIL. The Spark session starts only once some topic is archived, and only in the holder of
the store's archiver lock: with several brokers on one store, every other broker's child stands by for the lock
(archive/locks.py ArchiverLock.stand_by, in cli/archive.py) and takes over when the holder dies.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from icelog.archive.archiver import Archiver, ArchiverStore, GapHook, TopicPassResult
from icelog.config import SETTINGS_ENV, Settings
from icelog.errors import IcelogError, first_line
from icelog.lake.jvm_errors import jvm_errors
from icelog.meta.backends import open_store
from icelog.meta.store import StoreConnection, TopicReader
from icelog.table.config import archive_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icelog.archive.maintenance_schedule import MaintenanceScheduler

log = logging.getLogger(__name__)



_STARTED_AT: int | None = None  # this process's niceness when it first lowered its priority (what it inherited)


def lower_priority(niceness: int, setting: str = "archive.nice", relative: bool = False) -> None:
    """Run this process, and every process it starts later (the Spark JVM, its Python workers), at `niceness`.

    The archiver shares the machine with the broker; at a higher niceness the kernel gives the broker's
    produce path the CPU first, so acknowledgement latency holds while Spark decodes and writes. Called
    before Spark starts, so the JVM and its workers inherit it; never raises the priority. `relative`: `niceness`
    is added to the niceness the process started with (inherited from the broker that started it), as `nice -n`
    does, so the archiver stays below a broker that itself runs niced (at 10, an absolute 10 would be no lower).
    """
    global _STARTED_AT
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if _STARTED_AT is None:
            _STARTED_AT = current
        wanted = min(19, _STARTED_AT + niceness) if relative else niceness
        if wanted > current:
            os.setpriority(os.PRIO_PROCESS, 0, wanted)
            log.info("CPU niceness %d (%s%s)", wanted, setting, f" {niceness} above {_STARTED_AT}" if relative else "")
    except OSError as exc:  # not allowed in some containers: run at the inherited priority
        log.warning("could not set the CPU niceness to %d (%s): %s", niceness, setting, exc)


def archived_topics_exist(settings: Settings, store: TopicReader) -> bool:
    return any(
        archive_config(t.name, t.configs, settings.topic_defaults, settings.archive).enabled
        for t in store.list_topics()
    )


def until_due_s(results: Iterable[TopicPassResult], now_ms: int, poll_s: float) -> float:
    """The wait before the next pass: the poll interval, or less when an archive a pass left open completes sooner.

    An archive completes when its oldest record is `complete.delay.max.ms` old (or its newest `idle.max.ms`): waking
    then, not at the next poll, takes up to a poll interval off its records' freshness, and one that completed while
    the pass wrote (a pass longer than the delay) is written at once. Results only name archives not yet due when
    their pass planned (Archiver.archive_topic), so this never spins on one left open for another reason.
    """
    dues = [r.next_due_ms for r in results if r.next_due_ms is not None]
    return max(0.0, min(poll_s, (min(dues) - now_ms) / 1000)) if dues else poll_s


class ArchiveServiceStore(ArchiverStore, StoreConnection, Protocol):
    """The archiver's slices, and the connection the service closes when it stops."""


class ArchiveService:
    """Runs passes until stopped; owns the Spark session and the metadata store connection."""

    def __init__(
        self, settings: Settings, spark: SparkSession | None = None, store: ArchiveServiceStore | None = None,
        on_gap: GapHook | None = None, after_pass: Callable[[], None] | None = None,
        maintenance_args: Sequence[str] = (), stop_event: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or open_store(settings.metadata_url)
        self.on_gap = on_gap  # offsets the log lost before they were archived (a sink's source retention)
        self.after_pass = after_pass  # called after every pass of run_forever, failed or not (a sink's status)
        self.maintenance_args = maintenance_args  # to the maintenance rounds' `icelog maintain --due`
        self._spark = spark
        self._owns_spark = spark is None
        self._archiver: Archiver | None = None
        self._maintenance: MaintenanceScheduler | None = None
        self.stop_event = stop_event or threading.Event()  # set: run_forever returns once the pass in flight ends

    def archiver(self) -> Archiver:
        if self._archiver is None:
            if self._spark is None:
                from icelog.lake.spark import create_session

                lower_priority(self.settings.archive.nice, relative=True)
                log.info("starting Spark (master %s) for the archiver", self.settings.archive.spark_master)
                ours, started = signal.getsignal(signal.SIGINT), time.monotonic()
                self._spark = create_session(self.settings, "icelog-archiver")
                if threading.current_thread() is threading.main_thread() and ours is not None:
                    # PySpark's SparkContext takes SIGINT to cancel every job at once; the archiver's own handler
                    # (cli/archive.py: end the pass in flight, then stop) stays the process's.
                    signal.signal(signal.SIGINT, ours)
                log.info("Spark started in %.1f s", time.monotonic() - started)  # after: Ctrl-C is ours again
            self._archiver = Archiver(self.settings, self._spark, self.store, on_gap=self.on_gap)
        return self._archiver

    def maintenance(self) -> MaintenanceScheduler:
        """The automatic table maintenance: looks for due tables with the archiver's Spark session, on a thread
        of its own, and runs each round as a child process with a Spark of its own (never in a pass's way)."""
        if self._maintenance is None:
            from icelog.archive.maintenance_schedule import MaintenanceScheduler

            self._maintenance = MaintenanceScheduler(self.settings, self.archiver().spark, self.store,
                                                     round_args=self.maintenance_args)
        return self._maintenance

    def run_once(self, force: bool = True, topics: list[str] | None = None) -> list[TopicPassResult]:
        if not archived_topics_exist(self.settings, self.store):
            return []
        try:
            archiver = self.archiver()
        except IcelogError as exc:
            self.record_failure(exc)
            raise
        return archiver.run_pass(force=force, topics=topics)

    def run_forever(self, parent_pid: int | None = None) -> bool:
        """Poll for due archives every poll interval until stopped.

        A failing topic backs off on its own (Archiver keeps a schedule per topic), so the others keep
        their pace; only a pass that fails as a whole (the metadata store is unreachable) makes the
        service wait, with exponential backoff (capped). Returns False if Spark died, or if another archiver
        committed to a table (Archiver.fence: this one lost the lock); the process should exit so that `icelog
        serve` starts a new one, which stands by if the lock is held.
        """
        poll_s = self.settings.archive.poll_interval_ms / 1000
        backoff_max_s = self.settings.archive.retry_backoff_max_ms / 1000
        backoff_s = 0.0
        while not self.stop_event.is_set():
            if parent_pid is not None and os.getppid() != parent_pid:
                log.info("the broker that started the archiver is gone; stopping")
                return True
            failed = topic_failed = False
            wait_s = poll_s
            try:
                if archived_topics_exist(self.settings, self.store):
                    archiver = self.archiver()
                    results = archiver.run_pass(force=False)
                    topic_failed = any(r.error and not r.skipped for r in results)
                    wait_s = until_due_s(results, int(archiver.clock() * 1000), poll_s)  # the dues' clock
                    self.maintenance().poll()  # may start a round in a child process; never waits for one
            except IcelogError as exc:  # a dependency named in one line (the Spark master, the broker, the catalog)
                log.warning("archive pass failed (retry in %.0f s): %s", min(max(backoff_s * 2, 1.0), backoff_max_s),
                            first_line(exc))
                self.record_failure(exc)
                failed = True
            except Exception:
                log.exception("archive pass failed")
                failed = True
            if self.after_pass is not None:
                self.after_pass()
            if self._archiver is not None and self._archiver.fenced.is_set():
                log.error("another archiver commits to this store's tables: this one lost the archiver lock (its "
                          "connection to the metadata store was cut?); exiting, to stand by for it again")
                return False
            if (failed or topic_failed) and not self.spark_alive():
                log.error("the Spark driver is gone; exiting so that a new archiver starts")
                return False
            backoff_s = min(max(backoff_s * 2, 1.0), backoff_max_s) if failed else 0.0
            self.stop_event.wait(backoff_s or wait_s)
        return True

    def record_failure(self, exc: Exception) -> None:
        """A pass that failed before any topic ran: every archived topic's partitions show why (`icelog status`)."""
        message = f"{type(exc).__name__}: {first_line(exc)}"
        now_ms = int(time.time() * 1000)
        try:
            for topic in self.store.list_topics():
                config = archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)
                if config.enabled:
                    self.store.record_archive_error(topic.topic_id, range(topic.partitions), message, now_ms)
        except IcelogError as why:  # the store (or a sink's source) is away too: one line
            log.warning("could not record the archive error: %s", first_line(why))
        except Exception:
            log.exception("could not record the archive error")

    def spark_alive(self) -> bool:
        """Whether the Spark driver JVM still answers (a pass can fail because it died)."""
        if self._spark is None:
            return True
        try:
            jvm = self._spark.sparkContext._jvm
            assert jvm is not None  # (an AssertionError is a dead driver too)
            jvm.java.lang.System.currentTimeMillis()
            return True
        except Exception:
            return False

    def close(self) -> None:
        if self._maintenance is not None:
            self._maintenance.close()
        if self._archiver is not None:
            self._archiver.close()
        if self._spark is not None and self._owns_spark:
            try:
                with jvm_errors():
                    self._spark.stop()
            except Exception as exc:  # the JVM may be gone already (a signal to the whole group)
                log.info("Spark was already stopped: %s", first_line(exc))
        self.store.close()


class ArchiverProcess:
    """A child of `icelog serve` started with the broker's settings and restarted if it dies: the archiver
    (`icelog archive`), or the configured sinks (`icelog sink`)."""

    def __init__(self, settings: Settings, command: str = "archive") -> None:
        self.settings = settings
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        env = {**os.environ, SETTINGS_ENV: self.settings.model_dump_json()}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "icelog", self.command, "--parent-pid", str(os.getpid())], env=env
        )
        log.info("started `icelog %s` (pid %d)", self.command, self.proc.pid)

    def check(self) -> None:
        """Restart the child if it exited (called from the broker's upkeep loop)."""
        if self.proc is not None and self.proc.poll() is not None:
            self.restarts += 1
            log.warning("`icelog %s` exited with %s; restarting it", self.command, self.proc.returncode)
            self.start()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
