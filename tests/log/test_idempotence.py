"""Idempotent producers: retried batches are never written twice, order is kept, state survives restarts."""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient, build_batch

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
DROPPED_RESPONSES = 3


def read_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) of a partition, up to its end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out: list[tuple[int, bytes]] = []
    while consumer.position(tp) < end:
        for records in consumer.poll(500).values():
            out.extend((r.offset, r.value) for r in records)
    consumer.close()
    return out


def create_topic(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


def init_producer_id(client: RawClient) -> tuple[int, int]:
    resp = client.request(
        InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 1, InitProducerIdResponse
    )
    assert resp.error_code == 0
    return resp.producer_id, resp.producer_epoch


@pytest.fixture
def dropping_broker(fresh_broker: BrokerProcess) -> BrokerProcess:
    """A broker that drops the connection instead of answering its first Produce requests (test hook)."""
    fresh_broker.env["ICELOG_TEST_DROP_PRODUCE_RESPONSES"] = str(DROPPED_RESPONSES)
    return fresh_broker.start()


def test_kafka_python_retries_after_lost_responses_write_each_record_once(
    dropping_broker: BrokerProcess,
) -> None:
    bootstrap = dropping_broker.bootstrap
    create_topic(bootstrap, "idem-kafka-python")
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, batch_size=2048
    )  # idempotent by default
    futures = [producer.send("idem-kafka-python", value=b"%d" % i, partition=0) for i in range(2000)]
    producer.flush()
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close()
    values = [v for _, v in read_all(bootstrap, "idem-kafka-python")]
    assert values == [b"%d" % i for i in range(2000)], "no duplicates, order kept"
    assert offsets == list(range(2000)), "retried sends are answered with their original offsets"
    assert "dropping the connection" in dropping_broker.log()


def test_librdkafka_idempotent_retries_write_each_record_once(dropping_broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    bootstrap = dropping_broker.bootstrap
    create_topic(bootstrap, "idem-librdkafka")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 100,
        }
    )
    delivered: list[int] = []
    for i in range(2000):
        producer.produce(
            "idem-librdkafka",
            value=b"%d" % i,
            partition=0,
            on_delivery=lambda err, msg: delivered.append(-1 if err else msg.offset()),
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    values = [v for _, v in read_all(bootstrap, "idem-librdkafka")]
    assert values == [b"%d" % i for i in range(2000)], "no duplicates, order kept"
    assert sorted(delivered) == list(range(2000))
    assert "dropping the connection" in dropping_broker.log()


def test_replayed_batch_gets_its_original_offset_and_gaps_and_old_epochs_are_refused(
    broker: BrokerProcess,
) -> None:
    create_topic(broker.bootstrap, "idem-raw")
    client = RawClient(broker.bootstrap)
    pid, epoch = init_producer_id(client)
    first = build_batch([b"a", b"b"], pid, epoch, 0)
    assert client.produce("idem-raw", 0, first) == (0, 0)
    assert client.produce("idem-raw", 0, build_batch([b"c"], pid, epoch, 2)) == (0, 2)
    assert client.produce("idem-raw", 0, first) == (0, 0), "a replay is answered with the original offset"
    gap = client.produce("idem-raw", 0, build_batch([b"x"], pid, epoch, 9))
    assert gap[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert client.produce("idem-raw", 0, build_batch([b"d"], pid, epoch + 1, 0)) == (0, 3), (
        "a new epoch restarts"
    )
    stale = client.produce("idem-raw", 0, build_batch([b"y"], pid, epoch, 3))
    assert stale[0] == INVALID_PRODUCER_EPOCH
    client.close()
    assert [v for _, v in read_all(broker.bootstrap, "idem-raw")] == [b"a", b"b", b"c", b"d"]


@pytest.mark.crash
def test_sequence_state_survives_a_broker_kill(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    create_topic(fresh_broker.bootstrap, "idem-restart")
    client = RawClient(fresh_broker.bootstrap)
    pid, epoch = init_producer_id(client)
    batch = build_batch([b"once"], pid, epoch, 0)
    assert client.produce("idem-restart", 0, batch) == (0, 0)
    client.close()

    fresh_broker.restart()  # SIGKILL: sequence state must be rebuilt from the intake

    client = RawClient(fresh_broker.bootstrap)
    assert client.produce("idem-restart", 0, batch) == (0, 0), "the replay after a restart is a duplicate"
    assert client.produce("idem-restart", 0, build_batch([b"next"], pid, epoch, 1)) == (0, 1)
    assert (
        client.produce("idem-restart", 0, build_batch([b"gap"], pid, epoch, 5))[0]
        == OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    new_pid, _ = init_producer_id(client)
    client.close()
    assert new_pid != pid, "producer ids are never handed out twice, even across restarts"
    assert [v for _, v in read_all(fresh_broker.bootstrap, "idem-restart")] == [b"once", b"next"]


@pytest.mark.crash
def test_producer_keeps_sending_through_a_broker_kill_without_duplicates(fresh_broker: BrokerProcess) -> None:
    """Batches durable but unanswered when the broker died are retried, and deduplicated after the restart."""
    import threading

    fresh_broker.start()
    bootstrap = fresh_broker.bootstrap
    create_topic(bootstrap, "idem-through-kill")
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=2,
        batch_size=1024,
        reconnect_backoff_ms=100,
        request_timeout_ms=10000,
    )
    acked = threading.Event()
    futures = []
    for i in range(3000):
        future = producer.send("idem-through-kill", value=b"%d" % i, partition=0)
        futures.append(future)
        if i == 300:
            future.add_callback(lambda _: acked.set())
        if i == 1500:
            assert acked.wait(30)
            fresh_broker.restart()  # SIGKILL while later sends are in flight
    producer.flush(60)
    offsets = [f.get(timeout=60).offset for f in futures]
    producer.close()
    values = [v for _, v in read_all(bootstrap, "idem-through-kill")]
    assert values == [b"%d" % i for i in range(3000)], "no duplicates, order kept"
    assert offsets == list(range(3000))
