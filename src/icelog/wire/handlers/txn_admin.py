"""What operators' tools ask about transactions (KIP-664, `kafka-transactions.sh`): ListTransactions,
DescribeTransactions, DescribeProducers, and WriteTxnMarkers, which the AdminClient's abortTransaction sends to a
partition's leader to abort a hanging transaction, and which a cluster's transaction coordinator sends to the leaders
of its transactions' partitions (coordinator/transactions.py). In a cluster ListTransactions lists the ids this broker
coordinates (the AdminClient asks every broker) and DescribeTransactions answers NOT_COORDINATOR for the others.

Answers and authorization follow Kafka's KafkaApis: transactional ids the principal may not DESCRIBE are left out of
a listing; a topic it may not READ answers TOPIC_AUTHORIZATION_FAILED per partition; WriteTxnMarkers needs
CLUSTER_ACTION on the cluster.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin.transactions import (
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer.transaction import WriteTxnMarkersResponse

from icelog.coordinator.transactions import TransactionCoordinator, TxnMetadata, TxnState
from icelog.coordinator.txn_offsets import OFFSETS_TOPIC
from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.authz import on_cluster
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

ProducerState = DescribeProducersResponse.TopicResponse.PartitionResponse.ProducerState
MarkerResult = WriteTxnMarkersResponse.WritableTxnMarkerResult
_KNOWN_STATES = {state.value for state in TxnState}


def _coordinator(ctx: RequestContext) -> TransactionCoordinator:
    assert ctx.broker.transactions is not None, "the broker starts a transaction coordinator"
    return ctx.broker.transactions


def _wall_ms(monotonic: float) -> int:
    """A time.monotonic() instant as epoch milliseconds (what Kafka's fields carry)."""
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)


def _start_ms(meta: TxnMetadata) -> int:
    """When the transactional id's current (or last) transaction began; -1 before its first, as Kafka's."""
    return -1 if meta.state == TxnState.EMPTY or not meta.started else _wall_ms(meta.started)


@handles(ApiKey.ListTransactions)
async def list_transactions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    states = set(request.state_filters)
    producer_ids = set(request.producer_id_filters)
    duration_ms = request.duration_filter if ctx.api_version >= 1 else -1
    now_ms = int(time.time() * 1000)
    listed = []
    for meta in list(_coordinator(ctx).txns.values()):
        if producer_ids and meta.producer_id not in producer_ids:
            continue
        if states and meta.state.value not in states:
            continue
        if duration_ms >= 0 and now_ms - _start_ms(meta) <= duration_ms:
            continue
        if not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TRANSACTIONAL_ID, meta.transactional_id):
            continue
        listed.append(ListTransactionsResponse.TransactionState(
            transactional_id=meta.transactional_id, producer_id=meta.producer_id,
            transaction_state=meta.state.value))
    return ListTransactionsResponse(throttle_time_ms=0, error_code=0,
                                    unknown_state_filters=sorted(states - _KNOWN_STATES),
                                    transaction_states=listed)


@handles(ApiKey.DescribeTransactions)
async def describe_transactions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    txns = _coordinator(ctx).txns
    out = []
    for transactional_id in request.transactional_ids:
        state: Any = DescribeTransactionsResponse.TransactionState(
            error_code=0, transactional_id=transactional_id, transaction_state="", transaction_timeout_ms=0,
            transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])
        out.append(state)
        meta = txns.get(transactional_id)
        if not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TRANSACTIONAL_ID, transactional_id):
            state.error_code = int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif not transactional_id:
            state.error_code = int(ErrorCode.INVALID_REQUEST)
        elif not _coordinator(ctx).coordinates(transactional_id):  # (a cluster: another broker's shard)
            state.error_code = int(ErrorCode.NOT_COORDINATOR)
        elif meta is None:
            state.error_code = int(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions):
                if ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, topic):  # as Kafka: others left out
                    by_topic.setdefault(topic, []).append(partition)
            state.transaction_state = meta.state.value
            state.transaction_timeout_ms = meta.timeout_ms
            state.transaction_start_time_ms = _start_ms(meta)
            state.producer_id = meta.producer_id
            state.producer_epoch = meta.producer_epoch
            state.topics = [DescribeTransactionsResponse.TransactionState.TopicData(topic=t, partitions=ps)
                            for t, ps in by_topic.items()]
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=out)


