"""KIP-848 consumer groups with librdkafka (`group.protocol=consumer`): members share partitions, a join or a leave
moves only what it must and never lets two members own a partition at once (judged from the consumers' own
assignment callbacks), a killed member's partitions move after the session timeout, static members come back to
their partitions, a regex subscription takes a topic created later, committed offsets survive a broker restart,
and a classic consumer meeting a KIP-848 group, or a KIP-848 consumer meeting a classic group, gets Kafka's error.
The Java consumer's view is tests/java/test_java_consumer_groups.py; the exact protocol,
tests/coordinator/test_consumer_group_protocol.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from tests.coordinator.test_consumer_group_protocol import describe
from tests.coordinator.test_groups import Members, create_topic, produce
from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient

HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS = 300, 3000
ENV = {
    "ICELOG_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_INTERVAL_MS),
    "ICELOG_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    "ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
}
WAIT_S = 60  # an upper bound for progress, not a performance assertion
TP = tuple[str, int]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("kip848") / "data", env=ENV).start()
    yield proc
    proc.stop()


class Fleet:
    """KIP-848 librdkafka consumers polled in turn by the test's thread; each one's partitions as its assignment
    callbacks say, and every partition a callback handed to one member while another still held it."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap, self.group = bootstrap, group
        self.consumers: dict[str, ck.Consumer] = {}
        self.owned: dict[str, set[TP]] = {}
        self.double_owned: list[tuple[str, TP, list[str]]] = []
        self.records: dict[str, set[tuple[str, int, int]]] = {}

    def add(self, name: str, subscription: list[str], **conf: Any) -> ck.Consumer:
        consumer = ck.Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                                "group.protocol": "consumer", "auto.offset.reset": "earliest",
                                "client.id": name, **conf})
        self.owned[name], self.records[name] = set(), set()

        def on_assign(_: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                holders = [other for other, owned in self.owned.items() if other != name and key in owned]
                if holders:
                    self.double_owned.append((name, key, holders))
                self.owned[name].add(key)

        def on_revoke(_: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
            self.owned[name] -= {(tp.topic, tp.partition) for tp in partitions}

        consumer.subscribe(subscription, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        self.consumers[name] = consumer
        return consumer

    def close(self, name: str) -> None:
        self.consumers.pop(name).close()  # a leave (epoch -1; -2 for a static member): revokes first
        self.owned.pop(name, None)

    def poll(self) -> None:
        for name, consumer in list(self.consumers.items()):
            message = consumer.poll(0.02)
            if message is not None and message.error() is None:
                self.records[name].add((message.topic(), message.partition(), message.offset()))

    def settle(self, partitions: set[TP], what: str, timeout: float = WAIT_S) -> dict[str, set[TP]]:
        """Poll until the broker calls the group Stable and the members' callbacks say they hold every partition,
        balanced (counts within one); the members' partitions then."""
        deadline = time.monotonic() + timeout
        raw = RawClient(self.bootstrap)
        try:
            while True:
                self.poll()
                counts = [len(owned) for owned in self.owned.values()]
                union = set().union(*self.owned.values())
                if union == partitions and max(counts) - min(counts) <= 1 and min(counts) > 0:
                    described = describe(raw, self.group)
                    if described.group_state == "Stable" and len(described.members) == len(self.consumers):
                        return {name: set(owned) for name, owned in self.owned.items()}
                if time.monotonic() > deadline:
                    raise AssertionError(f"gave up waiting for {what}: {self.owned}")
        finally:
            raw.close()

    def close_all(self) -> None:
        for name in list(self.consumers):
            self.close(name)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def every(topic: str, count: int) -> set[TP]:
    return {(topic, p) for p in range(count)}


def test_members_share_and_a_join_or_leave_moves_only_what_it_must(broker: BrokerProcess) -> None:
    topic = "kip848-share"
    create_topic(broker.bootstrap, topic, 12)
    produce(broker.bootstrap, topic, range(240), partitions=12)
    fleet = Fleet(broker.bootstrap, "kip848-share")
    try:
        fleet.add("a", [topic])
        fleet.add("b", [topic])
        two = fleet.settle(every(topic, 12), "two members")
        assert sorted(map(len, two.values())) == [6, 6]

        fleet.add("c", [topic])
        three = fleet.settle(every(topic, 12), "three members")
        assert sorted(map(len, three.values())) == [4, 4, 4]
        assert three["a"] <= two["a"] and three["b"] <= two["b"], "only the newcomer's share moves"

        fleet.close("c")
        back = fleet.settle(every(topic, 12), "two members again")
        assert back["a"] >= three["a"] and back["b"] >= three["b"], "only the leaver's partitions move"
        wait_for(lambda: (fleet.poll(), len(set().union(*fleet.records.values())) == 240)[1], "every record")
    finally:
        fleet.close_all()
    assert fleet.double_owned == [], "a partition was handed on before its owner had given it up"


def test_a_killed_members_partitions_move_after_its_session_timeout(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "kip848-kill", "kip848-kill"
    create_topic(broker.bootstrap, topic, 6)
    victim = Members("confluent-848", broker.bootstrap, topic, group, tmp_path)
    fleet = Fleet(broker.bootstrap, group)
    raw = RawClient(broker.bootstrap)
    try:
        victim.start()
        wait_for(lambda: len(describe(raw, group).members) == 1, "the member in its own process")
        fleet.add("survivor", [topic])
        deadline = time.monotonic() + WAIT_S
        while len(fleet.owned["survivor"]) != 3:  # the victim keeps its half
            assert time.monotonic() < deadline, fleet.owned
            fleet.poll()
        victim.procs[0].send_signal(signal.SIGKILL)  # no leave: only the session timeout can tell
        victim.procs[0].wait()
        killed = time.monotonic()
        while fleet.owned["survivor"] != every(topic, 6):
            assert time.monotonic() < killed + WAIT_S, fleet.owned
            fleet.poll()
        took = time.monotonic() - killed
    finally:
        victim.close_all()
        fleet.close_all()
        raw.close()
    assert SESSION_TIMEOUT_MS / 1000 * 0.8 < took < SESSION_TIMEOUT_MS / 1000 + 20, took
    assert fleet.double_owned == []


def test_a_static_member_restarted_keeps_its_partitions(broker: BrokerProcess) -> None:
    topic = "kip848-static"
    create_topic(broker.bootstrap, topic, 6)
    fleet = Fleet(broker.bootstrap, "kip848-static")
    try:
        fleet.add("a", [topic], **{"group.instance.id": "instance-a"})
        fleet.add("b", [topic], **{"group.instance.id": "instance-b"})
        before = fleet.settle(every(topic, 6), "two static members")
        fleet.close("b")  # a static member's close says it will come back (epoch -2): its partitions wait
        for _ in range(30):
            fleet.poll()
        assert fleet.owned["a"] == before["a"], "the other member does not take the absent one's partitions"
        fleet.add("b-again", [topic], **{"group.instance.id": "instance-b"})
        after = fleet.settle(every(topic, 6), "the static member back")
    finally:
        fleet.close_all()
    assert after == {"a": before["a"], "b-again": before["b"]}
    assert fleet.double_owned == []


def test_a_regex_subscription_takes_a_topic_created_later(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "kip848-rx-first", 2)
    fleet = Fleet(broker.bootstrap, "kip848-regex")
    raw = RawClient(broker.bootstrap)
    try:
        fleet.add("a", ["^kip848-rx-.*"])
        fleet.settle(every("kip848-rx-first", 2), "the first matching topic")
        regexes = [m.subscribed_topic_regex for m in describe(raw, "kip848-regex").members]
        create_topic(broker.bootstrap, "kip848-rx-later", 3)
        fleet.settle(every("kip848-rx-first", 2) | every("kip848-rx-later", 3), "the topic created later")
    finally:
        fleet.close_all()
        raw.close()
    assert regexes == ["(^kip848-rx-.*)"], "librdkafka hands its regexes to the broker, joined and bracketed"


@pytest.mark.crash
def test_committed_offsets_survive_a_broker_restart(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", env=ENV).start()
    topic, group = "kip848-restart", "kip848-restart"
    try:
        create_topic(proc.bootstrap, topic, 3)
        produce(proc.bootstrap, topic, range(30), partitions=3)
        fleet = Fleet(proc.bootstrap, group)
        consumer = fleet.add("a", [topic], **{"enable.auto.commit": False})
        wait_for(lambda: (fleet.poll(), len(fleet.records["a"]) == 30)[1], "every record")
        consumer.commit(offsets=[ck.TopicPartition(topic, p, 7 + p) for p in range(3)], asynchronous=False)
        fleet.close_all()
        proc.stop()
        proc.start()
        again = Fleet(proc.bootstrap, group)
        consumer = again.add("b", [topic])
        again.settle(every(topic, 3), "the member after the restart")
        committed = consumer.committed([ck.TopicPartition(topic, p) for p in range(3)], timeout=10)
        wait_for(lambda: (again.poll(), len(again.records["b"]) == 30 - 24)[1], "the records after the commits")
        again.close_all()
    finally:
        proc.stop()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 7), (1, 8), (2, 9)]
    assert sorted((p, o) for _, p, o in again.records["b"]) == [(p, o) for p in range(3) for o in range(7 + p, 10)]


def test_a_classic_consumer_meeting_a_kip848_group_gets_kafkas_error(broker: BrokerProcess) -> None:
    topic = "kip848-mixed"
    create_topic(broker.bootstrap, topic, 2)
    fleet = Fleet(broker.bootstrap, "kip848-mixed")
    classic = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kip848-mixed",
                           "group.protocol": "classic", "session.timeout.ms": 6000})
    errors: list[int] = []
    try:
        fleet.add("a", [topic])
        fleet.settle(every(topic, 2), "the KIP-848 member")
        classic.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while not errors and time.monotonic() < deadline:
            fleet.poll()
            message = classic.poll(0.1)
            if message is not None and message.error() is not None:
                errors.append(message.error().code())
        assert fleet.owned["a"] == every(topic, 2), "the KIP-848 member keeps its partitions"
    finally:
        classic.close()
        fleet.close_all()
    assert errors[:1] == [ck.KafkaError.INCONSISTENT_GROUP_PROTOCOL]


def test_a_kip848_consumer_meeting_a_classic_group_gets_kafkas_error(broker: BrokerProcess) -> None:
    """The reverse: a KIP-848 member's ConsumerGroupHeartbeat into a classic group with members is GROUP_ID_NOT_FOUND
    (Kafka's answer when it may not upgrade the group online), which librdkafka makes a fatal consumer error; the
    classic member keeps its partitions."""
    topic = "kip848-mixed-reverse"
    create_topic(broker.bootstrap, topic, 2)
    owned: set[TP] = set()
    classic = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic, "group.protocol": "classic",
                           "session.timeout.ms": 6000})
    kip848 = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic, "group.protocol": "consumer"})
    errors: list[ck.KafkaError] = []
    try:
        classic.subscribe([topic], on_assign=lambda _, parts: owned.update((p.topic, p.partition) for p in parts))
        wait_for(lambda: (classic.poll(0.1), owned == every(topic, 2))[1], "the classic member's partitions")
        kip848.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while not errors and time.monotonic() < deadline:
            classic.poll(0.1)
            message = kip848.poll(0.1)
            if message is not None and message.error() is not None:
                errors.append(message.error())
        assert owned == every(topic, 2), "the classic member keeps its partitions"
    finally:
        kip848.close()
        classic.close()
    assert [(e.code(), "The group id does not exist" in e.str()) for e in errors[:1]] == [(ck.KafkaError._FATAL, True)]


def test_group_cli_describes_a_kip848_group(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    from icelog.cli.main import main

    topic, group = "kip848-cli", "kip848-cli"
    create_topic(broker.bootstrap, topic, 2)
    fleet = Fleet(broker.bootstrap, group)
    try:
        fleet.add("cli-member", [topic])
        fleet.settle(every(topic, 2), "the member")
        assert main(["group", "--bootstrap", broker.bootstrap, "list"]) == 0
        listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
        assert [group, "Stable", "consumer", "consumer"] in listed
        assert main(["group", "--bootstrap", broker.bootstrap, "describe", group]) == 0
        out = capsys.readouterr().out
    finally:
        fleet.close_all()
    assert f"group {group}  type consumer  state Stable  assignor uniform" in out
    assert "client cli-member" in out and f"partitions {topic}:0,1" in out
