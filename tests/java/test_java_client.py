"""Apache Kafka's Java client (kafka-clients 4.1) against icelog: one JVM runs every check of
tests/java/drivers/ClientChecks.java (a JVM start costs seconds on a busy machine), and each test judges one part of
what the client saw: records, offsets, transactions, groups, timestamps, and the AdminClient's answers.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients_util import assert_codec_used
from tests.support.java import KafkaJava
from tests.support.metrics import scrape_text, value

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PREFIX = "java-client"


@pytest.fixture(scope="module")
def answers(kafka_java: KafkaJava, broker: BrokerProcess) -> dict[str, dict[str, Any]]:
    checks = [f"produce:{codec}" for codec in CODECS] + ["transactions", "group", "times", "epochs", "admin"]
    before = validations(broker)
    answers = kafka_java.checks(broker.bootstrap, PREFIX, *checks)
    answers["epochs"]["validations"] = validations(broker) - before
    return answers


def validations(broker: BrokerProcess) -> float:
    """OffsetForLeaderEpoch requests the broker has served (a worker's tests run one at a time on its broker)."""
    return value(scrape_text(broker.metrics_url), "icelog_requests_total", api="OffsetForLeaderEpoch")


@pytest.mark.parametrize("codec", CODECS)
def test_idempotent_acks_all_producer_every_codec(answers: dict[str, dict[str, Any]], broker: BrokerProcess,
                                                  codec: str) -> None:
    """60 records over 2 partitions: acked at consecutive offsets, read back by assignment field for field."""
    answer = answers[f"produce:{codec}"]
    assert "error" not in answer, answer["error"]
    expected_acks = [[i % 2, i // 2] for i in range(60)]
    assert answer["acked"] == expected_acks
    received = sorted((p, o, k, v, h) for p, o, k, v, h, _ts in answer["received"])
    assert received == sorted((i % 2, i // 2, f"k{i}", f"v{i}", str(i)) for i in range(60))
    assert_codec_used(broker.bootstrap, f"{PREFIX}-{codec}", [0, 1], codec)


def test_transactions_and_isolation_levels(answers: dict[str, dict[str, Any]]) -> None:
    """Commit, abort, commit: read_committed gets the committed records only, read_uncommitted all of them."""
    answer = answers["transactions"]
    assert "error" not in answer, answer["error"]
    committed = [f"commit{t}-{i}" for t in (0, 2) for i in range(5)]
    assert answer["read_committed"] == committed
    assert answer["read_uncommitted"] == committed[:5] + [f"abort1-{i}" for i in range(5)] + committed[5:]
    # 15 records and 3 markers; nothing is open, so the last stable offset is the end for both isolation levels.
    assert answer["read_committed_end"] == answer["read_uncommitted_end"] == 18


def test_classic_group_resumes_at_committed_offsets(answers: dict[str, dict[str, Any]]) -> None:
    """A member reads and commits; a second member of the group gets only what came after the commit, once."""
    answer = answers["group"]
    assert "error" not in answer, answer["error"]
    assert answer["first"] == ["first"] * 30
    assert answer["second"] == ["second"] * 10
    assert answer["committed_total"] == 40


def test_offsets_for_times_and_seek(answers: dict[str, dict[str, Any]]) -> None:
    """The first record at or after a timestamp (base + 2.5 s is the record at base + 3 s), and none past the end."""
    answer = answers["times"]
    assert "error" not in answer, answer["error"]
    assert (answer["offset"], answer["timestamp_delta"], answer["first_key"]) == (3, 3000, "k3")
    assert answer["past_the_end"] is None


def test_leader_epochs_seek_validated_then_consumed(answers: dict[str, dict[str, Any]]) -> None:
    """ListOffsets gives epoch 0, the epoch Metadata reports; a seek with it is validated with OffsetForLeaderEpoch
    (the Java consumer sends it only when Metadata gives an epoch) and the consumer reads on from the seek."""
    answer = answers["epochs"]
    assert "error" not in answer, answer["error"]
    assert answer["times_leader_epoch"] == 0
    assert answer["validations"] >= 1
    assert answer["keys"] == [f"k{i}" for i in range(4, 15)]
    assert answer["position"] == 15


def test_admin_client_calls(answers: dict[str, dict[str, Any]], broker: BrokerProcess) -> None:
    """Every AdminClient call the tools make: served ones answer, unserved ones raise what Kafka's client raises
    for an API the broker does not advertise (UnsupportedVersionException, before any request is sent)."""
    answer = answers["admin"]
    assert "error" not in answer, answer["error"]
    served = {name: result.get("ok") for name, result in answer.items() if "ok" in result}
    assert served["createTopics"] == "ok"
    assert served["describeCluster"]["nodes"] == [f"0@{broker.bootstrap}"]
    assert served["describeCluster"]["controller"] == 0
    assert served["listTopics"] is True
    assert served["describeTopics"] == {"partitions": [[0, 0, 1, 1], [1, 0, 1, 1]], "internal": False}
    assert served["describeTopicsPaged"] == {"a": [0, 1], "b": [0, 1, 2]}  # DescribeTopicPartitions' cursor
    assert served["incrementalAlterConfigs"] == "ok"
    assert served["describeConfigs"] == "3600000"
    assert served["createPartitions"] == 3
    assert served["listGroups"] is True
    assert served["deleteTopics"] == "ok"
    assert served["listOffsets"] == {"earliest": 0, "latest": 10, "maxTimestamp": 9}  # ListOffsets v7
    assert served["listTransactions"] >= 0
    assert served["describeProducers"] == 1  # the idempotent producer of the 10 records
    assert served["deleteRecords"] == 4  # DeleteRecords: the new low watermark
    # One log dir, the intake: the partition's 10 records are some hundreds of bytes of it.
    assert served["describeLogDirs"]["dirs"] == 1 and served["describeLogDirs"]["usable"] is True
    assert 100 < served["describeLogDirs"]["size"] < 10_000
    unserved = {name: result["error"] for name, result in answer.items() if "error" in result}
    assert unserved == {}, answer
