"""Helpers of the Spark tests (archive, table, lake, readback); their fixtures (lake_*) are in tests/conftest.py.

A real broker, confluent-kafka producers, a real Spark session and a real Iceberg JDBC catalog on SQLite.
One broker and one Spark session serve every archive test (Spark start-up is ~5 s); each test uses its
own topics, so its own tables. Fault tests run `icelog archive` in a child process so that it can die
at a chosen stage, then reconcile with the in-process session.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.config import Settings
from icelog.faults import FAULT_ENV
from tests.support.broker import BrokerProcess

ARCHIVE_ENV = {
    "ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
    "ICELOG_ARCHIVE__ENABLED": "false",
    "ICELOG_RETENTION_CHECK_INTERVAL_MS": "200",
}
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def create_topic(
    broker: BrokerProcess, name: str, partitions: int = 3, configs: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, config=configs or {})])[name].result(30)


def produce(broker: BrokerProcess, topic: str, count: int, partitions: int = 3, tag: str = "") -> list[Row]:
    """`count` records spread over the codecs and partitions, with keys, headers, null keys and values."""
    delivered: list[Row] = []
    errors: list[Any] = []

    def on_delivery(sent_headers: tuple[tuple[str, bytes | None], ...], err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
            return
        # (Delivery reports carry no headers: compare with what was sent.)
        delivered.append(
            (msg.partition(), msg.offset(), msg.key(), msg.value(), sent_headers, msg.timestamp()[1] * 1000)
        )

    per_codec = -(-count // len(CODECS))
    made = 0
    for codec in CODECS:
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20}
        )
        for _ in range(min(per_codec, count - made)):
            i = made
            key = None if i % 7 == 0 else f"key-{tag}{i}".encode()
            value = None if i % 11 == 0 else (f"value-{tag}{i}-" + codec).encode() * (1 + i % 5)
            headers = [("h1", f"x{i}".encode()), ("empty", None)] if i % 4 == 0 else None
            producer.produce(
                topic,
                key=key,
                value=value,
                partition=i % partitions,
                headers=headers,
                on_delivery=functools.partial(on_delivery, tuple(headers or ())),
            )
            made += 1
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
    assert not errors, errors
    assert len(delivered) == count
    return sorted(delivered, key=lambda r: (r[0], r[1]))


def committed_aborted_open(bootstrap: str, topic: str, tx_prefix: str, tags: tuple[str, str] = ("c", "a")) -> Producer:
    """On partition 0 of `topic`: a committed transaction of 5 records (`<tags[0]>-<i>`), an aborted one of 5
    (`<tags[1]>-<i>`), an open one holding `open-0`, then a plain `after-open` above the last stable offset.
    Returns the open transaction's producer (the test commits or aborts it)."""

    def txn_producer(txn_id: str) -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
        producer.init_transactions(30)
        return producer

    committer, aborter, pending = (txn_producer(f"{tx_prefix}-{kind}") for kind in ("commit", "abort", "open"))
    for producer, tag in ((committer, tags[0]), (aborter, tags[1])):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=f"{tag}-{i}".encode(), partition=0)
        producer.flush(30)
    committer.commit_transaction(30)
    aborter.abort_transaction(30)
    pending.begin_transaction()
    pending.produce(topic, value=b"open-0", partition=0)
    pending.flush(30)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, value=b"after-open", partition=0)  # above the last stable offset: must wait
    plain.flush(30)
    return pending


def table(topic: str) -> str:
    return f"icelog.`{topic}`"


def spark_rows(spark: Any, topic: str) -> list[dict[str, Any]]:
    rows = spark.sql(
        "SELECT key IS NULL AS key_null, key.__raw__ AS k, value.__raw__ AS v, headers, "
        "kafka.partition AS p, kafka.offset AS o, unix_micros(kafka.event_timestamp) AS ev, "
        "unix_micros(kafka.ingest_timestamp) AS ing, "
        f"kafka.batch_start AS bs FROM {table(topic)} ORDER BY p, o"
    ).collect()
    return [r.asDict(recursive=True) for r in rows]


