"""Consumer groups on three brokers (issue 46, item 3): each group has one coordinator broker (the leader of its
coordinator shard), every broker's FindCoordinator names it, the others answer NOT_COORDINATOR; when the
coordinator is killed with -9, another broker takes the shard within the session timeout, the committed offsets are
kept, the group rebalances and goes on, and no record is processed again after a commit that covered it.

The consumers run in child processes (tests/support/failover_consumer.py): a client that crashes fails the test
with its exit status and stderr instead of taking the pytest worker down with it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.api_key import ApiKey

from icelog.client.cluster import SourceCluster
from icelog.client.properties import ClientProperties
from icelog.errors import ErrorCode
from icelog.wire import codec
from tests.support.cluster import BrokerCluster, three_brokers
from tests.support.postgres import PostgresCluster
from tests.support.seaweedfs import SeaweedFS
from tests.support.wire_client import RawClient, ask

pytestmark = pytest.mark.slow

TOPIC = "orders"
PARTITIONS = 6
CONSUMERS = 2
CONSUMER = Path(__file__).parents[1] / "support" / "failover_consumer.py"


@pytest.fixture
def cluster(postgres_cluster: PostgresCluster, tmp_path: Path) -> Iterator[BrokerCluster]:
    with three_brokers(postgres_cluster, tmp_path, env={"ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}) as brokers:
        yield brokers


@dataclass
class Ledger:
    """What the consumers did, in time order: every record processed, every commit the coordinator acknowledged."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    processed: list[tuple[float, int, int]] = field(default_factory=list)  # (when, partition, offset)
    commits: list[tuple[float, int, int]] = field(default_factory=list)  # (acknowledged when, partition, next offset)
    failed_commits: list[str] = field(default_factory=list)

    def record(self, event: dict[str, Any]) -> None:
        """One event a consumer reported (tests/support/failover_consumer.py)."""
        when = event["at"]
        with self.lock:
            self.processed += [(when, p, o) for p, o in event.get("processed", [])]
            self.commits += [(when, p, o) for p, o in event.get("committed", [])]
            if "failed_commit" in event:
                self.failed_commits.append(event["failed_commit"])

    def committed(self) -> dict[int, int]:
        with self.lock:
            out: dict[int, int] = {}
            for _, p, o in self.commits:
                out[p] = max(out.get(p, 0), o)
            return out

    def reprocessed_after_commit(self) -> list[str]:
        """Records processed after a commit covering them had been acknowledged."""
        with self.lock:
            commits, processed = sorted(self.commits), sorted(self.processed)
        bad, covered, i = [], dict.fromkeys(range(PARTITIONS), 0), 0
        for when, p, o in processed:
            while i < len(commits) and commits[i][0] < when:
                covered[commits[i][1]] = max(covered[commits[i][1]], commits[i][2])
                i += 1
            if o < covered[p]:
                bad.append(f"partition {p} offset {o} processed at {when:.3f} after a commit of {covered[p]}")
        return bad


