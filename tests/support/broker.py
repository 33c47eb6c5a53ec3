"""A real icelog broker process on a free port, with its own data directory (the tests' `broker` fixtures)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _PortTaken(RuntimeError):
    """The broker exited because one of its ports was taken meanwhile."""


class BrokerProcess:
    """`icelog serve` in a child process, so tests can SIGKILL and restart it."""

    def __init__(self, data_dir: Path, port: int | None = None, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None, config: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None, start_timeout: float = 60.0) -> None:
        self.data_dir = data_dir
        self.start_timeout = start_timeout  # how long `start` waits for the listener unless told
        self.preexec_fn = preexec_fn  # run in the child before icelog starts (e.g. a lower descriptor limit)
        self.config = config  # an icelog.yaml, passed as a user does: `icelog --config F serve`
        self.port = port or free_port()
        self._port_given = port is not None
        self._started_once = False
        self.registry_port = free_port()  # the embedded schema registry; 8081 would clash between brokers
        self.metrics_port = free_port()  # /metrics, /healthz, /readyz; 9644 would clash too
        self.env = env or {}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    def start(self, timeout: float | None = None) -> BrokerProcess:
        """Start `icelog serve` and wait until it listens (a start takes ~2 s of CPU: its imports; far longer on a
        machine whose two cores are busy with other tests). A broker that does not listen in time is killed.

        A free port can be taken by another process between free_port() and the broker's bind (tests and benches
        side by side): a broker that exits because an address is in use gets new ports (the registry's and the
        metrics' always, the Kafka port only before its first start) and one more try, twice at most."""
        for attempt in range(3):
            try:
                self._start(self.start_timeout if timeout is None else timeout)
                self._started_once = True
                return self
            except _PortTaken:
                if attempt == 2:
                    raise
                self.registry_port, self.metrics_port = free_port(), free_port()
                if not self._port_given and not self._started_once:
                    self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> None:
        # Test brokers keep plain Kafka retention and run no Spark archiver unless a test asks for them
        # (the Spark tests pass ICELOG_ARCHIVE__* in `env`: tests/support/archive.py ARCHIVE_ENV).
        quiet = {"ICELOG_ARCHIVE__DEFAULT_KIND": "none", "ICELOG_ARCHIVE__ENABLED": "false",
                 "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{self.registry_port}",
                 "ICELOG_METRICS_LISTEN": f"127.0.0.1:{self.metrics_port}"}
        env = {**os.environ, **quiet, **self.env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process keeps writing after we return
        config = ["--config", str(self.config)] if self.config else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "icelog", *config, "serve", "--listen", self.bootstrap, "--data-dir",
             str(self.data_dir), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=self.preexec_fn,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log()
                lines = text.strip().splitlines()
                if lines and "Address already in use" in lines[-1]:
                    raise _PortTaken(text)
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{text}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.kill()  # (no test holds it yet: it would outlive the run)
        raise RuntimeError(f"broker did not listen within {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> BrokerProcess:
        self.kill()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
