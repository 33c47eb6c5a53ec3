"""Topic administration through real Kafka admin clients (librdkafka's AdminClient, kafka-python's
KafkaAdminClient) and through the `icelog` command line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpConfigResourceType
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.clients_util import (
    WAIT_S,
    ConfluentClient,
    Rec,
    comparable,
    create_topic,
    expected_records,
    now_ms,
    sample_records,
)

ICELOG = str(Path(sys.executable).parent / "icelog")
TOPIC_DEFAULTS = {
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "cleanup.policy": "delete",
}


# -- helpers ---------------------------------------------------------------------------------------


def admin_for(broker: BrokerProcess) -> AdminClient:
    """librdkafka's admin client for a broker."""
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture
def kp_admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    """kafka-python's admin client for the shared broker."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    yield admin
    admin.close()


def error_of(future: Any) -> int | None:
    """The Kafka error code a librdkafka admin future failed with, or None if it succeeded."""
    try:
        future.result(WAIT_S)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def topic_partitions(admin: AdminClient) -> dict[str, int]:
    """Every topic the broker's Metadata lists, with its partition count."""
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=WAIT_S).topics.items()}


def describe_topic_configs(admin: AdminClient, topic: str) -> dict[str, tuple[str, ConfigSource, bool]]:
    """DescribeConfigs of a topic through librdkafka: {key: (value, source, is_default)}."""
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {
        name: (entry.value, ConfigSource(entry.source), entry.is_default)
        for name, entry in future.result(WAIT_S).items()
    }