class ConsumerProcess:
    """One member of the group in a child process (tests/support/failover_consumer.py), its events read into the
    ledger; a crash (librdkafka aborting, say) fails the test with its exit status and stderr."""

    def __init__(self, bootstrap: str, group: str, protocol: str, ledger: Ledger, stderr: Path) -> None:
        self.stderr = stderr
        self.closed = False
        with stderr.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, str(CONSUMER), bootstrap, TOPIC, group, protocol],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self.reader = threading.Thread(target=self._read, args=(ledger,), daemon=True)
        self.reader.start()

    def _read(self, ledger: Ledger) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            self.closed = self.closed or bool(event.get("closed"))
            ledger.record(event)

    def check(self) -> None:
        """Fail if the consumer ended without being asked to."""
        code = self.proc.poll()
        assert code is None, f"a consumer ended with status {code} (negative: a signal):\n{self.tail()}"

    def tail(self) -> str:
        return self.stderr.read_text(errors="replace")[-6000:]

    def close(self, timeout: float = 30) -> None:
        """Close its stdin: it closes its consumer (a clean leave) and ends."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"a consumer did not close in {timeout}s:\n{self.tail()}") from None
        self.reader.join(5)
        assert code == 0 and self.closed, f"a consumer closed with status {code}:\n{self.tail()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def produce(bootstrap: str, stop: threading.Event, acked: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked[0] += 1

    i = 0
    while not stop.is_set():
        producer.produce(TOPIC, f"r{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
        producer.poll(0)
        i += 1
        if i % 50 == 0:
            time.sleep(0.1)  # ~500 records a second
    assert producer.flush(30) == 0, "records left undelivered"


def find_coordinator(cluster: BrokerCluster, node: int, group: str) -> object:
    """FindCoordinator v3 of a group asked of one broker (`ask` cannot: its own first parameter is `key`)."""
    client = RawClient(cluster.brokers[node].bootstrap)
    try:
        request = codec.REQUEST_CLASSES[ApiKey.FindCoordinator](key=group, key_type=0)
        return client.request(request, 3, codec.RESPONSE_CLASSES[ApiKey.FindCoordinator])
    finally:
        client.close()


def group_answers(cluster: BrokerCluster, node: int, group: str) -> tuple[int, int]:
    """The error codes one broker answers a Heartbeat and an OffsetFetch of the group with (0: it serves them)."""
    beat = ask(cluster.brokers[node], ApiKey.Heartbeat, 4, group_id=group, generation_id=1, member_id="m",
               group_instance_id=None)
    fetched = ask(cluster.brokers[node], ApiKey.OffsetFetch, 7, group_id=group, topics=None, require_stable=False)
    return beat.error_code, fetched.error_code  # type: ignore[attr-defined]


def wait_for(what: str, check: object, timeout: float, consumers: Sequence[ConsumerProcess] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        for consumer in consumers:
            consumer.check()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_group_goes_on_when_its_coordinator_is_killed(cluster: BrokerCluster, protocol: str,
                                                         tmp_path: Path) -> None:
    group = f"failover-{protocol}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(timeout=20)
    cluster.wait_settled((TOPIC,))

    # Every broker names the same coordinator, at its own advertised address; the others refuse the group's APIs.
    answers = [find_coordinator(cluster, n, group) for n in range(3)]
    assert all(a.error_code == 0 for a in answers), answers  # type: ignore[attr-defined]
    nodes = {a.node_id for a in answers}  # type: ignore[attr-defined]
    assert len(nodes) == 1, answers
    (coord,) = nodes
    survivors = [n for n in range(3) if n != coord]
    assert {(a.host, a.port) for a in answers} == {("127.0.0.1", cluster.brokers[coord].port)}  # type: ignore
    for other in (n for n in range(3) if n != coord):
        assert group_answers(cluster, other, group) == (ErrorCode.NOT_COORDINATOR, ErrorCode.NOT_COORDINATOR)
    asked = ask(cluster.brokers[coord], ApiKey.OffsetFetch, 7, group_id=group, topics=None, require_stable=False)
    assert asked.error_code == 0  # type: ignore[attr-defined]

    ledger, stop_producer, acked = Ledger(), threading.Event(), [0]
    producer = threading.Thread(target=produce, args=(cluster.bootstrap, stop_producer, acked), daemon=True)
    producer.start()
    consumers = [ConsumerProcess(cluster.bootstrap, group, protocol, ledger, tmp_path / f"consumer-{i}.stderr")
                 for i in range(CONSUMERS)]
    try:
        try:
            wait_for("commits of every partition", lambda: len(ledger.committed()) == PARTITIONS, 40, consumers)
            time.sleep(2)
            admin = AdminClient({"bootstrap.servers": ",".join(cluster.brokers[n].bootstrap for n in survivors)})
            if protocol == "classic":
                described = admin.describe_consumer_groups([group])[group].result(timeout=20)
                assert described.coordinator.id == coord
            before = ledger.committed()
            cluster.brokers[coord].kill()
            killed = time.monotonic()

            # Another broker takes the shard: the survivors name it, and it serves the group's offsets.
            wait_for("a new coordinator", lambda: new_coordinator(cluster, survivors, group) is not None, 20,
                     consumers)
            took = time.monotonic() - killed
            stored = stored_offsets(cluster, survivors, group)
            assert all(stored.get(p, -1) >= o for p, o in before.items()), (before, stored)

            # The group goes on: commits acknowledged after the kill, of every partition.
            def resumed() -> bool:
                with ledger.lock:
                    return {p for when, p, _ in ledger.commits if when > killed + took} == set(range(PARTITIONS))

            wait_for("commits after the failover", resumed, 40, consumers)
        finally:
            stop_producer.set()
            producer.join(40)
        ends = high_watermarks(cluster, survivors)
        wait_for("the group to commit the end of every partition", lambda: ledger.committed() == ends, 40,
                 consumers)
        for consumer in consumers:
            consumer.close()
    finally:
        for consumer in consumers:
            consumer.kill()
    assert ledger.reprocessed_after_commit() == []
    seen: dict[int, set[int]] = {}
    for _, p, o in ledger.processed:
        seen.setdefault(p, set()).add(o)
    for p, end in ends.items():
        assert seen.get(p, set()) >= set(range(end)), f"partition {p}: records never processed"
    assert sum(ends.values()) >= acked[0]
    stored = stored_offsets(cluster, survivors, group)
    assert stored == ends, (stored, ends)


def new_coordinator(cluster: BrokerCluster, nodes: list[int], group: str) -> int | None:
    """The broker every one of `nodes` names the group's coordinator, if they agree on one of them."""
    found = [find_coordinator(cluster, n, group) for n in nodes]
    named = {f.node_id for f in found if f.error_code == 0}  # type: ignore[attr-defined]
    if len(named) != 1 or any(f.error_code for f in found) or not named <= set(nodes):  # type: ignore[attr-defined]
        return None
    return int(named.pop())