def as_produced(rows: list[dict[str, Any]]) -> list[Row]:
    def b(x: Any) -> bytes | None:
        return None if x is None else bytes(x)

    return [
        (
            r["p"],
            r["o"],
            b(r["k"]),
            b(r["v"]),
            tuple((h["key"], b(h["value"])) for h in r["headers"]),
            r["ev"],
        )
        for r in rows
    ]


def check_offsets_contiguous(rows: list[dict[str, Any]], expected: dict[int, int]) -> None:
    """Exactly offsets 0..n-1 of each partition, once each: no duplicate, no gap."""
    by_partition: dict[int, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r["p"], []).append(r["o"])
    assert {p: sorted(o) for p, o in by_partition.items()} == {
        p: list(range(n)) for p, n in expected.items() if n
    }


def run_archive_cli(
    settings: Settings, topic: str, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    # The broker's address too: with ICELOG_ARCHIVE__READ_VIA=kafka the tasks fetch from its listener.
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_REGISTRY_LISTEN": settings.registry_listen,
           "ICELOG_LISTEN": settings.listen}
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "icelog",
            "archive",
            "--once",
            "--data-dir",
            str(settings.data_dir),
            "--topic",
            topic,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


class ArchiveChild:
    """A continuous `icelog archive` (or `icelog sink`: `command`) in a child process of its own session (so that a
    kill takes its Spark JVM and Python workers with it, as a machine's death would), its output in `log_path`."""

    def __init__(self, log_path: Path, env: dict[str, str], *args: str, fault: str | None = None,
                 command: str = "archive") -> None:
        self.log_path = log_path
        full_env = {**os.environ, **env, **({FAULT_ENV: fault} if fault else {})}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "icelog", command, *args], stdout=log,
                                         stderr=subprocess.STDOUT, env=full_env, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.log()[-5000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{self.log()[-5000:]}"
            time.sleep(0.05)

    def exits_within(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.log()[-5000:]}") from None

    def kill_all(self) -> None:
        """SIGKILL to the archiver and everything it started (its JVM, Spark's Python workers)."""
        with contextlib.suppress(ProcessLookupError):  # (its group outlives it while its JVM runs)
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait()


def partition_counts(rows: list[Row]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in rows:
        counts[r[0]] = counts.get(r[0], 0) + 1
    return counts


def duckdb_counts(metadata_location: str, s3: dict[str, str] | None = None) -> list[tuple[int, int]]:
    """Rows per partition of the table, read by DuckDB's iceberg extension from its metadata file (on a bucket:
    through httpfs, with an S3 secret made of `s3`, the AWS_* settings of tests.support.seaweedfs)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    modules = [(duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")]
    if s3 is not None:
        modules.append((duckdb_extension_httpfs, "httpfs"))
    for module, name in modules:
        [path] = Path(module.__file__).parent.glob(f"extensions/*/{name}.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    if s3 is not None:
        endpoint = s3["AWS_ENDPOINT_URL"].split("://", 1)
        con.execute(
            f"CREATE SECRET (TYPE s3, KEY_ID '{s3['AWS_ACCESS_KEY_ID']}', SECRET '{s3['AWS_SECRET_ACCESS_KEY']}', "
            f"REGION '{s3['AWS_REGION']}', ENDPOINT '{endpoint[1]}', URL_STYLE 'path', "
            f"USE_SSL {str(endpoint[0] == 'https').lower()})")
    query = f"SELECT kafka.partition, count(*) FROM iceberg_scan('{metadata_location}') GROUP BY 1 ORDER BY 1"
    return [(int(p), int(n)) for p, n in con.execute(query).fetchall()]


def wait_for(condition: Any, timeout: float = 60, what: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s" + (f":\n{what()}" if what else ""))
        time.sleep(0.1)
