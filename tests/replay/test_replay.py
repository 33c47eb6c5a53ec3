"""`icelog replay` (issue 47 item 4): an archived topic's table produced into topics of more and fewer partitions,
as of an older snapshot, interrupted with kill -9 and run again, and refused with a clear message on bad input.

A real broker (`lake_broker`), the real Spark archiver writing the JDBC-on-SQLite catalog, `icelog replay` run as a
user runs it (a child process), and the replayed topics read over TCP with confluent-kafka and kcat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from icelog.archive.archiver import Archiver
from icelog.replay.placement import key_partition
from tests.support.broker import BrokerProcess
from tests.support.clients_util import CLIENTS, Rec, create_topic, now_ms

pytestmark = pytest.mark.slow

SOURCE_PARTITIONS = 3
KEYS = [f"key-{i}".encode() for i in range(40)] + [b"", bytes(range(256)), "ключ-ü".encode()]


@dataclass(frozen=True)
class Archived:
    """The source topic, its table and what each of its two archive passes held."""

    topic: str
    table: str
    first: list[Rec]  # the records of the first pass (snapshot `first_snapshot`)
    all: list[Rec]  # every record (the current snapshot)
    first_snapshot: int
    first_snapshot_ms: int


def records(start: int, count: int, base_ts: int) -> list[Rec]:
    """Keyed records (each key in one source partition, as a producer's partitioner keeps it), some without a key;
    unique values, headers with duplicate names and null values, explicit timestamps."""
    out = []
    for i in range(start, start + count):
        key = None if i % 9 == 0 else KEYS[i % len(KEYS)]
        partition = i % SOURCE_PARTITIONS if key is None else zlib.crc32(key) % SOURCE_PARTITIONS
        headers: tuple[tuple[str, Any], ...] = ()
        if i % 4 == 0:
            headers = (("h", f"x{i}".encode()), ("h", b""), ("null", None))
        value = None if i % 13 == 0 else f"value-{i}-".encode() * (1 + i % 3)
        out.append(Rec(partition, key, value, headers, base_ts + i * 7))
    return out


def produce(bootstrap: str, topic: str, recs: list[Rec]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for r in recs:
        producer.produce(topic, r.value, r.key, partition=r.partition, timestamp=r.timestamp,
                         headers=list(r.headers))
        producer.poll(0)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def archived(lake_broker: BrokerProcess, lake_archiver: Archiver) -> Archived:
    topic = "replay-source"
    create_topic(lake_broker.bootstrap, topic, SOURCE_PARTITIONS)
    base_ts = now_ms() - 3_600_000
    first = records(0, 1200, base_ts)
    produce(lake_broker.bootstrap, topic, first)
    assert [r.error for r in lake_archiver.run_pass(force=True, topics={topic})] == [""]
    table = load(lake_broker, f"icelog.{topic}")
    snapshot = table.current_snapshot()
    second = records(1200, 900, base_ts)
    produce(lake_broker.bootstrap, topic, second)
    assert [r.error for r in lake_archiver.run_pass(force=True, topics={topic})] == [""]
    return Archived(topic, f"icelog.{topic}", first, first + second, snapshot.snapshot_id, snapshot.timestamp_ms)


def load(broker: BrokerProcess, name: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{broker.data_dir / 'catalog.db'}",
                         warehouse=f"file://{broker.data_dir / 'warehouse'}")
    return catalog.load_table(tuple(name.split(".")))


def replay_cmd(broker: BrokerProcess, *args: str) -> list[str]:
    return [sys.executable, "-m", "icelog", "replay", "--data-dir", str(broker.data_dir), "--bootstrap",
            broker.bootstrap, *args]


def replay(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(replay_cmd(broker, *args), capture_output=True, text=True, timeout=300)


def partitions_of(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests-meta"})
    try:
        return len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    finally:
        consumer.close()


def read_all(client: str, bootstrap: str, topic: str, partitions: int, count: int) -> list[Rec]:
    """Every record of the topic (read_committed, both clients' default): confluent-kafka to the end of each
    partition, kcat (`-e`) likewise."""
    if client == "kcat":
        return CLIENTS["kcat"].consume(bootstrap, topic, list(range(partitions)), "earliest", count)
    from confluent_kafka import OFFSET_BEGINNING, KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests-read", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    out: list[Rec] = []
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"read {len(out)} records, partitions at their end: {at_end}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            out.append(Rec(msg.partition(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1],
                           msg.offset()))
    finally:
        consumer.close()
    return out


def assert_replayed(source: list[Rec], got: list[Rec], partitions: int, null_headers: bool = True) -> None:
    """Every source record once, key/value/headers/timestamp as produced, each key in its murmur2 partition and its
    records in their source order (values are unique: a value names its source record)."""
    def ident(r: Rec) -> tuple[Any, ...]:
        headers = r.headers if null_headers else tuple((k, b"NULL" if v is None else v) for k, v in r.headers)
        return (r.key, r.value, headers, r.timestamp)

    assert sorted(map(ident, got), key=repr) == sorted(map(ident, source), key=repr)
    order = {ident(r): i for i, r in enumerate(source)}  # source order: per key, the producer's order
    by_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        if r.key is not None:
            assert r.partition == key_partition(r.key, partitions), r
            by_key[r.key].append((r.partition, order[ident(r)]))
    for key, seen in by_key.items():
        assert len({p for p, _ in seen}) == 1, key
        assert [i for _, i in seen] == sorted(i for _, i in seen), f"key {key!r} out of order"
    unkeyed = defaultdict(int)
    for r in got:
        if r.key is None:
            unkeyed[r.partition] += 1
    assert len(unkeyed) == min(partitions, sum(1 for r in source if r.key is None))  # null keys spread


@pytest.mark.parametrize("partitions", [5, 2])
def test_replay_into_more_and_fewer_partitions(lake_broker: BrokerProcess, archived: Archived,
                                               partitions: int) -> None:
    topic = f"replayed-{partitions}"
    done = replay(lake_broker, "--table", archived.table, "--to-topic", topic, "--partitions", str(partitions))
    assert done.returncode == 0, done.stderr
    assert f"replayed {len(archived.all)} records of {archived.table}" in done.stdout
    assert partitions_of(lake_broker.bootstrap, topic) == partitions
    got = read_all("confluent", lake_broker.bootstrap, topic, partitions, len(archived.all))
    assert_replayed(archived.all, got, partitions)
    got = read_all("kcat", lake_broker.bootstrap, topic, partitions, len(archived.all))
    assert_replayed(archived.all, got, partitions, null_headers=False)  # kcat prints a null header value as NULL
    # Run again: the marker says it is all there.
    again = replay(lake_broker, "--table", archived.table, "--to-topic", topic)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert len(read_all("confluent", lake_broker.bootstrap, topic, partitions, 0)) == len(archived.all)


def test_keys_go_where_the_java_partitioner_puts_them(lake_broker: BrokerProcess, topic_name: str) -> None:
    """murmur2 as Kafka's Utils.murmur2 (published vectors of the Java client's UtilsTest), and placed as librdkafka's
    murmur2 partitioner (the Java client's placement) places the same keys."""
    from kafka.partitioner.default import murmur2

    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8":
               -58897971, b"abc": 479470107}
    for data, expected in vectors.items():
        assert murmur2(data) - (1 << 32 if murmur2(data) >= 1 << 31 else 0) == expected
    create_topic(lake_broker.bootstrap, topic_name, 7)
    placed: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap, "partitioner": "murmur2"})
    for key in KEYS:
        producer.produce(topic_name, b"v", key, on_delivery=lambda err, msg: placed.__setitem__(msg.key(),
                                                                                                 msg.partition()))
    assert producer.flush(30) == 0
    assert placed == {key: key_partition(key, 7) for key in KEYS}


