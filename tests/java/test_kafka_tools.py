"""Kafka's own command-line tools (kafka-tools 4.1, and kafka-configs.sh's class from Kafka's core) against icelog,
run as `java -cp` runs them behind the shell scripts: what an operator reads in their output, and what a client then
sees (records, committed offsets).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.broker import BrokerProcess
from tests.support.java import TOOLS, KafkaJava
from tests.support.metrics import scrape_text, value


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("SLF4J:")]


def test_topics_console_clients_offsets_and_groups(kafka_java: KafkaJava, broker: BrokerProcess,
                                                   topic_name: str) -> None:
    """kafka-topics creates and describes; the console producer writes keyed records and the console consumer reads
    them in a group; kafka-get-offsets shows the ends; kafka-consumer-groups describes, resets and deletes."""
    server = ("--bootstrap-server", broker.bootstrap)
    group = f"{topic_name}-g"
    created = kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "2")
    assert f"Created topic {topic_name}." in created.stdout
    described = lines(kafka_java.tool("kafka-topics", *server, "--describe", "--topic", topic_name).stdout)
    assert re.match(rf"Topic: {re.escape(topic_name)}\s+TopicId: \S+\s+PartitionCount: 2\s+ReplicationFactor: 1",
                    described[0])
    assert [re.sub(r"\s+", " ", line.strip()).split(" Elr")[0] for line in described[1:]] == [
        f"Topic: {topic_name} Partition: {p} Leader: 0 Replicas: 0 Isr: 0" for p in (0, 1)]

    records = [f"k{i}:v{i}" for i in range(10)]
    kafka_java.tool("kafka-console-producer", *server, "--topic", topic_name, "--property", "parse.key=true",
                    "--property", "key.separator=:", stdin="\n".join(records) + "\n")
    ends = kafka_java.tool("kafka-get-offsets", *server, "--topic", topic_name).stdout
    per_partition = dict(line.rsplit(":", 2)[1:] for line in lines(ends))
    assert sum(int(end) for end in per_partition.values()) == 10 and set(per_partition) == {"0", "1"}

    consumed = kafka_java.tool("kafka-console-consumer", *server, "--topic", topic_name, "--group", group,
                               "--from-beginning", "--max-messages", "10", "--property", "print.key=true",
                               "--property", "key.separator=:")
    assert sorted(lines(consumed.stdout)) == sorted(records)

    def described_group() -> dict[str, tuple[str, str, str]]:
        out = kafka_java.tool("kafka-consumer-groups", *server, "--describe", "--group", group).stdout
        rows = [line.split() for line in lines(out) if line.startswith(group)]
        return {row[2]: (row[3], row[4], row[5]) for row in rows}  # partition → (current, log end, lag)

    assert described_group() == {p: (end, end, "0") for p, end in per_partition.items()}
    reset = kafka_java.tool("kafka-consumer-groups", *server, "--reset-offsets", "--group", group, "--topic",
                            topic_name, "--to-earliest", "--execute").stdout
    assert sorted(row.split()[2:] for row in lines(reset) if row.startswith(group)) == [["0", "0"], ["1", "0"]]
    assert described_group() == {p: ("0", end, end) for p, end in per_partition.items()}
    again = kafka_java.tool("kafka-console-consumer", *server, "--topic", topic_name, "--group", group,
                            "--max-messages", "10", "--property", "print.key=true", "--property", "key.separator=:")
    assert sorted(lines(again.stdout)) == sorted(records)  # from the reset offsets, not the auto.offset.reset

    deleted = kafka_java.tool("kafka-consumer-groups", *server, "--delete", "--group", group).stdout
    assert f"Deletion of requested consumer groups ('{group}') was successful." in deleted
    listed = kafka_java.tool("kafka-consumer-groups", *server, "--list").stdout
    assert group not in lines(listed)

    altered = kafka_java.tool("kafka-topics", *server, "--alter", "--topic", topic_name, "--partitions", "3")
    assert altered.returncode == 0
    assert "PartitionCount: 3" in kafka_java.tool("kafka-topics", *server, "--describe", "--topic", topic_name).stdout
    kafka_java.tool("kafka-topics", *server, "--delete", "--topic", topic_name)
    assert topic_name not in lines(kafka_java.tool("kafka-topics", *server, "--list").stdout)


def test_configs(kafka_java: KafkaJava, broker: BrokerProcess, topic_name: str) -> None:
    """kafka-configs alters a topic's config and describes it back; a value icelog refuses is the tool's error."""
    server = ("--bootstrap-server", broker.bootstrap)
    entity = ("--entity-type", "topics", "--entity-name", topic_name)
    kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "1")
    altered = kafka_java.tool("kafka-configs", *server, *entity, "--alter", "--add-config",
                              "retention.ms=7200000,cleanup.policy=delete").stdout
    assert f"Completed updating config for topic {topic_name}." in altered
    described = kafka_java.tool("kafka-configs", *server, *entity, "--describe").stdout
    assert "retention.ms=7200000" in described and "cleanup.policy=delete" in described
    kafka_java.tool("kafka-configs", *server, *entity, "--alter", "--delete-config", "retention.ms")
    assert "retention.ms=" not in kafka_java.tool("kafka-configs", *server, *entity, "--describe").stdout
    refused = kafka_java.tool("kafka-configs", *server, *entity, "--alter", "--add-config", "retention.ms=soon",
                              check=False)
    assert refused.returncode != 0 and "InvalidConfigurationException" in refused.stdout + refused.stderr


def test_acls(kafka_java: KafkaJava, tmp_path: Path) -> None:
    """kafka-acls adds, lists and removes a binding on a broker whose authorizer is on (the anonymous PLAINTEXT
    principal a super user); with the authorizer off it gets Kafka's SecurityDisabledException."""
    secured = BrokerProcess(tmp_path / "acl-data", env={"ICELOG_AUTHORIZER_ENABLED": "true",
                                                        "ICELOG_SUPER_USERS": "User:ANONYMOUS"}).start()
    try:
        server = ("--bootstrap-server", secured.bootstrap)
        binding = ("--allow-principal", "User:alice", "--operation", "Read", "--topic", "orders")
        kafka_java.tool("kafka-acls", *server, "--add", *binding)
        listed = kafka_java.tool("kafka-acls", *server, "--list", "--topic", "orders").stdout
        assert "principal=User:alice, host=*, operation=READ, permissionType=ALLOW" in listed
        kafka_java.tool("kafka-acls", *server, "--remove", "--force", *binding)
        assert "User:alice" not in kafka_java.tool("kafka-acls", *server, "--list", "--topic", "orders").stdout
    finally:
        secured.stop()


