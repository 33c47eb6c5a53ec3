"""Shorter Spark driver starts for the suite's child processes: the JIT's first tier, and a class-data archive.

The Spark drivers the tests start in child processes (`icelog archive --once`, `icelog maintain`, a broker's
archiver, `icelog sink`) live for seconds and work on little data, and there are dozens of them: their start-up
is most of the suite's time. These JVM options shorten it, and no test's outcome depends on any:
  - `-XX:TieredStopAtLevel=1`: the JIT's first tier only (C2's compiler threads compete for the two cores;
    30 s → 15 s measured on a busy machine);
  - `-XX:+UseSerialGC`: one collector thread, no concurrent ones, for a heap that holds little (a pass over 300
    records: 9.2 → 8.3 CPU-seconds, alternated runs here);
  - AppCDS (`-XX:SharedArchiveFile`): the classes a driver loads (Spark, Hadoop, Iceberg's Spark runtime),
    parsed and verified once and mapped from a file by every later JVM (a first `icelog archive --once` pass
    measured 17-20 s → 12 s here). The archive is dumped once per Java, pyspark and jar set, by one real
    `icelog archive --once` at the session's start (~50 s), and kept in the temp directory for later runs.
tests/conftest.py puts them in ICELOG_ARCHIVE__SPARK_CONF (unless the user set it); the test process's own
long-lived session (lake_spark) takes the JIT option only (its classpath differs: the archive would not map), as
do the Spark standalone cluster's executors and daemons (tests/support/spark_cluster.py). Users' archivers keep
the default JVM.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JIT_OPTION = "-XX:TieredStopAtLevel=1"
GC_OPTION = "-XX:+UseSerialGC"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
# A dumped archive smaller than this is taken for a failed dump (a truncated archive crashes the JVM that maps it).
_LEAST_ARCHIVE_BYTES = 10 * 1024 * 1024
_DUMP_TIMEOUT_S = 600


def driver_conf(class_archive: Path | None = None) -> dict[str, str]:
    """The Spark conf of the children's drivers: the first JIT tier, the serial collector, and the class archive if
    there is one."""
    options = [JIT_OPTION, GC_OPTION]
    if class_archive is not None:
        # (-Xlog: a JVM that cannot use the archive runs without it, silently, as the default archive does)
        options += [f"-XX:SharedArchiveFile={class_archive}", "-Xlog:cds=off,cds+dynamic=off"]
    return {DRIVER_OPTIONS: " ".join(options)}


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return str(Path(found).resolve()) if found else ""


def _archive_key() -> str:
    """What an archive is valid for: the JVM, pyspark's jars (the driver's classpath) and Iceberg's runtime."""
    import pyspark

    from icelog.lake.catalog import iceberg_runtime_jar

    java = _java()
    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr if java else ""
    jars = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar")) + [iceberg_runtime_jar()]
    facts = [java, version, pyspark.__version__, JIT_OPTION, sys.executable]
    facts += [f"{jar}:{jar.stat().st_size}" for jar in jars if jar.exists()]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]


def _jvms_writing(path: Path) -> bool:
    """Whether a process still has `path` on its command line (the dumping JVM outlives its Python parent)."""
    needle = str(path).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def _archive_pass(data_dir: Path, conf: dict[str, str], log: Path) -> bool:
    """One `icelog archive --once` over `data_dir` with `conf` as the driver's Spark conf: whether it passed."""
    env = {**os.environ, "ICELOG_ARCHIVE__SPARK_CONF": json.dumps(conf)}
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(data_dir)],
                              stdout=out, stderr=subprocess.STDOUT, env=env, cwd=data_dir.parent,
                              timeout=_DUMP_TIMEOUT_S)
    return done.returncode == 0 and b"fatal error" not in log.read_bytes()


def class_archive(cache_dir: Path | None = None) -> Path | None:
    """The class archive of this machine's driver JVM, dumped first if needed; None if it cannot be made here.

    The dump runs a real `icelog archive --once` over a small topic (so the classes of the archive path are in
    it), waits for the JVM to finish writing at its exit, then checks the archive with a second pass that maps
    it before the archive gets its final name: a failed dump never reaches a test.
    """
    cache = cache_dir or Path(tempfile.gettempdir()) / "icelog-tests-jvm"
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"classes-{_archive_key()}.jsa"
    if final.exists():
        return final
    # Both xdist workers have a Spark lane: one dumps, the other waits for its archive rather than dumping its own.
    with open(cache / "dump.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return final if final.exists() else _dump(cache, final)


def _dump(cache: Path, final: Path) -> Path | None:
    from tests.support.archive import create_topic, produce
    from tests.support.broker import BrokerProcess

    work = Path(tempfile.mkdtemp(prefix="dump-", dir=cache))  # beside `final`: the rename below stays atomic
    dumped = work / "classes.jsa"
    log = work / "dump.log"
    try:
        broker = BrokerProcess(work / "data", env={"ICELOG_ARCHIVE__ENABLED": "false",
                                                   "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg"}).start()
        try:
            create_topic(broker, "warm", partitions=2)
            produce(broker, "warm", 200, partitions=2)  # every codec: their decoders' classes go in the archive too
        finally:
            broker.stop()
        dump_conf = driver_conf()
        dump_conf[DRIVER_OPTIONS] += f" -XX:ArchiveClassesAtExit={dumped} -Xlog:cds=off,cds+dynamic=off"
        if not _archive_pass(work / "data", dump_conf, log):
            return None
        deadline = time.monotonic() + _DUMP_TIMEOUT_S
        while _jvms_writing(dumped) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _jvms_writing(dumped) or not dumped.exists() or dumped.stat().st_size < _LEAST_ARCHIVE_BYTES:
            return None
        if not _archive_pass(work / "data", driver_conf(dumped), log):  # maps it: a bad archive fails here
            return None
        os.replace(dumped, final)
        for stale in cache.glob("classes-*.jsa"):  # an older Java, pyspark or jar set's (150 MB each)
            if stale != final:
                stale.unlink(missing_ok=True)
        return final
    except Exception:  # noqa: BLE001 - whatever failed (broker, client, dump), the tests run without the archive
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