@handles(ApiKey.DescribeProducers)
async def describe_producers(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """Each partition's producer (idempotence) state: epoch, last sequence, and the first offset of its open
    transaction. LastTimestamp is when the broker last saw the producer's batch (icelog keeps no batch timestamps
    in producer state); CoordinatorEpoch is -1 (one broker, one coordinator)."""
    topics = []
    for topic in request.topics:
        error = ErrorCode.NONE
        if not ctx.authorize(ACLOperation.READ, ACLResourceType.TOPIC, topic.name):
            error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif ctx.broker.logs.get(topic.name) is None:
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        partitions = []
        for index in topic.partition_indexes:
            out = DescribeProducersResponse.TopicResponse.PartitionResponse(
                partition_index=index, error_code=int(error), error_message=None, active_producers=[])
            partitions.append(out)
            if error:
                continue
            try:
                _, part = ctx.broker.logs.partition(topic.name, index)
            except KafkaApiError as exc:
                out.error_code = int(exc.code)
                continue
            for producer_id, entry in sorted(part.producers.entries.items()):
                out.active_producers.append(ProducerState(
                    producer_id=producer_id, producer_epoch=entry.epoch,
                    last_sequence=entry.batches[-1].last_sequence if entry.batches else -1,
                    last_timestamp=_wall_ms(entry.last_seen), coordinator_epoch=-1,
                    current_txn_start_offset=part.txn_index.open.get(producer_id, -1)))
        topics.append(DescribeProducersResponse.TopicResponse(name=topic.name, partitions=partitions))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


@handles(ApiKey.WriteTxnMarkers)
async def write_txn_markers(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """A marker per partition through the intake, as the coordinator writes them; a marker of an epoch older than
    the producer's is refused (INVALID_PRODUCER_EPOCH), as Kafka's producer state refuses it. Partition N of
    `__consumer_offsets` is group coordinator shard N: the producer's transactional offsets pending in its groups
    are committed or dropped (coordinator/txn_offsets.py; NOT_LEADER_OR_FOLLOWER where another broker leads it)."""
    allowed = on_cluster(ctx, ACLOperation.CLUSTER_ACTION)
    logs = ctx.broker.logs
    results = []
    pending: list[tuple[Any, asyncio.Future[None]]] = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                out = MarkerResult.WritableTxnMarkerTopicResult.WritableTxnMarkerPartitionResult(
                    partition_index=index, error_code=0)
                partitions.append(out)
                if not allowed:
                    out.error_code = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
                    continue
                if topic.name == OFFSETS_TOPIC and ctx.broker.groups is not None:  # a group coordinator shard
                    pending.append((out, asyncio.ensure_future(ctx.broker.groups.txn_offsets.complete(
                        index, marker.producer_id, marker.producer_epoch, marker.transaction_result))))
                    continue
                try:
                    _, part = logs.partition(topic.name, index)
                except KafkaApiError as exc:
                    out.error_code = int(exc.code)
                    continue
                entry = part.producers.entries.get(marker.producer_id)
                if entry is not None and marker.producer_epoch < entry.epoch:
                    out.error_code = int(ErrorCode.INVALID_PRODUCER_EPOCH)
                    continue
                pending.append((out, _coordinator(ctx).append_marker(
                    topic.name, part, marker.producer_id, marker.producer_epoch, marker.transaction_result,
                    marker.coordinator_epoch)))
            topics.append(MarkerResult.WritableTxnMarkerTopicResult(name=topic.name, partitions=partitions))
        results.append(MarkerResult(producer_id=marker.producer_id, topics=topics))
    for out, done in pending:
        try:
            await done
        except KafkaApiError as exc:
            out.error_code = int(exc.code)
    return WriteTxnMarkersResponse(markers=results)