def test_verifiable_producer_broker_killed_verifiable_consumer_reads_every_ack(
        kafka_java: KafkaJava, fresh_broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's system-test tools: VerifiableProducer (acks=all) runs while the broker is SIGKILLed and restarted;
    VerifiableConsumer then reads every record the producer was told was acknowledged, in a classic group and in a
    KIP-848 group (`--group-protocol consumer`: ConsumerGroupHeartbeat, never JoinGroup)."""
    broker = fresh_broker.start()
    kafka_java.tool("kafka-topics", "--bootstrap-server", broker.bootstrap, "--create", "--topic", topic_name,
                    "--partitions", "3")
    def kill() -> None:
        broker.kill()  # SIGKILL: what was acked is on disk, the rest the producer retries after the restart
        broker.start()

    acked, events, _ = verifiable_producer_with_a_kill(kafka_java, broker.bootstrap, topic_name, kill)
    summary = [e for e in events if e["name"] == "tool_data"][-1]
    assert summary["acked"] == len(acked) and len(acked) > 500

    for protocol in ("classic", "consumer"):  # both group protocols, each in a group of its own, on the same log
        before = {api: requests(broker, api) for api in ("JoinGroup", "ConsumerGroupHeartbeat")}
        seen = verifiable_consumer_reads(kafka_java, broker.bootstrap, topic_name, f"{topic_name}-{protocol}",
                                         protocol, acked)
        assert not acked - seen, (f"{protocol}: {len(acked - seen)} acked records never read, "
                                  f"e.g. {sorted(acked - seen)[:5]}")
        joined = {api: requests(broker, api) > count for api, count in before.items()}
        assert joined == {"JoinGroup": protocol == "classic", "ConsumerGroupHeartbeat": protocol == "consumer"}


def requests(broker: BrokerProcess, api: str) -> float:
    """Requests of one API the broker has served since it started."""
    return value(scrape_text(broker.metrics_url), "icelog_requests_total", api=api)


def verifiable_producer_with_a_kill(kafka_java: KafkaJava, bootstrap: str, topic: str, kill: Callable[[], None],
                                    messages: int = 3000, config: Path | None = None,
                                    ) -> tuple[set[str], list[dict[str, object]], int]:
    """VerifiableProducer (acks=all, `messages` records at 500 a second; `config`: its --producer.config) with `kill`
    called once, after 500 acks: the values it was told were acknowledged, every event it printed, and when `kill`
    returned (epoch ms, the clock of the events' timestamps)."""
    extra = ["--producer.config", str(config)] if config is not None else []
    producer = subprocess.Popen(
        kafka_java.command(TOOLS["verifiable-producer"], "--bootstrap-server", bootstrap,
                           "--topic", topic, "--max-messages", str(messages), "--throughput", "500", "--acks", "-1",
                           *extra),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert producer.stdout is not None
    acked: set[str] = set()
    events: list[dict[str, object]] = []
    back_ms = 0
    for line in producer.stdout:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        events.append(event)
        if event["name"] == "producer_send_success":
            acked.add(str(event["value"]))
        if len(acked) >= 500 and not back_ms:
            kill()
            back_ms = int(time.time() * 1000)
    assert producer.wait(timeout=300) == 0
    assert back_ms, "the producer ended before 500 acknowledgements"
    return acked, events, back_ms


def verifiable_consumer_reads(kafka_java: KafkaJava, bootstrap: str, topic: str, group: str, protocol: str,
                              wanted: set[str]) -> set[str]:
    """The values VerifiableConsumer (`--group-protocol`) reads in `group` until it has every one of `wanted`."""
    consumer = subprocess.Popen(
        kafka_java.command(TOOLS["verifiable-consumer"], "--bootstrap-server", bootstrap,
                           "--topic", topic, "--group-id", group, "--group-protocol", protocol, "--verbose",
                           "--reset-policy", "earliest"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert consumer.stdout is not None
    seen: set[str] = set()
    watchdog = threading.Timer(180, consumer.kill)  # a consumer that prints nothing more still ends the loop
    watchdog.start()
    try:
        for line in consumer.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                if event["name"] == "record_data":
                    seen.add(str(event["value"]))
            if wanted <= seen:
                break
    finally:
        watchdog.cancel()
        consumer.kill()
        consumer.wait()
    return seen


def last_stable_offset(bootstrap: str, topic: str) -> int:
    """ListOffsets latest under read_committed: where an open transaction holds read_committed consumers."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        return int(consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)])
    finally:
        consumer.close()


def test_transactions_tool(kafka_java: KafkaJava, broker: BrokerProcess, topic_name: str) -> None:
    """kafka-transactions lists and describes an open transaction and its producer, find-hanging finds none (the
    transaction's coordinator owns it), and abort writes its abort marker: read_committed readers move on."""
    from confluent_kafka import Producer

    server = ("--bootstrap-server", broker.bootstrap)
    txn_id = f"{topic_name}-txn"
    kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "1")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 300000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic_name, key=f"k{i}", value=f"open{i}", partition=0)
    assert producer.flush(30) == 0
    assert last_stable_offset(broker.bootstrap, topic_name) == 0

    def table(out: str) -> list[list[str]]:
        return [line.split() for line in lines(out)]

    listed = table(kafka_java.tool("kafka-transactions", *server, "list").stdout)
    assert listed[0][:4] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    mine = [row for row in listed if row[0] == txn_id]
    assert len(mine) == 1 and mine[0][1] == "0" and mine[0][3] == "Ongoing"
    producer_id = mine[0][2]

    described = table(kafka_java.tool("kafka-transactions", *server, "describe", "--transactional-id",
                                      txn_id).stdout)
    header, row = described[0], described[1]
    fields = dict(zip(header, row, strict=False))
    assert fields["ProducerId"] == producer_id and fields["TransactionState"] == "Ongoing"
    assert fields["TopicPartitions"] == f"{topic_name}-0" and fields["TransactionTimeoutMs"] == "300000"

    producers = table(kafka_java.tool("kafka-transactions", *server, "describe-producers", "--topic", topic_name,
                                      "--partition", "0").stdout)
    assert producers[0][:2] == ["ProducerId", "ProducerEpoch"]
    by_pid = {row[0]: dict(zip(producers[0], row, strict=False)) for row in producers[1:]}
    assert by_pid[producer_id]["LastSequence"] == "2"
    assert by_pid[producer_id]["CurrentTransactionStartOffset"] == "0"

    # Open for longer than 0 minutes, but its coordinator's Ongoing transaction holds the partition: not hanging
    # (a transaction nobody owns icelog aborts by itself, at start-up or after its timeout: docs/transactions.md;
    # a really hanging one is the next test's).
    hanging = table(kafka_java.tool("kafka-transactions", *server, "find-hanging", "--broker-id", "0",
                                    "--max-transaction-timeout", "0").stdout)
    assert hanging == [["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                        "LastTimestamp", "Duration(min)"]]

    kafka_java.tool("kafka-transactions", *server, "abort", "--topic", topic_name, "--partition", "0",
                    "--start-offset", "0")
    assert last_stable_offset(broker.bootstrap, topic_name) == 4  # 3 records and the abort marker
    after = table(kafka_java.tool("kafka-transactions", *server, "describe-producers", "--topic", topic_name,
                                  "--partition", "0").stdout)
    assert {row[0]: row for row in after[1:]}[producer_id][-1] != "0"  # no open transaction starts at 0 any more
    producer.abort_transaction(30)


def test_transactions_tool_finds_and_aborts_a_hanging_transaction(kafka_java: KafkaJava, tmp_path: Path,
                                                                  topic_name: str) -> None:
    """A transaction whose abort marker never reached its partition (the test hook `txn-markers-lost`: how Kafka's
    hanging transactions came about) holds read_committed consumers at its first offset. kafka-transactions
    find-hanging lists it (its coordinator's transaction no longer includes the partition), and `abort` with the
    offsets it printed writes the marker: the consumer reads on, and find-hanging finds nothing more."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as CkPartition

    broker = BrokerProcess(tmp_path / "hanging-data", env={"ICELOG_TEST_FAULT": "txn-markers-lost"}).start()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic_name}-g",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        server = ("--bootstrap-server", broker.bootstrap)
        kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "1")
        # A timeout far longer than the test: icelog's own abort of a hanging transaction waits it out.
        txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic_name}-txn",
                        "transaction.timeout.ms": 600000})
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(3):
            txn.produce(topic_name, value=f"hung{i}", partition=0)
        assert txn.flush(30) == 0  # written, at offsets 0-2
        txn.abort_transaction(30)  # the coordinator completes the abort; the partition never gets the marker
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        plain.produce(topic_name, value="after", partition=0)
        assert plain.flush(30) == 0

        def read_committed(for_s: float) -> list[str]:
            values: list[str] = []
            deadline = time.monotonic() + for_s
            while time.monotonic() < deadline and not values:
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    values.append(message.value().decode())
            return values

        consumer.assign([CkPartition(topic_name, 0, 0)])
        assert read_committed(3) == []  # held at offset 0 by the open transaction
        assert last_stable_offset(broker.bootstrap, topic_name) == 0

        def find_hanging() -> list[list[str]]:
            out = kafka_java.tool("kafka-transactions", *server, "find-hanging", "--broker-id", "0",
                                  "--max-transaction-timeout", "0").stdout
            return [line.split() for line in lines(out)]

        header, *hanging = find_hanging()
        assert header == ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                          "LastTimestamp", "Duration(min)"]
        assert [row[:2] + row[5:6] for row in hanging] == [[topic_name, "0", "0"]]
        (row,) = hanging
        kafka_java.tool("kafka-transactions", *server, "abort", "--topic", row[0], "--partition", row[1],
                        "--start-offset", row[5])
        assert read_committed(60) == ["after"]
        assert last_stable_offset(broker.bootstrap, topic_name) == 5  # 3 records, "after" and the abort marker
        assert find_hanging() == [header]
    finally:
        consumer.close()
        broker.stop()


def test_log_dirs(kafka_java: KafkaJava, broker: BrokerProcess, topic_name: str) -> None:
    """kafka-log-dirs describes the broker's one log directory, the intake, with each partition's size in it."""
    server = ("--bootstrap-server", broker.bootstrap)
    kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "2")
    kafka_java.tool("kafka-console-producer", *server, "--topic", topic_name,
                    stdin="".join(f"record {i}\n" for i in range(20)))
    out = kafka_java.tool("kafka-log-dirs", *server, "--describe", "--broker-list", "0", "--topic-list",
                          topic_name).stdout
    described = json.loads(next(line for line in lines(out) if line.startswith("{")))
    (only,) = described["brokers"]
    (log_dir,) = only["logDirs"]
    assert only["broker"] == 0 and log_dir["error"] is None and log_dir["logDir"].endswith("intake")
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert set(sizes) == {f"{topic_name}-0", f"{topic_name}-1"}
    assert sum(sizes.values()) > 20 * len("record 0")  # 20 records, in batches with their headers


def test_performance_tools(kafka_java: KafkaJava, broker: BrokerProcess, topic_name: str) -> None:
    """ProducerPerformance, ConsumerPerformance and EndToEndLatency, as Kafka's system tests drive a broker: every
    record sent is acknowledged and consumed; no figure is asserted."""
    server = ("--bootstrap-server", broker.bootstrap)
    kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "3")
    produced = kafka_java.tool("producer-performance", "--topic", topic_name, "--num-records",
                              "20000", "--record-size", "100", "--throughput", "-1", "--producer-props",
                              f"bootstrap.servers={broker.bootstrap}", "acks=all", "compression.type=lz4").stdout
    assert re.search(r"^20000 records sent", produced, re.MULTILINE), produced
    consumed = kafka_java.tool("consumer-performance", *server, "--topic", topic_name,
                              "--messages", "20000", "--timeout", "60000").stdout
    header, row = lines(consumed)[-2:]
    fields = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")], strict=False))
    assert fields["data.consumed.in.nMsg"] == "20000", consumed
    latency = kafka_java.tool("end-to-end-latency", broker.bootstrap, f"{topic_name}-e2e", "200",
                             "all", "100").stdout
    assert "Avg latency:" in latency, latency


def test_delete_records(kafka_java: KafkaJava, broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """kafka-delete-records moves the log start: the tool reports the new low watermark, kafka-get-offsets too."""
    server = ("--bootstrap-server", broker.bootstrap)
    kafka_java.tool("kafka-topics", *server, "--create", "--topic", topic_name, "--partitions", "1")
    kafka_java.tool("kafka-console-producer", *server, "--topic", topic_name,
                    stdin="".join(f"record {i}\n" for i in range(10)))
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic_name, "partition": 0, "offset": 6}]}))
    out = kafka_java.tool("kafka-delete-records", *server, "--offset-json-file", str(offsets)).stdout
    assert f"partition: {topic_name}-0\tlow_watermark: 6" in out
    earliest = kafka_java.tool("kafka-get-offsets", *server, "--topic", topic_name, "--time", "-2").stdout
    assert lines(earliest) == [f"{topic_name}:0:6"]
