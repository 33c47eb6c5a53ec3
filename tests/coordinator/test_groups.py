"""Consumer groups with real clients: partitions shared and moved on failure, durable committed offsets."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.structs import OffsetAndMetadata

from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient

MEMBER_SCRIPT = Path(__file__).parents[1] / "support" / "group_member.py"
PARTITIONS = 6
WAIT_S = 90  # an upper bound for progress, not a performance assertion


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a short group.initial.rebalance.delay.ms, shared by this module's tests."""
    proc = BrokerProcess(
        tmp_path_factory.mktemp("groups") / "data", env={"ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "300"}
    ).start()
    yield proc
    proc.stop()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values: range, partitions: int = PARTITIONS) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for value in values:
        producer.send(topic, value=str(value).encode(), partition=value % partitions)
    producer.flush()
    producer.close()


def processed(files: list[Path]) -> list[str]:
    values = []
    for path in files:
        if path.exists():
            values.extend(
                line.split()[2] for line in path.read_text().splitlines() if not line.startswith("#")
            )
    return values


def group_caught_up(bootstrap: str, group: str, topic: str, total: int) -> bool:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    return sum(o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset > 0) == total


def describe(bootstrap: str, group: str) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_groups([group])[group]
    finally:
        admin.close()


class Members:
    def __init__(self, kind: str, bootstrap: str, topic: str, group: str, tmp_path: Path) -> None:
        self.args = [kind, bootstrap, topic, group]
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    def start(self, instance_id: str | None = None) -> subprocess.Popen[bytes]:
        out = self.tmp_path / f"member-{len(self.procs)}.txt"
        log = open(self.tmp_path / f"member-{len(self.procs)}.log", "wb")  # noqa: SIM115 (outlives this function: the child process writes to it)
        extra = [instance_id] if instance_id else []
        proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), *self.args, str(out), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        self.files.append(out)
        return proc

    def close_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("kind", ["confluent", "kafka-python", "aiokafka"])
def test_three_members_share_six_partitions_and_take_over_from_a_killed_one(
    group_broker: BrokerProcess, tmp_path: Path, kind: str
) -> None:
    bootstrap = group_broker.bootstrap
    topic, group = f"groups-share-{kind}", f"share-{kind}"
    create_topic(bootstrap, topic)
    produce(bootstrap, topic, range(0, 300))
    members = Members(kind, bootstrap, topic, group, tmp_path)
    try:
        for _ in range(3):
            members.start()
        wait_for(lambda: len(set(processed(members.files))) == 300, "the first 300 records")
        wait_for(lambda: group_caught_up(bootstrap, group, topic, 300), "commits of the first 300 records")
        wait_for(
            lambda: (
                describe(bootstrap, group)["group_state"] == "Stable"
                and len(describe(bootstrap, group)["members"]) == 3
            ),
            "a stable group of three",
        )
        assignments = describe(bootstrap, group)["members"]
        assert all(m["member_assignment"] for m in assignments), "every member owns partitions"

        members.procs[0].send_signal(signal.SIGKILL)  # no LeaveGroup: the session timeout must notice
        members.procs[0].wait()
        produce(bootstrap, topic, range(300, 600))
        wait_for(
            lambda: len(set(processed(members.files))) == 600, "records of the killed member's partitions"
        )
        wait_for(lambda: group_caught_up(bootstrap, group, topic, 600), "commits of 600 records")
        wait_for(
            lambda: len(describe(bootstrap, group)["members"]) == 2, "the group to drop the killed member"
        )

        members.procs[1].send_signal(signal.SIGTERM)  # a clean leave
        members.procs[1].wait(30)
        produce(bootstrap, topic, range(600, 900))
        wait_for(lambda: len(set(processed(members.files))) == 900, "records after a clean leave")
        wait_for(lambda: group_caught_up(bootstrap, group, topic, 900), "commits of 900 records")
    finally:
        members.close_all()

    counts = collections.Counter(processed(members.files))
    assert set(counts) == {str(v) for v in range(900)}, "every record is processed"
    assert [v for v, n in counts.items() if n > 1] == [], "no record is processed twice"
    assert processed(members.files[2:]), "the surviving member did work"


