"""Producer ids and transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit,
EndTxn."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitResponse,
)

from icelog.coordinator.transactions import TransactionCoordinator
from icelog.errors import ErrorCode
from icelog.meta.store import CommittedOffset
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.authz import may_write_some_topic
from icelog.wire.context import RequestContext, handles
from icelog.wire.handlers.groups import not_served

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult


def _may_write_txn(ctx: RequestContext, transactional_id: str) -> bool:
    return ctx.authorize(ACLOperation.WRITE, ACLResourceType.TRANSACTIONAL_ID, transactional_id)


def _may_read_group(ctx: RequestContext, group_id: str) -> bool:
    return ctx.authorize(ACLOperation.READ, ACLResourceType.GROUP, group_id)


def coordinator(ctx: RequestContext) -> TransactionCoordinator:
    assert ctx.broker.transactions is not None, "the broker starts a transaction coordinator"
    return ctx.broker.transactions


@handles(ApiKey.InitProducerId)
async def init_producer_id(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    denied = ErrorCode.NONE
    if request.transactional_id is not None:
        if not _may_write_txn(ctx, request.transactional_id):
            denied = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not may_write_some_topic(ctx):  # KIP-679: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if denied:
        return InitProducerIdResponse(throttle_time_ms=0, error_code=int(denied), producer_id=-1, producer_epoch=-1)
    error, pid, epoch = await coordinator(ctx).init_producer_id(
        request.transactional_id,
        request.transaction_timeout_ms,
        request.producer_id if v >= 3 else -1,
        request.producer_epoch if v >= 3 else -1,
        v,
    )
    return InitProducerIdResponse(
        throttle_time_ms=0, error_code=int(error), producer_id=pid, producer_epoch=epoch
    )


@handles(ApiKey.AddPartitionsToTxn)
async def add_partitions_to_txn(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    transactional_id = request.v3_and_below_transactional_id
    denied_topics = {t for t, _ in wanted if not ctx.authorize(ACLOperation.WRITE, ACLResourceType.TOPIC, t)}
    if not _may_write_txn(ctx, transactional_id):
        results = {tp: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in wanted}
    elif denied_topics:  # nothing is added: the denied ones say why, the others were not attempted
        results = {
            (t, p): ErrorCode.TOPIC_AUTHORIZATION_FAILED if t in denied_topics else ErrorCode.OPERATION_NOT_ATTEMPTED
            for t, p in wanted
        }
    else:
        results = await coordinator(ctx).add_partitions(
            transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
            ctx.api_version,
        )
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), error in results.items():
        by_topic.setdefault(topic, []).append(
            TopicResult.AddPartitionsToTxnPartitionResult(
                partition_index=partition, partition_error_code=int(error)
            )
        )
    return AddPartitionsToTxnResponse(
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            TopicResult(name=n, results_by_partition=r) for n, r in by_topic.items()
        ],
    )


@handles(ApiKey.AddOffsetsToTxn)
async def add_offsets_to_txn(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not _may_write_txn(ctx, request.transactional_id):
        return AddOffsetsToTxnResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        )
    if not _may_read_group(ctx, request.group_id):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    error = await coordinator(ctx).add_offsets(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.group_id,
        ctx.api_version,
    )
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=int(error))


@handles(ApiKey.TxnOffsetCommit)
async def txn_offset_commit(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    now = int(time.time() * 1000)
    if not _may_write_txn(ctx, request.transactional_id):
        return _txn_offset_commit_response(request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, set())
    if not _may_read_group(ctx, request.group_id):
        return _txn_offset_commit_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED, set())
    groups = ctx.broker.groups
    assert groups is not None, "the broker starts a group coordinator"
    if away := not_served(ctx, request.group_id):  # (sent to the group's coordinator, as every group API)
        return _txn_offset_commit_response(request, away, set())
    denied = {t.name for t in request.topics if not ctx.authorize(ACLOperation.READ, ACLResourceType.TOPIC, t.name)}
    offsets = {
        (t.name, p.partition_index): CommittedOffset(p.committed_offset, p.committed_metadata or "", now)
        for t in request.topics
        if t.name not in denied
        for p in t.partitions
    }
    error = ErrorCode.NONE if not offsets else await groups.txn_offsets.commit(  # (coordinator/txn_offsets.py)
        request.transactional_id,
        request.group_id,
        request.producer_id,
        request.producer_epoch,
        request.generation_id if v >= 3 else -1,
        request.member_id if v >= 3 else "",
        request.group_instance_id if v >= 3 else None,
        offsets,
    )
    return _txn_offset_commit_response(request, error, denied)


def _txn_offset_commit_response(request: ApiMessage, error: ErrorCode, denied: set[str]) -> ApiMessage:
    """`error` for every partition but those of `denied` topics (TOPIC_AUTHORIZATION_FAILED)."""
    Topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    topics = [
        Topic(
            name=t.name,
            partitions=[
                Topic.TxnOffsetCommitResponsePartition(
                    partition_index=p.partition_index,
                    error_code=int(ErrorCode.TOPIC_AUTHORIZATION_FAILED if t.name in denied else error),
                )
                for p in t.partitions
            ],
        )
        for t in request.topics
    ]
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)


@handles(ApiKey.EndTxn)
async def end_txn(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not _may_write_txn(ctx, request.transactional_id):
        return EndTxnResponse(throttle_time_ms=0, error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    error = await coordinator(ctx).end_txn(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.committed,
        ctx.api_version,
    )
    return EndTxnResponse(throttle_time_ms=0, error_code=int(error))
