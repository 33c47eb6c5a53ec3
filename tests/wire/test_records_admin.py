"""DeleteRecords and OffsetForLeaderEpoch: raw requests at every advertised version (Kafka's answers and errors),
confluent-kafka's AdminClient.delete_records moving the low watermark durably (a broker restart keeps it), the leader
epoch every API reports, and librdkafka validating a position with OffsetForLeaderEpoch."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode
from icelog.wire import codec
from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.metrics import scrape_text, value
from tests.support.wire_client import ask, served_versions


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
        producer.flush(10)  # one batch each: offsets inside the intake's chunks
    assert producer.flush(10) == 0


def delete(broker: BrokerProcess, version: int, topic: str, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    cls = codec.REQUEST_CLASSES[ApiKey.DeleteRecords]
    answer: object = ask(broker, ApiKey.DeleteRecords, version, timeout_ms=5000, topics=[cls.DeleteRecordsTopic(
        name=topic, partitions=[cls.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=p, offset=o)
                                for p, o in offsets.items()])])
    [result] = answer.topics  # type: ignore[attr-defined]
    return {p.partition_index: (p.error_code, p.low_watermark) for p in result.partitions}


def earliest(broker: BrokerProcess, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-wm"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        consumer.close()


def fetch_error(broker: BrokerProcess, topic: str, offset: int) -> tuple[int, int]:
    cls = codec.REQUEST_CLASSES[ApiKey.Fetch]
    answer: object = ask(broker, ApiKey.Fetch, 11, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                         isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                         topics=[cls.FetchTopic(topic=topic, partitions=[cls.FetchTopic.FetchPartition(
                             partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                             partition_max_bytes=1 << 20)])])
    part = answer.responses[0].partitions[0]  # type: ignore[attr-defined]
    return part.error_code, part.log_start_offset


@pytest.mark.parametrize("version", served_versions(ApiKey.DeleteRecords))
def test_delete_records_answers_and_errors(broker: BrokerProcess, topic_name: str, version: int) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2)
    produce(broker.bootstrap, topic_name, 6)
    assert delete(broker, version, topic_name, {0: 3, 1: 0, 5: 1}) == {
        0: (0, 3), 1: (0, 0), 5: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    assert delete(broker, version, topic_name, {0: 7})[0] == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)  # past the HW
    assert delete(broker, version, topic_name, {0: 2})[0] == (0, 3)  # never backwards
    assert earliest(broker, topic_name) == 3
    assert fetch_error(broker, topic_name, 2) == (ErrorCode.OFFSET_OUT_OF_RANGE, 3)
    assert fetch_error(broker, topic_name, 3) == (0, 3)
    assert delete(broker, version, topic_name, {0: -1})[0] == (0, 6)  # -1: the high watermark
    assert delete(broker, version, f"{topic_name}-missing", {0: 0}) == {0: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}


@pytest.mark.parametrize("version", served_versions(ApiKey.OffsetForLeaderEpoch))
def test_offset_for_leader_epoch(broker: BrokerProcess, topic_name: str, version: int) -> None:
    create_topic(broker.bootstrap, topic_name)
    produce(broker.bootstrap, topic_name, 4)
    cls = codec.REQUEST_CLASSES[ApiKey.OffsetForLeaderEpoch]
    part = cls.OffsetForLeaderTopic.OffsetForLeaderPartition
    asked = [part(partition=0, current_leader_epoch=-1, leader_epoch=0),
             part(partition=0, current_leader_epoch=0, leader_epoch=0),
             part(partition=0, current_leader_epoch=1, leader_epoch=0),
             part(partition=0, current_leader_epoch=-1, leader_epoch=5),
             part(partition=3, current_leader_epoch=-1, leader_epoch=0)]
    answer: object = ask(broker, ApiKey.OffsetForLeaderEpoch, version, replica_id=-1, topics=[
        cls.OffsetForLeaderTopic(topic=topic_name, partitions=asked),
        cls.OffsetForLeaderTopic(topic=f"{topic_name}-missing", partitions=[asked[0]])])
    got = [[(p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions]
           for t in answer.topics]  # type: ignore[attr-defined]
    assert got == [[(0, 0, 4), (0, 0, 4), (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1), (0, -1, -1),
                    (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)],
                   [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]]


def test_admin_delete_records_survives_a_restart(fresh_broker: BrokerProcess, topic_name: str) -> None:
    broker = fresh_broker.start()
    create_topic(broker.bootstrap, topic_name)
    produce(broker.bootstrap, topic_name, 10)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    [future] = admin.delete_records([TopicPartition(topic_name, 0, 4)]).values()
    assert future.result(30).low_watermark == 4  # the new low watermark
    assert earliest(broker, topic_name) == 4
    broker.restart()
    assert earliest(broker, topic_name) == 4
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic_name}-g",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic_name])
        values: list[bytes] = []
        for _ in range(60):
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
            if len(values) >= 6:
                break
        assert values == [f"v{i}".encode() for i in range(4, 10)]
    finally:
        consumer.close()


def test_leader_epoch_reported_and_checked(broker: BrokerProcess, topic_name: str) -> None:
    """Metadata, DescribeTopicPartitions and ListOffsets report leader epoch 0, the epoch OffsetForLeaderEpoch
    answers; Fetch and ListOffsets answer UNKNOWN_LEADER_EPOCH for a later current_leader_epoch, as Kafka's leader
    does, and serve 0 and -1 (unknown, not checked)."""
    create_topic(broker.bootstrap, topic_name)
    produce(broker.bootstrap, topic_name, 3)
    meta: object = ask(broker, ApiKey.Metadata, 12, topics=[
        codec.REQUEST_CLASSES[ApiKey.Metadata].MetadataRequestTopic(name=topic_name)],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    assert [p.leader_epoch for p in meta.topics[0].partitions] == [0]  # type: ignore[attr-defined]
    dtp = codec.REQUEST_CLASSES[ApiKey.DescribeTopicPartitions]
    described: object = ask(broker, ApiKey.DescribeTopicPartitions, 0, response_partition_limit=10, cursor=None,
                            topics=[dtp.TopicRequest(name=topic_name)])
    assert [p.leader_epoch for p in described.topics[0].partitions] == [0]  # type: ignore[attr-defined]

    lo = codec.REQUEST_CLASSES[ApiKey.ListOffsets]

    def list_offsets(current: int, timestamp: int) -> tuple[int, int, int]:
        answer: object = ask(broker, ApiKey.ListOffsets, 7, replica_id=-1, isolation_level=0, topics=[
            lo.ListOffsetsTopic(name=topic_name, partitions=[lo.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=current, timestamp=timestamp)])])
        part = answer.topics[0].partitions[0]  # type: ignore[attr-defined]
        return part.error_code, part.offset, part.leader_epoch

    assert list_offsets(-1, -1) == (0, 3, 0)
    assert list_offsets(0, -2) == (0, 0, 0)
    assert list_offsets(0, 0) == (0, 0, 0)  # by timestamp: the first record
    assert list_offsets(0, 1 << 62) == (0, -1, -1)  # no record that late
    assert list_offsets(1, -1) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1)

    fetch = codec.REQUEST_CLASSES[ApiKey.Fetch]

    def fetched(current: int) -> tuple[int, int, bool]:
        answer: object = ask(broker, ApiKey.Fetch, 12, replica_id=-1, max_wait_ms=0, min_bytes=1,
                             max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                             forgotten_topics_data=[], rack_id="", topics=[fetch.FetchTopic(
                                 topic=topic_name, partitions=[fetch.FetchTopic.FetchPartition(
                                     partition=0, current_leader_epoch=current, fetch_offset=0,
                                     last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])])
        part = answer.responses[0].partitions[0]  # type: ignore[attr-defined]
        return part.error_code, part.high_watermark, bool(part.records)

    assert fetched(-1) == (0, 3, True)
    assert fetched(0) == (0, 3, True)
    assert fetched(1) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, False)


def test_librdkafka_validates_an_assignment_with_a_leader_epoch(broker: BrokerProcess, topic_name: str) -> None:
    """librdkafka reads the epoch (0) off the records, and an assignment that carries it is validated with
    OffsetForLeaderEpoch before the consumer reads on from it."""
    create_topic(broker.bootstrap, topic_name)
    produce(broker.bootstrap, topic_name, 6)
    before = value(scrape_text(broker.metrics_url), "icelog_requests_total", api="OffsetForLeaderEpoch")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic_name}-g"})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 2, leader_epoch=0)])
        read: list[tuple[int, int | None]] = []
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                read.append((msg.offset(), msg.leader_epoch()))
            if len(read) == 4:
                break
    finally:
        consumer.close()
    assert read == [(offset, 0) for offset in range(2, 6)]
    assert value(scrape_text(broker.metrics_url), "icelog_requests_total", api="OffsetForLeaderEpoch") > before
