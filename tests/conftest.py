"""Shared fixtures: a real icelog broker process on a free port, with its own data directory; a metadata store
of every backend."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from icelog.meta.store import MetadataStore

# Session fixtures of the Spark archive tests (one broker, one Spark session): tests/archive_fixtures.py
pytest_plugins = ["archive_fixtures"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BrokerProcess:
    """`icelog serve` in a child process, so tests can SIGKILL and restart it."""

    def __init__(self, data_dir: Path, port: int | None = None, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.registry_port = free_port()  # the embedded schema registry; 8081 would clash between brokers
        self.env = env or {}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        # Test brokers keep plain Kafka retention and run no Spark archiver unless a test asks for them
        # (tests/test_archive*.py pass ICELOG_ARCHIVE__* in `env`).
        quiet = {"ICELOG_ARCHIVE__DEFAULT_KIND": "none", "ICELOG_ARCHIVE__ENABLED": "false",
                 "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{self.registry_port}"}
        env = {**os.environ, **quiet, **self.env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process keeps writing after we return
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "icelog", "serve", "--listen", self.bootstrap, "--data-dir", str(self.data_dir),
             *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
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


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by the tests that only need a working broker (use unique topic names)."""
    proc = BrokerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own, for tests that kill it or change broker settings."""
    proc = BrokerProcess(tmp_path / "data")
    yield proc
    proc.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    return f"t-{name}"[:200]


# -- the metadata store, once per backend (the behaviour suite: tests/test_meta_store*.py) ------------------
# A backend joins by one entry: a function from the test's temporary directory to a store URL; opening that
# URL twice must reach the same database. Every test that takes `store` or `open_same_store` runs per entry.
STORE_BACKENDS: dict[str, Callable[[Path], str]] = {
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'meta.db'}",
}

OpenStore = Callable[[], "MetadataStore"]


@pytest.fixture(params=sorted(STORE_BACKENDS))
def open_same_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens (or re-opens) the one database of this test; every store opened is closed afterwards."""
    from icelog.meta.backends import open_store

    url = STORE_BACKENDS[request.param](tmp_path)
    opened: list[MetadataStore] = []

    def open_() -> MetadataStore:
        opened.append(open_store(url))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()  # closing twice is allowed (a test may have closed it already)


@pytest.fixture
def store(open_same_store: OpenStore) -> MetadataStore:
    """A new, empty metadata store of the backend under test."""
    return open_same_store()