def test_static_member_rejoins_without_a_rebalance(group_broker: BrokerProcess, tmp_path: Path) -> None:
    bootstrap = group_broker.bootstrap
    topic, group = "groups-static", "static"
    create_topic(bootstrap, topic)
    members = Members("kafka-python", bootstrap, topic, group, tmp_path)
    try:
        members.start("static-a")
        members.start("static-b")
        # (kafka-python's leader assigns nothing while it has no metadata of the topic yet, then rejoins: on a busy
        # machine the group can be Stable with empty assignments for a moment)
        wait_for(
            lambda: (
                describe(bootstrap, group)["group_state"] == "Stable"
                and len(describe(bootstrap, group)["members"]) == 2
                and all(m["member_assignment"] for m in describe(bootstrap, group)["members"])
            ),
            "a stable group of two, each with its partitions",
        )
        before = {
            m["group_instance_id"]: m["member_assignment"] for m in describe(bootstrap, group)["members"]
        }
        members.procs[0].send_signal(signal.SIGKILL)
        members.procs[0].wait()
        members.start("static-a")  # back before the session timeout: same partitions
        produce(bootstrap, topic, range(60))
        wait_for(lambda: len(set(processed(members.files))) == 60, "all records")
        after = {
            m["group_instance_id"]: m["member_assignment"] for m in describe(bootstrap, group)["members"]
        }
    finally:
        members.close_all()
    assert after == before, "the returning static member keeps its partitions"
    assert processed([members.files[2]]), "the returning static member consumes its partitions"


@pytest.mark.crash
def test_committed_offsets_survive_a_broker_kill(fresh_broker: BrokerProcess) -> None:
    fresh_broker.env["ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS"] = "0"
    fresh_broker.start()
    bootstrap = fresh_broker.bootstrap
    topic, group = "durable-offsets", "durable"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, range(100), partitions=2)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
    )
    seen = 0
    while seen < 100:
        seen += sum(len(r) for r in consumer.poll(500).values())
    consumer.commit(
        {
            TopicPartition(topic, 0): OffsetAndMetadata(20, "half", -1),
            TopicPartition(topic, 1): OffsetAndMetadata(30, "", -1),
        }
    )
    consumer.close()

    fresh_broker.restart()  # SIGKILL, then start on the same data

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
        groups = {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()
    assert offsets[TopicPartition(topic, 0)].offset == 20
    assert offsets[TopicPartition(topic, 0)].metadata == "half"
    assert offsets[TopicPartition(topic, 1)].offset == 30
    assert group in groups
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, session_timeout_ms=6000
    )
    firsts: dict[int, int] = {}
    while len(firsts) < 2:
        for tp, records in consumer.poll(500).items():
            firsts.setdefault(tp.partition, records[0].offset)
    consumer.close()
    assert firsts == {0: 20, 1: 30}


# -- bad input: Kafka's error codes, spoken to over a raw connection --------------------------------
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 22, 25, 27
MEMBER_ID_REQUIRED = 79


def _join(client: RawClient, group: str, member_id: str = "", rebalance_timeout_ms: int = 10000) -> Any:
    request = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=6000,
        rebalance_timeout_ms=rebalance_timeout_ms,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[
            JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00\x00\x00\x00\x00")
        ],
    )
    return client.request(request, 5, JoinGroupResponse)


def _sync(client: RawClient, group: str, generation: int, member_id: str, assign: bool) -> Any:
    assignments = (
        [SyncGroupRequest.SyncGroupRequestAssignment(member_id=member_id, assignment=b"a")] if assign else []
    )
    request = SyncGroupRequest(
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=None,
        assignments=assignments,
    )
    return client.request(request, 3, SyncGroupResponse)


def _heartbeat(client: RawClient, group: str, generation: int, member_id: str) -> int:
    request = HeartbeatRequest(
        group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None
    )
    return int(client.request(request, 3, HeartbeatResponse).error_code)


def _commit(client: RawClient, group: str, generation: int, member_id: str, topic: str) -> int:
    request = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        retention_time_ms=-1,
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic,
                partitions=[
                    OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=5, committed_metadata=""
                    )
                ],
            )
        ],
    )
    response = client.request(request, 2, OffsetCommitResponse)
    return int(response.topics[0].partitions[0].error_code)