def explicit_configs(admin: AdminClient, topic: str) -> dict[str, str]:
    """The configs set on the topic itself (DYNAMIC_TOPIC_CONFIG)."""
    return {
        name: value
        for name, (value, source, _) in describe_topic_configs(admin, topic).items()
        if source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    }


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `icelog` command with no ICELOG_* settings from the test environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_")}
    return subprocess.run([ICELOG, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


# -- create / list / describe / delete ------------------------------------------------------------


def test_topic_lifecycle_confluent(broker: BrokerProcess, topic_name: str) -> None:
    """Create, list, describe, delete and re-create a topic; the re-created topic starts empty."""
    admin = admin_for(broker)
    futures = admin.create_topics([NewTopic(topic_name, 3, 1, config={"retention.ms": "3600000"})])
    assert error_of(futures[topic_name]) is None
    assert topic_partitions(admin)[topic_name] == 3

    (described,) = admin.describe_topics(TopicCollection([topic_name])).values()
    description = described.result(WAIT_S)
    assert description.name == topic_name
    assert [p.id for p in description.partitions] == [0, 1, 2]
    assert all(p.leader is not None and p.leader.id == 0 for p in description.partitions)

    ConfluentClient().produce(broker.bootstrap, topic_name, sample_records(6, 3))
    assert error_of(admin.delete_topics([topic_name])[topic_name]) is None
    assert topic_name not in topic_partitions(admin)

    # A topic of the same name must not see the old one's data or offsets.
    assert error_of(admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name]) is None
    assert topic_partitions(admin)[topic_name] == 1
    assert explicit_configs(admin, topic_name) == {}
    assert ConfluentClient().watermarks(broker.bootstrap, topic_name, 0) == (0, 0)
    records = sample_records(3, seed=2)
    ConfluentClient().produce(broker.bootstrap, topic_name, records)
    got = ConfluentClient().consume(broker.bootstrap, topic_name, [0], "earliest", 3)
    assert comparable(got) == comparable(expected_records(records))


def test_topic_lifecycle_kafka_python(
    kp_admin: KafkaAdminClient, broker: BrokerProcess, topic_name: str
) -> None:
    """The same life cycle through kafka-python's admin client."""
    result = kp_admin.create_topics(
        [KpNewTopic(topic_name, 2, 1, topic_configs={"retention.bytes": "1000000"})]
    )
    assert [(t["name"], t["error_code"], t["num_partitions"]) for t in result["topics"]] == [
        (topic_name, 0, 2)
    ]
    assert topic_name in kp_admin.list_topics()

    (described,) = kp_admin.describe_topics([topic_name])
    assert described["error_code"] == 0
    assert [p["partition_index"] for p in described["partitions"]] == [0, 1]
    assert all(p["leader_id"] == 0 for p in described["partitions"])

    kp_admin.delete_topics([topic_name])
    assert topic_name not in kp_admin.list_topics()
    with pytest.raises(kafka_errors.UnknownTopicOrPartitionError):
        kp_admin.delete_topics([topic_name])


def test_kafkas_internal_topic_names_are_taken(broker: BrokerProcess) -> None:
    """`__consumer_offsets` and `__transaction_state` are the coordinators' shards here (their state is in the
    metadata store): CreateTopics gets TOPIC_ALREADY_EXISTS, as from Kafka once it made them, and Metadata with
    auto-creation creates nothing."""
    admin = admin_for(broker)
    for name in ("__consumer_offsets", "__transaction_state"):
        assert error_of(admin.create_topics([NewTopic(name, 3, 1)])[name]) == KafkaError.TOPIC_ALREADY_EXISTS
    producer = Producer({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": True})
    assert producer.list_topics("__consumer_offsets", timeout=WAIT_S).topics["__consumer_offsets"].error is not None
    assert not {"__consumer_offsets", "__transaction_state"} & set(topic_partitions(admin))


def test_validate_only_creates_nothing(broker: BrokerProcess, topic_name: str) -> None:
    """CreateTopics/CreatePartitions with validate_only check the request but change nothing."""
    admin = admin_for(broker)
    assert error_of(admin.create_topics([NewTopic(topic_name, 2, 1)], validate_only=True)[topic_name]) is None
    assert topic_name not in topic_partitions(admin)
    bad = admin.create_topics([NewTopic(topic_name, 2, 1, config={"nope": "1"})], validate_only=True)
    assert error_of(bad[topic_name]) == KafkaError.INVALID_CONFIG

    create_topic(broker.bootstrap, topic_name, 2)
    assert (
        error_of(admin.create_partitions([NewPartitions(topic_name, 4)], validate_only=True)[topic_name])
        is None
    )
    assert topic_partitions(admin)[topic_name] == 2


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_create_partitions(broker: BrokerProcess, topic_name: str, client: str) -> None:
    """Growing a topic keeps existing data; new partitions take records; shrinking is INVALID_PARTITIONS."""
    admin = admin_for(broker)
    create_topic(broker.bootstrap, topic_name, 2)
    before = sample_records(4, 2, seed=1)
    ConfluentClient().produce(broker.bootstrap, topic_name, before)

    if client == "confluent":
        assert error_of(admin.create_partitions([NewPartitions(topic_name, 5)])[topic_name]) is None
        assert error_of(admin.create_partitions([NewPartitions(topic_name, 5)])[topic_name]) == (
            KafkaError.INVALID_PARTITIONS
        )
        assert error_of(admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name]) == (
            KafkaError.INVALID_PARTITIONS
        )
    else:
        kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
        try:
            kp.create_partitions({topic_name: KpNewPartitions(total_count=5)})
            with pytest.raises(kafka_errors.InvalidPartitionsError):
                kp.create_partitions({topic_name: KpNewPartitions(total_count=3)})
        finally:
            kp.close()
    assert topic_partitions(admin)[topic_name] == 5

    after = [Rec(4, b"new", b"partition four"), Rec(0, b"old", b"partition zero")]
    ConfluentClient().produce(broker.bootstrap, topic_name, after)
    got = ConfluentClient().consume(broker.bootstrap, topic_name, [0, 1, 4], "earliest", 6)
    assert comparable(got, timestamps=False) == comparable(
        expected_records([*before, *after]), timestamps=False
    )


# -- configs ---------------------------------------------------------------------------------------


def test_describe_configs_defaults_vs_explicit(broker: BrokerProcess, topic_name: str) -> None:
    """Explicit configs come back as DYNAMIC_TOPIC_CONFIG, the rest as defaults with their default value."""
    admin = admin_for(broker)
    create_topic(
        broker.bootstrap, topic_name, configs={"retention.ms": "3600000", "max.message.bytes": "2000"}
    )

    configs = describe_topic_configs(admin, topic_name)

    assert configs["retention.ms"] == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)
    assert configs["max.message.bytes"] == ("2000", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)
    for key in ("retention.bytes", "message.timestamp.type", "cleanup.policy"):
        assert configs[key] == (TOPIC_DEFAULTS[key], ConfigSource.DEFAULT_CONFIG, True)

    # The same through kafka-python, asking for two keys only.
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        resource = KpConfigResource(
            KpConfigResourceType.TOPIC, topic_name, configs=["retention.ms", "retention.bytes"]
        )
        described = kp.describe_configs([resource], config_filter="all")["topic"][topic_name]
    finally:
        kp.close()
    assert {k: (v["value"], v["config_source"]) for k, v in described.items()} == {
        "retention.ms": ("3600000", "DYNAMIC_TOPIC_CONFIG"),
        "retention.bytes": ("-1", "DEFAULT_CONFIG"),
    }


def test_describe_broker_configs(broker: BrokerProcess) -> None:
    """DescribeConfigs of the broker resource reports the broker's settings."""
    admin = admin_for(broker)  # keep the handle alive until the future resolves
    (future,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    configs = {name: entry.value for name, entry in future.result(WAIT_S).items()}
    assert configs["auto.create.topics.enable"] == "true"
    assert configs["num.partitions"] == "1"


def test_describe_cluster(broker: BrokerProcess, kp_admin: KafkaAdminClient) -> None:
    """One broker, which is also the controller (admin clients send CreateTopics etc. to the controller)."""
    admin = admin_for(broker)
    cluster = admin.describe_cluster().result(WAIT_S)
    assert (cluster.cluster_id, [n.id for n in cluster.nodes], cluster.controller.id) == (
        "icelog-cluster",
        [0],
        0,
    )
    described = kp_admin.describe_cluster()
    assert described["controller_id"] == 0
    assert [(b["broker_id"], f"{b['host']}:{b['port']}") for b in described["brokers"]] == [
        (0, broker.bootstrap)
    ]


def test_alter_configs_persist_across_restart(fresh_broker: BrokerProcess) -> None:
    """IncrementalAlterConfigs and legacy AlterConfigs changes are stored and survive a broker restart."""
    fresh_broker.start()
    admin = admin_for(fresh_broker)
    create_topic(
        fresh_broker.bootstrap, "incremental", configs={"retention.ms": "3600000", "retention.bytes": "-1"}
    )
    create_topic(fresh_broker.bootstrap, "legacy", configs={"retention.ms": "3600000"})
    create_topic(fresh_broker.bootstrap, "kp-incremental")

    resource = ConfigResource(
        ResourceType.TOPIC,
        "incremental",
        incremental_configs=[
            ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    (future,) = admin.incremental_alter_configs([resource]).values()
    assert error_of(future) is None
    # Legacy AlterConfigs replaces the whole set: retention.ms goes back to its default.
    (future,) = admin.alter_configs(
        [ConfigResource(ResourceType.TOPIC, "legacy", set_config={"message.timestamp.type": "LogAppendTime"})]
    ).values()
    assert error_of(future) is None
    kp = KafkaAdminClient(bootstrap_servers=fresh_broker.bootstrap, request_timeout_ms=15000)
    try:
        result = kp.alter_configs(
            [
                KpConfigResource(
                    KpConfigResourceType.TOPIC, "kp-incremental", configs={"retention.ms": "7200000"}
                )
            ]
        )
    finally:
        kp.close()
    assert result == {"topic": {"kp-incremental": "OK"}}

    expected = {
        "incremental": {"retention.ms": "3600000", "max.message.bytes": "2000"},
        "legacy": {"message.timestamp.type": "LogAppendTime"},
        "kp-incremental": {"retention.ms": "7200000"},
    }
    assert {t: explicit_configs(admin, t) for t in expected} == expected

    fresh_broker.restart()  # SIGKILL, then start on the same data directory
    admin = admin_for(fresh_broker)
    assert {t: explicit_configs(admin, t) for t in expected} == expected
    assert describe_topic_configs(admin, "legacy")["retention.ms"][0] == TOPIC_DEFAULTS["retention.ms"]

    # And they are enforced: a batch over max.message.bytes is refused...
    producer = Producer({"bootstrap.servers": fresh_broker.bootstrap, "enable.idempotence": False})
    errors: list[Any] = []
    producer.produce("incremental", b"x" * 5000, on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(WAIT_S) == 0
    assert [e.code() if e else None for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE]
    # ...and the LogAppendTime topic stamps the broker's time.
    ConfluentClient().produce(fresh_broker.bootstrap, "legacy", [Rec(0, b"k", b"v", (), 1_000_000_000_000)])
    (got,) = ConfluentClient().consume(fresh_broker.bootstrap, "legacy", [0], "earliest", 1)
    assert got.log_append_time and got.timestamp != 1_000_000_000_000


def test_alter_config_errors(broker: BrokerProcess, topic_name: str) -> None:
    """Unknown keys and bad values are INVALID_CONFIG and change nothing; unknown topics are reported."""
    admin = admin_for(broker)
    create_topic(broker.bootstrap, topic_name, configs={"retention.ms": "3600000"})

    for key, value in [("no.such.key", "1"), ("retention.ms", "soon"), ("message.timestamp.type", "Bogus")]:
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic_name,
            incremental_configs=[
                ConfigEntry("retention.bytes", "1000", incremental_operation=AlterConfigOpType.SET),
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET),
            ],
        )
        (future,) = admin.incremental_alter_configs([resource]).values()
        assert error_of(future) == KafkaError.INVALID_CONFIG, (key, value)
    assert explicit_configs(admin, topic_name) == {"retention.ms": "3600000"}

    resource = ConfigResource(
        ResourceType.TOPIC,
        f"{topic_name}-missing",
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    (future,) = admin.incremental_alter_configs([resource]).values()
    assert error_of(future) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_a_typo_in_an_icelog_config_family_is_refused_with_the_key_it_meant(broker: BrokerProcess,
                                                                            topic_name: str) -> None:
    """`icelog.table.bucketkey` would be stored and silently do nothing: keys of the icelog.archive/schema/table/
    intake families must be known (INVALID_CONFIG naming the likely key); other icelog.* keys persist as given,
    and an unknown key already stored can still be deleted."""
    admin = admin_for(broker)
    for key in ("icelog.table.bucketkey", "icelog.schema.valu", "icelog.archive.max.byte"):
        bad = admin.create_topics([NewTopic(topic_name, 1, 1, config={key: "x"})], validate_only=True)[topic_name]
        with pytest.raises(KafkaException) as info:
            bad.result()
        assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "did you mean icelog." in info.value.args[0].str()
    create_topic(broker.bootstrap, topic_name, configs={"icelog.owner": "team-a"})
    assert explicit_configs(admin, topic_name) == {"icelog.owner": "team-a"}
    resource = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("icelog.table.bucketkey", None, incremental_operation=AlterConfigOpType.DELETE)])
    (future,) = admin.incremental_alter_configs([resource]).values()
    assert error_of(future) is None



def test_admin_list_offsets(broker: BrokerProcess, topic_name: str) -> None:
    """Admin ListOffsets: earliest, latest, by timestamp and the record with the largest timestamp."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec
    from kafka import TopicPartition as KpTopicPartition

    create_topic(broker.bootstrap, topic_name)
    base = now_ms() - 30_000
    deltas = [0, 40, 10, 30, 20]  # the largest timestamp is not the last record's
    ConfluentClient().produce(
        broker.bootstrap, topic_name, [Rec(0, None, b"v", (), base + d) for d in deltas]
    )

    admin = admin_for(broker)
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "for_timestamp": OffsetSpec.for_timestamp(base + 25),
        "max_timestamp": OffsetSpec.max_timestamp(),
    }
    got = {}
    for name, spec in specs.items():
        (future,) = admin.list_offsets({TopicPartition(topic_name, 0): spec}).values()
        got[name] = future.result(WAIT_S).offset
    assert got == {"earliest": 0, "latest": 5, "for_timestamp": 1, "max_timestamp": 1}

    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    tp = KpTopicPartition(topic_name, 0)
    try:
        # Not -3 (max timestamp): kafka-python asks for ListOffsets v7 for it, which the broker does not
        # advertise (advertising it would make kafka-python infer Kafka 3.0 instead of 2.8).
        answers = {ts: kp.list_partition_offsets({tp: ts})[tp] for ts in (-2, -1, base + 25)}
    finally:
        kp.close()
    assert {ts: a.offset for ts, a in answers.items()} == {-2: 0, -1: 5, base + 25: 1}
    assert answers[base + 25].timestamp == base + 40


# -- errors on create --------------------------------------------------------------------------------


def test_create_topic_errors_confluent(broker: BrokerProcess, topic_name: str) -> None:
    """One CreateTopics request, a result per topic: good ones are created, bad ones get their error."""
    admin = admin_for(broker)
    create_topic(broker.bootstrap, topic_name)
    long_ok = "x" * 249
    requests = {
        topic_name: NewTopic(topic_name, 1, 1),
        f"{topic_name}-ok": NewTopic(f"{topic_name}-ok", 2, 1),
        long_ok: NewTopic(long_ok, 1, 1),
        "a b": NewTopic("a b", 1, 1),
        "..": NewTopic("..", 1, 1),
        "x" * 250: NewTopic("x" * 250, 1, 1),
        f"{topic_name}-zero": NewTopic(f"{topic_name}-zero", 0, 1),
        f"{topic_name}-rf": NewTopic(f"{topic_name}-rf", 1, 3),
        f"{topic_name}-key": NewTopic(f"{topic_name}-key", 1, 1, config={"no.such.key": "1"}),
        f"{topic_name}-val": NewTopic(f"{topic_name}-val", 1, 1, config={"retention.ms": "forever"}),
        f"{topic_name}-enum": NewTopic(f"{topic_name}-enum", 1, 1, config={"message.timestamp.type": "Never"}),
    }
    futures = admin.create_topics(list(requests.values()))

    assert {name: error_of(futures[name]) for name in requests} == {
        topic_name: KafkaError.TOPIC_ALREADY_EXISTS,
        f"{topic_name}-ok": None,
        long_ok: None,
        "a b": KafkaError.TOPIC_EXCEPTION,
        "..": KafkaError.TOPIC_EXCEPTION,
        "x" * 250: KafkaError.TOPIC_EXCEPTION,
        f"{topic_name}-zero": KafkaError.INVALID_PARTITIONS,
        f"{topic_name}-rf": KafkaError.INVALID_REPLICATION_FACTOR,
        f"{topic_name}-key": KafkaError.INVALID_CONFIG,
        f"{topic_name}-val": KafkaError.INVALID_CONFIG,
        f"{topic_name}-enum": KafkaError.INVALID_CONFIG,
    }
    topics = topic_partitions(admin)
    assert {name for name in requests if name in topics} == {topic_name, f"{topic_name}-ok", long_ok}
    assert topics[f"{topic_name}-ok"] == 2
    assert error_of(admin.delete_topics([long_ok])[long_ok]) is None


@pytest.mark.parametrize(
    ("name", "partitions", "configs", "error"),
    [
        ("a b", 1, {}, kafka_errors.InvalidTopicError),
        ("..", 1, {}, kafka_errors.InvalidTopicError),
        ("x" * 250, 1, {}, kafka_errors.InvalidTopicError),
        ("{topic}", 0, {}, kafka_errors.InvalidPartitionsError),
        ("{topic}", 1, {"no.such.key": "1"}, kafka_errors.InvalidConfigurationError),
        ("{topic}", 1, {"max.message.bytes": "-5"}, kafka_errors.InvalidConfigurationError),
        ("{existing}", 1, {}, kafka_errors.TopicAlreadyExistsError),
    ],
    ids=["space", "dotdot", "too-long", "zero-partitions", "unknown-key", "bad-value", "exists"],
)
def test_create_topic_errors_kafka_python(
    kp_admin: KafkaAdminClient,
    broker: BrokerProcess,
    topic_name: str,
    name: str,
    partitions: int,
    configs: dict[str, str],
    error: type[Exception],
) -> None:
    """kafka-python raises the error class matching the broker's error code."""
    existing = f"{topic_name}-existing"
    create_topic(broker.bootstrap, existing)
    name = name.format(topic=topic_name, existing=existing)
    with pytest.raises(error):
        kp_admin.create_topics([KpNewTopic(name, partitions, 1, topic_configs=configs)])
    if name != existing:
        assert name not in kp_admin.list_topics()


# -- auto-creation -----------------------------------------------------------------------------------


def test_auto_create_on_produce(broker: BrokerProcess, topic_name: str) -> None:
    """Producing to an unknown topic creates it (num.partitions=1, default configs) and keeps the record."""
    from kafka import KafkaProducer

    records = [Rec(0, b"k", b"first record")]
    ConfluentClient().produce(broker.bootstrap, f"{topic_name}-rdkafka", records)
    # kafka-python 3 defaults to idempotence (InitProducerId); produce plainly here, like test_clients.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)
    try:
        metadata = producer.send(f"{topic_name}-kp", b"first record", key=b"k").get(WAIT_S)
    finally:
        producer.close(WAIT_S)
    assert (metadata.partition, metadata.offset) == (0, 0)

    admin = admin_for(broker)
    for topic in (f"{topic_name}-rdkafka", f"{topic_name}-kp"):
        assert topic_partitions(admin)[topic] == 1
        assert explicit_configs(admin, topic) == {}
        (got,) = ConfluentClient().consume(broker.bootstrap, topic, [0], "earliest", 1)
        assert (got.offset, got.key, got.value) == (0, b"k", b"first record")


def test_auto_create_disabled(fresh_broker: BrokerProcess) -> None:
    """With auto.create.topics.enable=false producing to an unknown topic fails and creates nothing."""
    from kafka import KafkaProducer

    fresh_broker.env["ICELOG_AUTO_CREATE_TOPICS_ENABLE"] = "false"
    fresh_broker.start()
    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": fresh_broker.bootstrap,
            "enable.idempotence": False,
            "message.timeout.ms": 3000,
            "topic.metadata.propagation.max.ms": 1000,
        }
    )
    producer.produce("not-there", b"v", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(WAIT_S)
    assert len(errors) == 1 and errors[0] is not None, errors

    kp = KafkaProducer(bootstrap_servers=fresh_broker.bootstrap, enable_idempotence=False, max_block_ms=2000)
    try:
        with pytest.raises(kafka_errors.KafkaTimeoutError):
            kp.send("not-there-either", b"v").get(WAIT_S)
    finally:
        kp.close(WAIT_S)

    admin = admin_for(fresh_broker)
    assert topic_partitions(admin) == {}
    (future,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    assert future.result(WAIT_S)["auto.create.topics.enable"].value == "false"
    # Explicit creation still works.
    create_topic(fresh_broker.bootstrap, "not-there")
    ConfluentClient().produce(fresh_broker.bootstrap, "not-there", [Rec(0, None, b"v")])
    assert ConfluentClient().watermarks(fresh_broker.bootstrap, "not-there", 0) == (0, 1)


# -- the icelog command line ----------------------------------------------------------------------------


def test_cli_topic_commands(broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """`icelog topic create|list|describe|delete` against a running broker, errors included."""
    bootstrap = ["--bootstrap", broker.bootstrap]

    created = run_cli(
        "topic",
        *bootstrap,
        "create",
        topic_name,
        "--partitions",
        "3",
        "--config",
        "retention.ms=5555",
        "--config",
        "max.message.bytes=4096",
        cwd=tmp_path,
    )
    assert created.returncode == 0, created.stderr
    assert topic_name in created.stdout
    admin = admin_for(broker)
    assert topic_partitions(admin)[topic_name] == 3
    assert explicit_configs(admin, topic_name) == {"retention.ms": "5555", "max.message.bytes": "4096"}

    listed = run_cli("topic", *bootstrap, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert topic_name in listed.stdout.splitlines()
    listed_after = run_cli("topic", "list", *bootstrap, cwd=tmp_path)  # --bootstrap after the action, too
    assert listed_after.returncode == 0 and listed_after.stdout == listed.stdout, listed_after.stderr
    groups_after = run_cli("group", "list", *bootstrap, cwd=tmp_path)  # and for `group`
    assert groups_after.returncode == 0, groups_after.stderr
    # Piped into a reader that leaves at once (`| head -1` of a long list): no BrokenPipeError traceback.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_")}
    piped = subprocess.run(f"{ICELOG} topic list {' '.join(bootstrap)} | true", shell=True, capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=120)
    assert piped.returncode == 0 and "Traceback" not in piped.stderr, piped.stderr

    described = run_cli("topic", *bootstrap, "describe", topic_name, cwd=tmp_path)
    assert described.returncode == 0, described.stderr
    lines = [line.strip() for line in described.stdout.splitlines()]
    assert f"topic {topic_name}  partitions 3" in lines
    assert "retention.ms=5555" in lines
    assert "max.message.bytes=4096" in lines
    assert "retention.bytes=-1 (default)" in lines

    failures = {
        "exists": run_cli("topic", *bootstrap, "create", topic_name, cwd=tmp_path),
        "bad-name": run_cli("topic", *bootstrap, "create", "a b", cwd=tmp_path),
        "bad-config": run_cli(
            "topic", *bootstrap, "create", f"{topic_name}-x", "--config", "nope=1", cwd=tmp_path
        ),
        "not-key-value": run_cli(
            "topic", *bootstrap, "create", f"{topic_name}-x", "--config", "nope", cwd=tmp_path
        ),
        "describe-missing": run_cli("topic", *bootstrap, "describe", f"{topic_name}-x", cwd=tmp_path),
    }
    expected_messages = {
        "exists": "TOPIC_ALREADY_EXISTS",
        "bad-name": "INVALID_TOPIC",
        "bad-config": "INVALID_CONFIG",
        "not-key-value": "KEY=VALUE",
        "describe-missing": "does not exist",
    }
    for case, proc in failures.items():
        assert proc.returncode != 0, case
        assert expected_messages[case] in proc.stderr, (case, proc.stderr)
        assert "Traceback" not in proc.stderr, (case, proc.stderr)
    assert f"{topic_name}-x" not in topic_partitions(admin)

    deleted = run_cli("topic", *bootstrap, "delete", topic_name, cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert topic_name not in topic_partitions(admin)
    again = run_cli("topic", *bootstrap, "delete", topic_name, cwd=tmp_path)
    assert again.returncode != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in again.stderr, again.stderr


@pytest.mark.parametrize("command", [["list"], ["create", "some-topic"]])
def test_cli_without_broker(tmp_path: Path, command: list[str]) -> None:
    """Against a port where nothing listens the CLI says so and exits non-zero, without a traceback."""
    bootstrap = f"127.0.0.1:{free_port()}"
    proc = run_cli("topic", "--bootstrap", bootstrap, *command, cwd=tmp_path)
    assert proc.returncode != 0
    assert f"no broker answers at {bootstrap}" in proc.stderr
    assert "Traceback" not in proc.stderr


def status_rows(output: str) -> dict[tuple[str, int], dict[str, str]]:
    """Parse `icelog status` (a header line, then one whitespace-separated row per partition)."""
    lines = output.splitlines()
    header = lines[0].split()
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(header, line.split(), strict=False))
        rows[(cells["TOPIC"], int(cells["PARTITION"]))] = cells
    return rows


def test_cli_status(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    """`icelog status --data-dir` shows each partition's offsets, with the broker running or stopped."""
    fresh_broker.start()
    create_topic(fresh_broker.bootstrap, "orders", 2)
    create_topic(fresh_broker.bootstrap, "empty")
    ConfluentClient().produce(fresh_broker.bootstrap, "orders", sample_records(8, 2)[:7])  # 4 + 3 records

    for when in ("running", "stopped"):
        proc = run_cli("status", "--data-dir", str(fresh_broker.data_dir), cwd=tmp_path)
        assert proc.returncode == 0, (when, proc.stderr)
        rows = status_rows(proc.stdout)
        assert set(rows) == {("orders", 0), ("orders", 1), ("empty", 0)}, when
        offsets = {key: (r["LOG-START"], r["HIGH-WATERMARK"], r["RECORDS"]) for key, r in rows.items()}
        assert offsets == {
            ("orders", 0): ("0", "4", "4"),
            ("orders", 1): ("0", "3", "3"),
            ("empty", 0): ("0", "0", "0"),
        }
        assert int(rows[("orders", 0)]["INTAKE-BYTES"]) > 0 and rows[("empty", 0)]["INTAKE-BYTES"] == "0"
        fresh_broker.stop()

    missing = tmp_path / "no-such-dir"
    proc = run_cli("status", "--data-dir", str(missing), cwd=tmp_path)
    assert proc.returncode != 0
    assert str(missing) in proc.stderr and "Traceback" not in proc.stderr
    assert not missing.exists()  # a typo must not leave an empty metadata store behind