JAVA_PLACEMENT = """
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import java.util.HexFormat;

public class Placement {
    public static void main(String[] args) {
        int partitions = Integer.parseInt(args[0]);
        for (int i = 1; i < args.length; i++) {
            byte[] key = HexFormat.of().parseHex(args[i]);
            System.out.println(args[i] + " " + BuiltInPartitioner.partitionForKey(key, partitions));
        }
    }
}
"""


@pytest.mark.java
@pytest.mark.parametrize("partitions", [2, 5, 7, 12])
def test_placement_is_the_java_clients(partitions: int, tmp_path: Path) -> None:
    """The Java producer's own placement (kafka-clients 4.1.1's BuiltInPartitioner.partitionForKey, what its
    default partitioner calls for a keyed record) of every test key and 200 random ones, run in a JVM."""
    import random

    from tests.support.java import JVM_OPTIONS, _tool, kafka_jars_dir

    keys = [*KEYS, *(random.Random(partitions).randbytes(random.Random(i).randrange(1, 40)) for i in range(200))]
    source = tmp_path / "Placement.java"
    source.write_text(JAVA_PLACEMENT)
    done = subprocess.run([_tool("java"), *JVM_OPTIONS, "-cp", f"{kafka_jars_dir()}/*", str(source), str(partitions),
                           *(k.hex() for k in keys)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    java = {bytes.fromhex(line.split(" ")[0]): int(line.split(" ")[1]) for line in done.stdout.splitlines()}
    assert java == {key: key_partition(key, partitions) for key in keys}


def test_replay_as_of_an_older_snapshot(lake_broker: BrokerProcess, archived: Archived) -> None:
    by_id = replay(lake_broker, "--table", archived.table, "--to-topic", "replayed-snapshot",
                   "--snapshot", str(archived.first_snapshot))
    assert by_id.returncode == 0, by_id.stderr
    got = read_all("confluent", lake_broker.bootstrap, "replayed-snapshot", SOURCE_PARTITIONS, len(archived.all))
    assert_replayed(archived.first, got, SOURCE_PARTITIONS)
    # The snapshot current at a time: the first one until the second commit.
    as_of = replay(lake_broker, "--table", archived.table, "--to-topic", "replayed-as-of", "--partitions", "4",
                   "--as-of", str(archived.first_snapshot_ms))
    assert as_of.returncode == 0, as_of.stderr
    assert f"(snapshot {archived.first_snapshot})" in as_of.stdout
    got = read_all("confluent", lake_broker.bootstrap, "replayed-as-of", 4, len(archived.all))
    assert_replayed(archived.first, got, 4)


def committed(bootstrap: str, topic: str, partitions: int) -> int:
    """Records the replay's progress marker counts as committed in `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"icelog-replay.{topic}"})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def test_replay_killed_and_run_again(lake_broker: BrokerProcess, archived: Archived, tmp_path: Path) -> None:
    """kill -9 with a transaction half produced after one was committed (the `replay-held` hook holds the replay
    there), then in a transaction whose records were all delivered (`replay-in-transaction`): the run after them
    leaves every record once."""
    topic, partitions = "replayed-killed", 4
    args = ("--table", archived.table, "--to-topic", topic, "--partitions", str(partitions),
            "--transaction-records", "150")
    log = tmp_path / "replay.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(replay_cmd(lake_broker, *args), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "ICELOG_TEST_FAULT": "replay-held"})
    try:
        deadline = time.monotonic() + 120
        while b"holding at replay-held" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, f"the replay never held: {log.read_text()}"
            time.sleep(0.1)
        time.sleep(0.5)  # the half transaction's records reach the broker
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    first = committed(lake_broker.bootstrap, topic, partitions)
    assert first == 150  # the first transaction
    crash = subprocess.run(replay_cmd(lake_broker, *args), capture_output=True, text=True, timeout=300,
                           env={**os.environ, "ICELOG_TEST_FAULT": "replay-in-transaction"})
    assert crash.returncode == 137, crash.stderr
    rerun = replay(lake_broker, *args)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming the replay" in rerun.stdout
    produced = int(rerun.stdout.rsplit("; ", 1)[1].split()[0])
    assert produced == len(archived.all) - first  # the run killed in its first transaction committed nothing
    got = read_all("confluent", lake_broker.bootstrap, topic, partitions, len(archived.all))
    assert_replayed(archived.all, got, partitions)
    got = read_all("kcat", lake_broker.bootstrap, topic, partitions, len(archived.all))
    assert_replayed(archived.all, got, partitions, null_headers=False)


def test_bad_input_is_one_line_with_the_fix(lake_broker: BrokerProcess, archived: Archived) -> None:
    unknown = replay(lake_broker, "--table", "icelog.no-such-table", "--to-topic", "x")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("icelog: no table icelog.no-such-table in the catalog (tables: ")
    assert "Traceback" not in unknown.stderr
    both = replay(lake_broker, "--table", archived.table, "--to-topic", "x", "--snapshot", "1", "--as-of", "2")
    assert both.returncode == 2
    assert both.stderr == "icelog: --snapshot and --as-of both name a snapshot: pass one of them\n"
    create_topic(lake_broker.bootstrap, "replay-existing", 2)
    exists = replay(lake_broker, "--table", archived.table, "--to-topic", "replay-existing", "--partitions", "6")
    assert exists.returncode == 2
    assert exists.stderr == ("icelog: topic replay-existing exists with 2 partitions, not the 6 asked: drop "
                             "--partitions to replay into its 2, delete the topic first, or replay into a new "
                             "topic\n")
    no_snapshot = replay(lake_broker, "--table", archived.table, "--to-topic", "x", "--snapshot", "12345")
    assert no_snapshot.returncode == 2
    assert no_snapshot.stderr.startswith(f"icelog: table {archived.table} has no snapshot 12345; list them with ")


def test_replay_into_another_cluster_over_sasl_ssl(lake_broker: BrokerProcess, archived: Archived,
                                                   tmp_path: Path) -> None:
    """The table of one broker's catalog replayed into another broker that takes only SASL_SSL with SCRAM: the
    client settings go as --client-property (librdkafka's names), and a wrong password is one line."""
    from tests.support.security import start_secure_broker

    user, password = "replayer", "replay-secret"
    secure = start_secure_broker(tmp_path, ("SASL_SSL",), env={"ICELOG_SUPER_USERS": f"User:{user}"},
                                 users={user: password})
    try:
        client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                  "ssl.ca.location": str(secure.pki.ca_pem)}
        properties = [a for k, v in client.items() for a in ("--client-property", f"{k}={v}")]
        base = [sys.executable, "-m", "icelog", "replay", "--data-dir", str(lake_broker.data_dir), "--bootstrap",
                secure.bootstrap("SASL_SSL"), "--table", archived.table, "--to-topic", "restored", *properties]
        wrong = subprocess.run([*base, "--client-property", "sasl.password=wrong-password"], capture_output=True,
                               text=True, timeout=120)
        assert wrong.returncode == 2, wrong.stderr
        assert wrong.stderr.startswith(f"icelog: cannot log in to {secure.bootstrap('SASL_SSL')}: "), wrong.stderr
        assert wrong.stderr.count("\n") == 1 and "wrong-password" not in wrong.stderr, wrong.stderr
        done = subprocess.run([*base, "--client-property", f"sasl.password={password}"], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        conf = {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **client, "sasl.password": password}
        consumer = Consumer({**conf, "group.id": "tests-read", "enable.auto.commit": False})
        try:
            got: list[Rec] = []
            consumer.assign([TopicPartition("restored", p, 0) for p in range(SOURCE_PARTITIONS)])
            deadline = time.monotonic() + 60
            while len(got) < len(archived.all) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(Rec(msg.partition(), msg.key(), msg.value(), tuple(msg.headers() or ()),
                                   msg.timestamp()[1], msg.offset()))
        finally:
            consumer.close()
        assert_replayed(archived.all, got, SOURCE_PARTITIONS)
    finally:
        secure.broker.stop()