def test_group_protocol_errors(group_broker: BrokerProcess) -> None:
    bootstrap, group, topic = group_broker.bootstrap, "bad-input", "groups-bad-input"
    create_topic(bootstrap, topic, 1)
    first, second = RawClient(bootstrap), RawClient(bootstrap)
    required = _join(first, group)
    assert required.error_code == MEMBER_ID_REQUIRED and required.member_id
    joined = _join(first, group, required.member_id)
    assert joined.error_code == 0 and joined.leader == required.member_id
    me, generation = joined.member_id, joined.generation_id
    assert _sync(first, group, generation + 1, me, True).error_code == ILLEGAL_GENERATION
    assert _heartbeat(first, group, generation, "nobody") == UNKNOWN_MEMBER_ID
    assert _sync(first, group, generation, me, True).error_code == 0
    assert _heartbeat(first, group, generation, me) == 0
    assert _commit(first, group, generation + 7, me, topic) == ILLEGAL_GENERATION
    assert _commit(first, group, generation, "nobody", topic) == UNKNOWN_MEMBER_ID
    assert _commit(first, group, generation, me, topic) == 0

    other_id = _join(second, group).member_id  # MEMBER_ID_REQUIRED, then a join that starts a rebalance
    pool = ThreadPoolExecutor(1)
    pending = pool.submit(_join, second, group, other_id)
    wait_for(lambda: describe(bootstrap, group)["group_state"] == "PreparingRebalance", "a rebalance")
    assert _heartbeat(first, group, generation, me) == REBALANCE_IN_PROGRESS
    rejoined = _join(first, group, me)
    assert rejoined.error_code == 0 and rejoined.generation_id == generation + 1
    assert pending.result(30).error_code == 0
    pool.shutdown()

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        refused = dict(admin.delete_groups([group]))[group]
        assert "NonEmptyGroup" in str(refused)  # NON_EMPTY_GROUP
        for client, member_id in ((first, me), (second, other_id)):
            request = LeaveGroupRequest(group_id=group, member_id=member_id)
            assert client.request(request, 1, LeaveGroupResponse).error_code == 0
        wait_for(lambda: describe(bootstrap, group)["group_state"] == "Empty", "the group to empty")
        deleted = dict(admin.delete_groups([group]))[group]
        assert str(deleted) == "OK", deleted
        assert group not in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()
    first.close()
    second.close()


def test_member_that_does_not_rejoin_within_its_rebalance_timeout_is_removed(
    group_broker: BrokerProcess,
) -> None:
    """max.poll.interval.ms on the broker side: heartbeats alone do not keep a member that never rejoins."""
    bootstrap, group = group_broker.bootstrap, "slow-poller"
    slow, fresh = RawClient(bootstrap), RawClient(bootstrap)
    required = _join(slow, group, rebalance_timeout_ms=2000)
    joined = _join(slow, group, required.member_id, rebalance_timeout_ms=2000)
    assert _sync(slow, group, joined.generation_id, joined.member_id, True).error_code == 0
    newcomer = _join(fresh, group, rebalance_timeout_ms=2000).member_id
    pool = ThreadPoolExecutor(1)
    pending = pool.submit(_join, fresh, group, newcomer, 2000)
    wait_for(lambda: describe(bootstrap, group)["group_state"] == "PreparingRebalance", "a rebalance")
    while not pending.done():  # keep the session alive, but never rejoin (a consumer stuck in processing)
        assert _heartbeat(slow, group, joined.generation_id, joined.member_id) in (0, REBALANCE_IN_PROGRESS)
        time.sleep(0.3)
    result = pending.result()
    pool.shutdown()
    assert result.error_code == 0 and result.leader == newcomer
    assert [m.member_id for m in result.members] == [newcomer]
    assert _heartbeat(slow, group, joined.generation_id, joined.member_id) == UNKNOWN_MEMBER_ID
    slow.close()
    fresh.close()


def test_group_cli_lists_and_describes_with_lag_and_offsets_can_be_deleted(
    group_broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    from icelog.cli.main import main

    bootstrap, topic, group = group_broker.bootstrap, "groups-cli", "cli-group"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, range(10), partitions=2)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    consumer.commit(
        {
            TopicPartition(topic, 0): OffsetAndMetadata(2, "", -1),
            TopicPartition(topic, 1): OffsetAndMetadata(5, "", -1),
        }
    )
    consumer.close()

    assert main(["group", "--bootstrap", bootstrap, "list"]) == 0
    assert f"{group}\tEmpty" in capsys.readouterr().out
    assert main(["group", "--bootstrap", bootstrap, "describe", group]) == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:5]) for line in out.splitlines() if line.strip().startswith(topic)}
    assert rows == {(topic, "0", "2", "5", "3"), (topic, "1", "5", "5", "0")}
    assert "total lag 3" in out
    assert main(["group", "--bootstrap", bootstrap, "describe", "no-such-group"]) == 2

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_group_offsets(group, [TopicPartition(topic, 0)])
        remaining = admin.list_group_offsets(group)[group]
        admin.delete_topics([topic])
        after_delete = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    assert set(remaining) == {TopicPartition(topic, 1)}
    assert after_delete == {}, "deleting a topic drops its committed offsets"
