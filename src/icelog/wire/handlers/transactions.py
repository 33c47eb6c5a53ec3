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
from icelog.meta.store import CommittedOffset
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult


def coordinator(ctx: RequestContext) -> TransactionCoordinator:
    assert ctx.broker.transactions is not None, "the broker starts a transaction coordinator"
    return ctx.broker.transactions


@handles(ApiKey.InitProducerId)
async def init_producer_id(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
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
    results = await coordinator(ctx).add_partitions(
        request.v3_and_below_transactional_id,
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
    offsets = {
        (t.name, p.partition_index): CommittedOffset(p.committed_offset, p.committed_metadata or "", now)
        for t in request.topics
        for p in t.partitions
    }
    error = await coordinator(ctx).txn_offset_commit(
        request.transactional_id,
        request.group_id,
        request.producer_id,
        request.producer_epoch,
        request.generation_id if v >= 3 else -1,
        request.member_id if v >= 3 else "",
        request.group_instance_id if v >= 3 else None,
        offsets,
        v,
    )
    topics = [
        TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic(
            name=t.name,
            partitions=[
                TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic.TxnOffsetCommitResponsePartition(
                    partition_index=p.partition_index, error_code=int(error)
                )
                for p in t.partitions
            ],
        )
        for t in request.topics
    ]
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)


@handles(ApiKey.EndTxn)
async def end_txn(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    error = await coordinator(ctx).end_txn(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.committed,
        ctx.api_version,
    )
    return EndTxnResponse(throttle_time_ms=0, error_code=int(error))
