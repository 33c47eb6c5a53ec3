"""ApiVersions, Metadata (with Kafka's auto.create.topics.enable), DescribeCluster and DescribeTopicPartitions."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import MetadataResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.topics import INTERNAL_TOPIC_NAMES
from icelog.wire import codec
from icelog.wire.authz import may_create_topic
from icelog.wire.context import RequestContext, handles
from icelog.wire.handlers.records_admin import LEADER_EPOCH
from icelog.wire.versions import build_api_versions_response

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

log = logging.getLogger(__name__)


@handles(ApiKey.ApiVersions)
async def api_versions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    return build_api_versions_response(ctx.api_version)


@handles(ApiKey.Metadata)
async def metadata(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    broker = ctx.broker
    logs = broker.logs
    # A null topic list asks for every topic: those the principal may not DESCRIBE are left out, as Kafka does.
    if request.topics is None:
        names = [n for n in sorted(logs.topics) if ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, n)]
    else:
        names = [t.name for t in request.topics if not _by_id(t)]
    topics = []
    # v12: topics asked for by id (the clients resolve a KIP-848 assignment's topic ids so); an id not known, or of a
    # topic the principal may not DESCRIBE, is UNKNOWN_TOPIC_ID, as in Kafka.
    for topic_id in [t.topic_id for t in request.topics or [] if _by_id(t)]:
        known = logs.catalog.topic_by_id(topic_id)
        if known is not None and ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, known.name):
            names.append(known.name)
        else:
            topics.append(MetadataResponse.MetadataResponseTopic(
                error_code=int(ErrorCode.UNKNOWN_TOPIC_ID), name=None, topic_id=topic_id, partitions=[]))
    allow_create = ctx.api_version < 4 or request.allow_auto_topic_creation
    for name in names:
        state = logs.get(name)
        error = ErrorCode.NONE
        if request.topics is not None and not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, name):
            state, error = None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif (state is None and allow_create and broker.settings.auto_create_topics_enable
              and name not in INTERNAL_TOPIC_NAMES):  # (not topics here: UNKNOWN_TOPIC_OR_PARTITION, not retried)
            if not may_create_topic(ctx, name):
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            else:
                try:
                    state = logs.create_topic(name, broker.settings.num_partitions, {})
                except KafkaApiError as exc:
                    # Created meanwhile through another broker, which this one follows within a heartbeat: as
                    # Kafka answers while an auto-created topic gets its leaders, LEADER_NOT_AVAILABLE (retriable).
                    exists = exc.code == ErrorCode.TOPIC_ALREADY_EXISTS
                    error = ErrorCode.LEADER_NOT_AVAILABLE if exists else exc.code
        if state is None:
            topics.append(
                MetadataResponse.MetadataResponseTopic(
                    error_code=int(error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), name=name, partitions=[]
                )
            )
            continue
        partitions = []
        for p in range(len(state.partitions)):
            leader, epoch = leadership(ctx, state.record.topic_id, p)
            partitions.append(MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                error_code=0 if leader >= 0 else int(ErrorCode.LEADER_NOT_AVAILABLE), partition_index=p,
                leader_id=leader, leader_epoch=epoch, replica_nodes=[leader] if leader >= 0 else [],
                isr_nodes=[leader] if leader >= 0 else [], offline_replicas=[],
            ))
        topics.append(
            MetadataResponse.MetadataResponseTopic(
                error_code=0, name=name, topic_id=state.record.topic_id, is_internal=False, partitions=partitions
            )
        )
    brokers = [MetadataResponse.MetadataResponseBroker(node_id=n, host=host, port=port, rack=rack)
               for n, host, port, rack in live_brokers(ctx)]
    return MetadataResponse(
        throttle_time_ms=0, brokers=brokers, cluster_id=broker.settings.cluster_id,
        controller_id=controller_id(ctx), topics=topics,
    )


def live_brokers(ctx: RequestContext) -> list[tuple[int, str, int, str | None]]:
    """(node id, host, port, rack) of every live broker on the listener the client came in on: this broker alone,
    or each broker of the cluster as it registered itself (a broker without that listener is left out)."""
    cluster = ctx.broker.cluster
    host, port = ctx.connection.advertised
    if cluster is None:
        return [(ctx.broker.settings.node_id, host, port, ctx.broker.settings.broker_rack)]
    listener = ctx.connection.listener.name if ctx.connection.listener is not None else ""
    out = []
    for record in cluster.view.brokers:
        if record.node_id == cluster.lease.node_id:
            out.append((record.node_id, host, port, record.rack))
        elif listener in record.endpoints:
            there = record.endpoints[listener]
            out.append((record.node_id, there[0], there[1], record.rack))
    if not any(n == cluster.lease.node_id for n, *_ in out):  # before the first heartbeat's view
        out.append((cluster.lease.node_id, host, port, ctx.broker.settings.broker_rack))
    return sorted(out)


def controller_id(ctx: RequestContext) -> int:
    """Metadata's controller: the broker with the lowest live node id (the clients' admin requests that must go to
    the controller, such as CreateTopics of old clients, are served by every broker)."""
    return min(n for n, *_ in live_brokers(ctx))


def leadership(ctx: RequestContext, topic_id: uuid.UUID, partition: int) -> tuple[int, int]:
    """(leader node, leader epoch) of a partition: this broker alone; the cluster's view otherwise (its live holder,
    or -1 while it has none: LEADER_NOT_AVAILABLE, retriable, until a broker claims it under a new epoch)."""
    cluster = ctx.broker.cluster
    if cluster is None:
        return ctx.broker.settings.node_id, LEADER_EPOCH
    return cluster.view.partition_leader((topic_id, partition))


def _by_id(topic: Any) -> bool:
    """Whether a Metadata topic names its topic by id: a null name (librdkafka) or an empty one (the Java client)."""
    return not topic.name and getattr(topic, "topic_id", None) not in (None, _NO_TOPIC_ID)


_ENDPOINT_BROKERS, _ENDPOINT_CONTROLLERS = 1, 2
_MAX_PARTITIONS_PER_RESPONSE = 2000  # Kafka's max.request.partition.size.limit default
_NO_TOPIC_ID = uuid.UUID(int=0)  # what Kafka answers for a topic it does not name (unknown, unauthorized)


@handles(ApiKey.DescribeCluster)
async def describe_cluster(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """The one broker, which is also the controller (as Metadata says); as Kafka's broker, a request for the
    controllers' endpoints answers MISMATCHED_ENDPOINT_TYPE, an unknown type UNSUPPORTED_ENDPOINT_TYPE (v1+; v0
    INVALID_REQUEST). Authorized operations are not computed (the schema's default, "not provided")."""
    cls: Any = codec.response_class(ApiKey.DescribeCluster)
    broker = ctx.broker
    endpoint = request.endpoint_type if ctx.api_version >= 1 else _ENDPOINT_BROKERS
    if endpoint != _ENDPOINT_BROKERS:
        error = ErrorCode.INVALID_REQUEST if ctx.api_version == 0 else (
            ErrorCode.MISMATCHED_ENDPOINT_TYPE if endpoint == _ENDPOINT_CONTROLLERS
            else ErrorCode.UNSUPPORTED_ENDPOINT_TYPE)
        return cls(throttle_time_ms=0, error_code=int(error), error_message=f"endpoint type {endpoint}",
                   endpoint_type=endpoint, cluster_id="", controller_id=-1, brokers=[])
    brokers = [cls.DescribeClusterBroker(broker_id=n, host=host, port=port, rack=rack, is_fenced=False)
               for n, host, port, rack in live_brokers(ctx)]
    return cls(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=_ENDPOINT_BROKERS,
               cluster_id=broker.settings.cluster_id, controller_id=controller_id(ctx), brokers=brokers)


@handles(ApiKey.DescribeTopicPartitions)
async def describe_topic_partitions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """KIP-966's paged topic description (the Java AdminClient's describeTopics), as Kafka's
    DescribeTopicPartitionsRequestHandler: topics in name order from the cursor, at most the request's limit of
    partitions (and Kafka's 2000), the next cursor where it stopped; unauthorized topics are left out of a listing
    of all topics and answer TOPIC_AUTHORIZATION_FAILED when named."""
    cls: Any = codec.response_class(ApiKey.DescribeTopicPartitions)
    topic_cls, partition_cls = cls.DescribeTopicPartitionsResponseTopic, (
        cls.DescribeTopicPartitionsResponseTopic.DescribeTopicPartitionsResponsePartition)
    logs = ctx.broker.logs
    everything = not request.topics
    cursor = request.cursor
    after = cursor.topic_name if cursor is not None else ""
    names = sorted({n for n in (logs.topics if everything else (t.name for t in request.topics)) if n >= after})
    if cursor is not None and (cursor.partition_index < 0 or (not everything and cursor.topic_name not in names)):
        # Kafka's error response: every requested topic, in request order, with the error and nothing else.
        bad = [topic_cls(error_code=int(ErrorCode.INVALID_REQUEST), name=t.name, topic_id=_NO_TOPIC_ID,
                         is_internal=False, partitions=[]) for t in request.topics]
        return cls(throttle_time_ms=0, topics=bad, next_cursor=None)

    def answer(name: str, error: ErrorCode, topic_id: uuid.UUID = _NO_TOPIC_ID) -> Any:
        return topic_cls(error_code=int(error), name=name, topic_id=topic_id, is_internal=False, partitions=[])

    denied = []
    topics = []
    next_cursor = None
    remaining = max(min(_MAX_PARTITIONS_PER_RESPONSE, request.response_partition_limit), 1)
    for name in names:
        if not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, name):
            if not everything:
                denied.append(answer(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        if remaining == 0:
            next_cursor = cls.Cursor(topic_name=name, partition_index=0)
            break
        state = logs.get(name)
        if state is None:
            if not everything:
                topics.append(answer(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        end = min(len(state.partitions), start + remaining)
        out = answer(name, ErrorCode.NONE, state.record.topic_id)
        # Empty, never null, ELR lists: Kafka's broker sends empty ones and the Java client dereferences them.
        out.partitions = []
        for p in range(start, end):
            leader, epoch = leadership(ctx, state.record.topic_id, p)
            out.partitions.append(partition_cls(
                error_code=0 if leader >= 0 else int(ErrorCode.LEADER_NOT_AVAILABLE), partition_index=p,
                leader_id=leader, leader_epoch=epoch, replica_nodes=[leader] if leader >= 0 else [],
                isr_nodes=[leader] if leader >= 0 else [], eligible_leader_replicas=[], last_known_elr=[],
                offline_replicas=[]))
        topics.append(out)
        if end < len(state.partitions):
            next_cursor = cls.Cursor(topic_name=name, partition_index=end)
            break
        remaining -= end - start
    return cls(throttle_time_ms=0, topics=topics + denied, next_cursor=next_cursor)