def stored_offsets(cluster: BrokerCluster, nodes: list[int], group: str) -> dict[int, int]:
    """The group's committed offsets of TOPIC, asked of the coordinator `nodes` name over the wire (not librdkafka's
    admin client: it crashes on an OffsetFetch answered NOT_COORDINATOR, librdkafka issue 5040), waiting while it
    answers COORDINATOR_LOAD_IN_PROGRESS (it loads the shard); any other error fails."""
    deadline = time.monotonic() + 20
    while True:
        node = new_coordinator(cluster, nodes, group)
        assert node is not None, "the brokers name no one coordinator"
        fetched: Any = ask(cluster.brokers[node], ApiKey.OffsetFetch, 7, group_id=group, topics=None,
                           require_stable=False)
        if fetched.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        assert fetched.error_code == ErrorCode.NONE, fetched
        return {p.partition_index: p.committed_offset for t in fetched.topics if t.name == TOPIC
                for p in t.partitions if p.committed_offset >= 0}


# librdkafka's admin client lists a group's committed offsets in a child process, retrying COORDINATOR_LOAD_IN_PROGRESS
# (which it hands to the application, not marked retriable) and what is retriable: it prints the offsets and the
# errors it retried. (Its OffsetFetch handler dereferences the consumer group an admin client does not have on
# NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE: SIGSEGV, librdkafka issue 5040.)
LIST_OFFSETS = """
import json, sys, time
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
bootstrap, group, topic = sys.argv[1:4]
admin, retried = AdminClient({"bootstrap.servers": bootstrap}), []
deadline = time.monotonic() + 60
while True:
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    try:
        listed = admin.list_consumer_group_offsets([request])[group].result(timeout=20)
        break
    except KafkaException as exc:
        loading = exc.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
        if not (loading or exc.args[0].retriable()) or time.monotonic() > deadline:
            raise
        retried.append(exc.args[0].name())
        time.sleep(0.2)
print(json.dumps({"offsets": {tp.partition: tp.offset for tp in listed.topic_partitions}, "retried": retried}))
"""


def test_the_new_coordinator_answers_load_in_progress_until_it_has_loaded_the_shard(
        postgres_cluster: PostgresCluster, tmp_path: Path) -> None:
    """Between the old coordinator's death and the new one's load of the shard, the broker every FindCoordinator names
    answers COORDINATOR_LOAD_IN_PROGRESS (Kafka's answer while a coordinator loads its partition), never
    NOT_COORDINATOR, so librdkafka's admin client retries its OffsetFetch there and gets the offsets instead of
    crashing; the other survivor answers NOT_COORDINATOR. The new coordinator holds its shard loads (`group-shard-held`)
    until the test lets them go."""
    held = tmp_path / "held"
    held.mkdir()
    release = held / "icelog-group-shard-held.release"
    release.touch()  # the start's shard loads go through
    store = SeaweedFS(tmp_path / "seaweedfs").start()
    cluster = BrokerCluster(tmp_path, store, postgres_cluster.new_database(),
                            env={"ICELOG_TEST_FAULT": "group-shard-held", "TMPDIR": str(held)})
    try:
        cluster.start()
        group, topic = "loading", "held"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)
        cluster.wait_settled((topic,))
        committer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        try:
            committer.commit(offsets=[TopicPartition(topic, 0, 42)], asynchronous=False)
        finally:
            committer.close()
        (coord,) = {find_coordinator(cluster, n, group).node_id for n in range(3)}  # type: ignore[attr-defined]
        survivors = [n for n in range(3) if n != coord]
        release.unlink()
        cluster.brokers[coord].kill()

        wait_for("the survivors to name one new coordinator",
                 lambda: new_coordinator(cluster, survivors, group) is not None, 30)
        new = new_coordinator(cluster, survivors, group)
        (other,) = (n for n in survivors if n != new)
        assert new is not None
        loading = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert group_answers(cluster, new, group) == (loading, loading)
        assert group_answers(cluster, other, group)[1] == ErrorCode.NOT_COORDINATOR

        bootstrap = ",".join(cluster.brokers[n].bootstrap for n in survivors)
        lister = subprocess.Popen([sys.executable, "-c", LIST_OFFSETS, bootstrap, group, topic],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # icelog's own client (the sink's: client/cluster.py) waits for the load likewise.
        ours: dict[str, object] = {}

        def read_ours() -> None:
            try:
                with SourceCluster(bootstrap.split(","), ClientProperties()) as source:
                    ours["offsets"] = source.committed_offsets(group, topic, [0])
            except Exception as exc:  # (reported by the assertion below)
                ours["error"] = exc

        reader = threading.Thread(target=read_ours)
        reader.start()
        time.sleep(2)  # both ask the loading coordinator meanwhile
        release.touch()
        out, err = lister.communicate(timeout=90)
        reader.join(60)
        assert ours == {"offsets": {0: 42}}, ours
        assert lister.returncode == 0, f"the admin client ended with status {lister.returncode}:\n{err[-4000:]}"
        listed = json.loads(out)
        assert listed["offsets"] == {"0": 42}, listed
        assert set(listed["retried"]) <= {"COORDINATOR_LOAD_IN_PROGRESS"}, listed
    finally:
        release.touch()
        cluster.stop()
        store.discard()  # (nothing reads it again)


def high_watermarks(cluster: BrokerCluster, nodes: list[int]) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": ",".join(cluster.brokers[n].bootstrap for n in nodes),
                         "group.id": "watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=20)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()
