"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb in a temporary directory, a loopback port.

PostgreSQL refuses to run as root, so when the tests run as root the cluster is owned by and runs as the
`postgres` user (`runuser`). Nothing is skipped: a cluster that cannot start fails with PostgreSQL's reason.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

ROLE = "icelog"
PASSWORD = "icelog-test-secret"  # noqa: S105 (a throwaway cluster's password, on loopback only)


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian's layout); fails naming what to install."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run scripts/setup.sh, "
                           "or apt-get install postgresql")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresCluster:
    """One PostgreSQL server on 127.0.0.1:`port`, with role `icelog` (password login) owning its databases."""

    root: Path
    port: int = 0
    bin_dir: Path = field(default_factory=postgres_bin)
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def data_dir(self) -> Path:
        return self.root / "pg"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    def _as_owner(self, *args: str | Path) -> list[str]:
        command = [str(a) for a in args]
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def _run(self, *args: str | Path, timeout: float = 60) -> None:
        done = subprocess.run(self._as_owner(*args), capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            log = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise RuntimeError(f"{Path(str(args[0])).name} failed ({done.returncode}): {done.stderr.strip()} "
                               f"{done.stdout.strip()}\n{log}")

    def init(self) -> PostgresCluster:
        """initdb (superuser `postgres`, trust on the Unix socket only, passwords over TCP)."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "sock").mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.root / "sock", "postgres", "postgres")
        self._run(self.bin_dir / "initdb", "-D", self.data_dir, "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8")
        return self

    def start(self) -> PostgresCluster:
        """Start the server (a new port the first time) and wait until it accepts connections."""
        self.port = self.port or _free_port()
        options = f"-p {self.port} -k {self.root / 'sock'} -c listen_addresses=127.0.0.1 -c max_connections=300"
        self._run(self.bin_dir / "pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-w", "-t", "60",
                  "-o", options, "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop (`fast`: clients are disconnected, a clean shutdown)."""
        self._run(self.bin_dir / "pg_ctl", "-D", self.data_dir, "-m", mode, "-w", "stop")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the Unix socket; its output."""
        command = self._as_owner(self.bin_dir / "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                                 "-h", self.root / "sock", "-p", str(self.port), "-U", "postgres", "-d", database,
                                 "-c", sql)
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def create_role(self) -> None:
        self.psql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}' CREATEDB")

    def url(self, database: str) -> str:
        """postgresql:// URL of a database, as the role `icelog` with its password."""
        return f"postgresql://{ROLE}:{quote(PASSWORD)}@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "t") -> str:
        """A new, empty database owned by `icelog`; its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self.psql(f"CREATE DATABASE {name} OWNER {ROLE}")
        return self.url(name)

    def new_schema_url(self, database: str, prefix: str = "s") -> str:
        """A new, empty schema in `database` owned by `icelog`; the database's URL with that search_path
        (cheaper than a database: the behaviour suite takes one per test)."""
        name = f"{prefix}_{next(self._names)}"
        self.psql(f"CREATE SCHEMA {name} AUTHORIZATION {ROLE}", database)
        return f"{self.url(database)}?options=-csearch_path%3D{name}"

    def destroy(self) -> None:
        """Stop the server if it runs, then remove every file."""
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PostgresCluster:
    """A new running cluster with the role `icelog`, in a new directory under the system's temporary directory
    (pytest's own is private to root, where the `postgres` user cannot reach)."""
    root = Path(tempfile.mkdtemp(prefix="icelog-pg-"))
    if os.geteuid() == 0:
        os.chmod(root, 0o755)
    cluster = PostgresCluster(root)
    try:
        cluster.init().start()
        cluster.create_role()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL server for the session (tests take a database each: `new_database`)."""
    cluster = start_cluster()
    yield cluster
    cluster.destroy()
