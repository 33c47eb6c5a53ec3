"""Apache Kafka's Java consumer 4.1 with `group.protocol=consumer` (KIP-848) against icelog: one JVM runs
tests/java/drivers/ConsumerGroupChecks.java's checks (sharing, static members, a broker-side regex, commits), and a
second JVM is a member SIGKILLed under a librdkafka survivor. The AdminClient's describeConsumerGroups
(ConsumerGroupDescribe) decides when each stage is Stable."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.coordinator.test_consumer_groups import ENV, SESSION_TIMEOUT_MS, Fleet, every
from tests.coordinator.test_groups import create_topic
from tests.support.broker import BrokerProcess
from tests.support.java import KafkaJava

PREFIX = "java-848"


@pytest.fixture(scope="module")
def kip848_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("java-848") / "data", env=ENV).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def answers(kafka_java: KafkaJava, kip848_broker: BrokerProcess) -> dict[str, dict[str, Any]]:
    done = kafka_java.run("ConsumerGroupChecks", kip848_broker.bootstrap, PREFIX, "share", "static", "regex",
                          "commit", "mixed", "mixed-reverse", timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {answer.pop("check"): answer for answer in lines}


def test_members_share_and_move_only_what_they_must(answers: dict[str, dict[str, Any]]) -> None:
    answer = answers["share"]
    assert "error" not in answer, answer["error"]
    two, three, again = (answer[k] for k in ("two", "three", "two_again"))
    assert sorted(map(len, two.values())) == [6, 6]
    assert sorted(map(len, three.values())) == [4, 4, 4]
    assert set(three["a"]) <= set(two["a"]) and set(three["b"]) <= set(two["b"]), "only the newcomer's share moves"
    assert set(again["a"]) >= set(three["a"]) and set(again["b"]) >= set(three["b"]), "only the leaver's moves"
    assert answer["records"] == 120
    assert answer["double_owned"] == [], "a partition was handed on before its owner had given it up"


def test_static_member_comes_back_to_its_partitions(answers: dict[str, dict[str, Any]]) -> None:
    answer = answers["static"]
    assert "error" not in answer, answer["error"]
    before, after = answer["before"], answer["after"]
    assert answer["while_away"] == before["a"], "the absent static member's partitions wait for it"
    assert after == {"a": before["a"], "b-again": before["b"]}
    assert answer["double_owned"] == []


def test_broker_side_regex_takes_a_topic_created_later(answers: dict[str, dict[str, Any]]) -> None:
    answer = answers["regex"]
    assert "error" not in answer, answer["error"]
    assert answer["first"] == [f"{PREFIX}-rx-first:{p}" for p in range(2)]
    assert sorted(answer["both"]) == sorted([f"{PREFIX}-rx-first:{p}" for p in range(2)]
                                            + [f"{PREFIX}-rx-later:{p}" for p in range(3)])


def test_commit_from_a_member_and_resume(answers: dict[str, dict[str, Any]]) -> None:
    answer = answers["commit"]
    assert "error" not in answer, answer["error"]
    assert answer["resumed"] == sorted(f"v{i}" for i in range(12, 24))
    assert answer["committed"] == 1


def test_a_classic_consumer_meeting_a_kip848_group_gets_kafkas_error(answers: dict[str, dict[str, Any]]) -> None:
    answer = answers["mixed"]
    assert "error" not in answer, answer["error"]
    assert answer["classic"] == "InconsistentGroupProtocolException"
    assert answer["kip848_still_owns"] == [f"{PREFIX}-mixed:0", f"{PREFIX}-mixed:1"]


def test_a_kip848_consumer_meeting_a_classic_group_gets_kafkas_error(answers: dict[str, dict[str, Any]]) -> None:
    """The reverse: a ConsumerGroupHeartbeat into a classic group with members is GROUP_ID_NOT_FOUND (Kafka's answer
    when it may not upgrade the group online), which the Java consumer raises from poll; the classic member stays."""
    answer = answers["mixed-reverse"]
    assert "error" not in answer, answer["error"]
    assert answer["kip848"] == "GroupIdNotFoundException"
    assert answer["classic_still_owns"] == [f"{PREFIX}-mixed-rev:0", f"{PREFIX}-mixed-rev:1"]


def test_a_killed_java_members_partitions_move_after_the_session_timeout(kafka_java: KafkaJava,
                                                                          kip848_broker: BrokerProcess) -> None:
    topic, group = f"{PREFIX}-kill", f"{PREFIX}-kill"
    create_topic(kip848_broker.bootstrap, topic, 6)
    victim = subprocess.Popen(kafka_java.command("ConsumerGroupChecks", kip848_broker.bootstrap, PREFIX, "member"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    fleet = Fleet(kip848_broker.bootstrap, group)
    try:
        assert victim.stdout is not None
        while "kill:" not in victim.stdout.readline():  # the JVM's member holds the topic
            assert victim.poll() is None, "the Java member exited"
        fleet.add("survivor", [topic])
        deadline = time.monotonic() + 90
        while len(fleet.owned["survivor"]) != 3:
            assert time.monotonic() < deadline, fleet.owned
            fleet.poll()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed = time.monotonic()
        while fleet.owned["survivor"] != every(topic, 6):
            assert time.monotonic() < killed + 60, fleet.owned
            fleet.poll()
        took = time.monotonic() - killed
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        fleet.close_all()
    assert SESSION_TIMEOUT_MS / 1000 * 0.8 < took < SESSION_TIMEOUT_MS / 1000 + 20, took
    assert fleet.double_owned == []
