"""A Spark standalone cluster for tests: a master and one worker started from pyspark's own `spark-class`.

The worker runs in a mount namespace of its own (`unshare --mount --propagation private`) where each directory
of `hidden` is covered by an empty read-only tmpfs: its executors and their Python workers cannot open a file
of the broker's data dir, so a task that reads the intake by path fails the test (docs: DESIGN.md, round 3).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.support.broker import free_port
from tests.support.jvm import JIT_OPTION

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0


def _env() -> dict[str, str]:
    """The daemons' environment: loopback addresses, and this interpreter (and PYTHONPATH) for Python workers."""
    return {**os.environ, "SPARK_LOCAL_IP": LOOPBACK, "PYSPARK_PYTHON": sys.executable,
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.appDataTtl=600",
            # The master and the worker only start executors and pass messages: the JIT's first tier (the C2
            # compiler's threads would compete for the two cores with the tests' processes).
            "SPARK_DAEMON_JAVA_OPTS": JIT_OPTION}


def _wait_port(port: int, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT_S} s: {log.read_text()[-3000:]}")


def _wait_registered(log: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if "Successfully registered with master" in log.read_text():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark worker exited with {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"the Spark worker did not register: {log.read_text()[-3000:]}")


@dataclass
class SparkCluster:
    """A running master and worker; `master_url` is what `archive.spark_master` takes."""

    root: Path
    cores: int
    master_port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    def start(self, hidden: Sequence[Path] = ()) -> SparkCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master_port = free_port()
        master_log = self.root / "master.log"
        master = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
             "--port", str(self.master_port), "--webui-port", str(free_port())],
            stdout=master_log.open("wb"), stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        self.processes.append(master)
        _wait_port(self.master_port, "the Spark master", master, master_log)
        work = self.root / "work"
        work.mkdir(exist_ok=True)
        worker = [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", LOOPBACK,
                  "--cores", str(self.cores), "--memory", "2g", "--work-dir", str(work),
                  "--webui-port", str(free_port())]
        mounts = " && ".join(f"mount -t tmpfs -o ro,size=4k tmpfs {shlex.quote(str(d))}" for d in hidden)
        script = f"{mounts + ' && ' if mounts else ''}exec {shlex.join(worker)}"
        worker_log = self.root / "worker.log"
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script],
                                stdout=worker_log.open("wb"), stderr=subprocess.STDOUT, env=_env(),
                                start_new_session=True)
        self.processes.append(proc)
        _wait_registered(worker_log, proc)
        return self

    def stop(self) -> None:
        """Stop the worker (and its executors: one process group each), then the master."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait(10)
        self.processes.clear()
