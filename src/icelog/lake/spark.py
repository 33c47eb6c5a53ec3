"""The Spark session factory: one SparkSession with the Iceberg runtime and the icelog catalog."""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import TYPE_CHECKING

from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.lake import warehouse
from icelog.lake.catalog import catalog_jars, catalog_spark_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_threads(master: str, default: int = 4) -> int:
    """The thread count of a local[N] master (local[*]: the cores; other masters: `default`)."""
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master.strip())
    if master.strip() == "local":
        return 1
    if match is None:
        return default
    return os.cpu_count() or default if match.group(1) == "*" else max(1, int(match.group(1)))


LOOPBACK = "127.0.0.1"
MASTER_CONNECT_TIMEOUT_S = 5.0


class SparkMasterUnreachableError(IcelogError):
    """No Spark master answers at the configured address: retried with backoff."""

    retriable = True


class SparkStartError(IcelogError):
    """Spark's JVM exited as it started (no Java, or a JVM option it refuses): its own message is on stderr."""


def check_master(master: str) -> None:
    """Raise SparkMasterUnreachableError, in one line, if no master of a spark:// URL takes a TCP connection.

    Spark itself would register in the background, retry for a minute and then fail the first job with a Java
    stack trace; a connection refused or timed out is known here in at most a few seconds.
    """
    if not master.startswith("spark://"):
        return
    failures = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=MASTER_CONNECT_TIMEOUT_S):
                return
        except (OSError, ValueError) as exc:
            failures.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    raise SparkMasterUnreachableError(f"cannot reach the Spark master at spark://{'; '.join(failures)}")


def is_local_master(master: str) -> bool:
    """Whether `master` runs every executor inside the driver's JVM (local, local[N], local[*], local[N,F])."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def spark_conf(settings: Settings, app_name: str = "icelog") -> dict[str, str]:
    """Every Spark conf entry the session is built with (settings.archive.spark_conf wins)."""
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.archive.spark_master,
        "spark.jars": ",".join(str(jar) for jar in catalog_jars(settings)),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.defaultCatalog": settings.archive.catalog_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Bounded parallelism: as many shuffle partitions as the local master has threads, so a job never
        # queues more concurrent Python workers than the cores Spark was given (the rest are the broker's).
        "spark.sql.shuffle.partitions": str(local_threads(settings.archive.spark_master)),
        "spark.default.parallelism": str(local_threads(settings.archive.spark_master)),
        "spark.driver.memory": "2g",
        "spark.python.worker.reuse": "true",
        # pyspark's daemon without Spark's zips on the workers' path (~0.1 s less per task): lake/spark_daemon.py
        "spark.python.daemon.module": "icelog.lake.spark_daemon",
        # Jobs that threads of one session start together share its task slots in turn rather than in
        # submission order. (Automatic maintenance has a process and a session of its own:
        # archive/maintenance_schedule.py.)
        "spark.scheduler.mode": "FAIR",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Workers decode batches in Python: give them the driver's interpreter (and its packages).
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if is_local_master(settings.archive.spark_master):
        # Nothing but this process talks to a local master's driver: its RPC and block manager ports listen on
        # loopback, not on the machine's address (with spark.authenticate off). A cluster master's executors
        # must reach the driver, so there the addresses are Spark's (or the user's, in archive.spark_conf).
        conf["spark.driver.bindAddress"] = LOOPBACK
        conf["spark.driver.host"] = LOOPBACK
    conf.update(catalog_spark_conf(settings))
    conf.update(warehouse.spark_conf(settings))
    conf.update(settings.archive.spark_conf)
    return conf


def create_session(settings: Settings, app_name: str = "icelog") -> SparkSession:
    """Start (or join) the process's SparkSession configured for the icelog catalog."""
    from pyspark.sql import SparkSession

    check_master(settings.archive.spark_master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if is_local_master(settings.archive.spark_master):
        # The UI (off unless archive.spark_conf enables it) binds to SPARK_LOCAL_IP, else to every address.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    builder = SparkSession.builder
    for key, value in spark_conf(settings, app_name).items():
        builder = builder.config(key, value)
    from pyspark.errors import PySparkRuntimeError

    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        if exc.getErrorClass() != "JAVA_GATEWAY_EXITED":
            raise
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        raise SparkStartError(
            f"Spark's JVM ({java}) exited as it started; its own message is above: check JAVA_HOME and the JVM "
            "options in archive.spark_conf"
        ) from None
    session.sparkContext.setLogLevel("ERROR")
    return session
