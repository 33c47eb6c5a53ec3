"""The APIs added for Kafka 4's tools, at every version icelog advertises, over a raw connection: the answers and the
errors Kafka's broker gives (DescribeCluster's endpoint types, DescribeTopicPartitions' cursor, an unknown
transactional id, WriteTxnMarkers' fencing). The Java client and tools drive the same APIs in tests/java/.
"""

from __future__ import annotations

import pytest
from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode
from icelog.wire import codec
from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.wire_client import ask, served_versions


@pytest.mark.parametrize("version", served_versions(ApiKey.DescribeCluster))
def test_describe_cluster(broker: BrokerProcess, version: int) -> None:
    answer: object = ask(broker, ApiKey.DescribeCluster, version, include_cluster_authorized_operations=False,
                         endpoint_type=1, include_fenced_brokers=False)
    assert answer.error_code == 0 and answer.controller_id == 0  # type: ignore[attr-defined]
    assert [(b.broker_id, f"{b.host}:{b.port}") for b in answer.brokers] == [(0, broker.bootstrap)]  # type: ignore[attr-defined]
    if version >= 1:  # the controllers' endpoints are not a broker's to describe; an unknown type is refused
        controllers: object = ask(broker, ApiKey.DescribeCluster, version, include_cluster_authorized_operations=False,
                                  endpoint_type=2, include_fenced_brokers=False)
        assert controllers.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE  # type: ignore[attr-defined]
        unknown: object = ask(broker, ApiKey.DescribeCluster, version, include_cluster_authorized_operations=False,
                              endpoint_type=7, include_fenced_brokers=False)
        assert unknown.error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE  # type: ignore[attr-defined]


def test_describe_topic_partitions_pages_with_a_cursor(broker: BrokerProcess, topic_name: str) -> None:
    cls = codec.REQUEST_CLASSES[ApiKey.DescribeTopicPartitions]
    a, b, missing = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-missing"
    create_topic(broker.bootstrap, a, partitions=2)
    create_topic(broker.bootstrap, b, partitions=3)
    named = [cls.TopicRequest(name=n) for n in (b, missing, a)]
    seen: list[tuple[str, int]] = []
    cursor = None
    errors: dict[str, int] = {}
    for _ in range(10):
        page: object = ask(broker, ApiKey.DescribeTopicPartitions, 0, topics=named, response_partition_limit=2,
                           cursor=cursor)
        for topic in page.topics:  # type: ignore[attr-defined]
            errors[topic.name] = topic.error_code
            seen += [(topic.name, p.partition_index) for p in topic.partitions]
        if page.next_cursor is None:  # type: ignore[attr-defined]
            break
        cursor = cls.Cursor(topic_name=page.next_cursor.topic_name,  # type: ignore[attr-defined]
                            partition_index=page.next_cursor.partition_index)  # type: ignore[attr-defined]
    assert seen == [(a, 0), (a, 1), (b, 0), (b, 1), (b, 2)]  # name order, two partitions a page
    assert errors[missing] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and errors[a] == errors[b] == 0
    bad: object = ask(broker, ApiKey.DescribeTopicPartitions, 0, topics=[cls.TopicRequest(name=a)],
                      response_partition_limit=10, cursor=cls.Cursor(topic_name=b, partition_index=0))
    assert [t.error_code for t in bad.topics] == [ErrorCode.INVALID_REQUEST]  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", served_versions(ApiKey.ListTransactions))
def test_list_and_describe_transactions(broker: BrokerProcess, topic_name: str, version: int) -> None:
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic_name}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"x")
    assert producer.flush(30) == 0
    try:
        listed: object = ask(broker, ApiKey.ListTransactions, version, state_filters=["Ongoing", "Nonsense"],
                             producer_id_filters=[], duration_filter=-1)
        mine = [t for t in listed.transaction_states if t.transactional_id == f"{topic_name}-tx"]  # type: ignore[attr-defined]
        assert [t.transaction_state for t in mine] == ["Ongoing"]
        assert listed.unknown_state_filters == ["Nonsense"]  # type: ignore[attr-defined]
        described: object = ask(broker, ApiKey.DescribeTransactions, 0,
                                transactional_ids=[f"{topic_name}-tx", f"{topic_name}-nobody"])
        found, unknown = described.transaction_states  # type: ignore[attr-defined]
        assert (found.error_code, found.transaction_state, found.producer_id) == (0, "Ongoing", mine[0].producer_id)
        assert [(t.topic, t.partitions) for t in found.topics] == [(topic_name, [0])]
        assert unknown.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    finally:
        producer.abort_transaction(30)


def test_describe_producers_and_a_fenced_marker(broker: BrokerProcess, topic_name: str) -> None:
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(3):
        producer.produce(topic_name, value=b"%d" % i)
    assert producer.flush(30) == 0
    request = codec.REQUEST_CLASSES[ApiKey.DescribeProducers]
    answer: object = ask(broker, ApiKey.DescribeProducers, 0, topics=[
        request.TopicRequest(name=topic_name, partition_indexes=[0, 9]),
        request.TopicRequest(name=f"{topic_name}-missing", partition_indexes=[0])])
    here, missing = answer.topics  # type: ignore[attr-defined]
    (state,) = here.partitions[0].active_producers
    assert (state.last_sequence, state.current_txn_start_offset) == (2, -1)
    assert here.partitions[1].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert missing.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # A marker from an epoch older than the producer's is refused, as Kafka's producer state refuses it.
    markers = codec.REQUEST_CLASSES[ApiKey.WriteTxnMarkers]
    fenced: object = ask(broker, ApiKey.WriteTxnMarkers, 1, markers=[markers.WritableTxnMarker(
        producer_id=state.producer_id, producer_epoch=state.producer_epoch - 1, transaction_result=False,
        topics=[markers.WritableTxnMarker.WritableTxnMarkerTopic(name=topic_name, partition_indexes=[0])],
        coordinator_epoch=0)])
    codes = [p.error_code for m in fenced.markers for t in m.topics for p in t.partitions]  # type: ignore[attr-defined]
    assert codes == [ErrorCode.INVALID_PRODUCER_EPOCH]


@pytest.mark.parametrize("version", served_versions(ApiKey.DescribeLogDirs))
def test_describe_log_dirs(broker: BrokerProcess, topic_name: str, version: int) -> None:
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name, partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic_name, value=b"x" * 100, partition=1)
    assert producer.flush(30) == 0
    request = codec.REQUEST_CLASSES[ApiKey.DescribeLogDirs]
    answer: object = ask(broker, ApiKey.DescribeLogDirs, version, topics=[
        request.DescribableLogDirTopic(topic=topic_name, partitions=[0, 1, 7])])
    (result,) = answer.results  # type: ignore[attr-defined]
    assert result.error_code == 0 and result.log_dir.endswith("intake")
    (topic,) = result.topics
    sizes = {p.partition_index: p.partition_size for p in topic.partitions}
    assert set(sizes) == {0, 1} and sizes[0] == 0 and sizes[1] > 100  # partition 7 does not exist: left out
