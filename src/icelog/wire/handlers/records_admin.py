"""DeleteRecords (`kafka-delete-records.sh`, the AdminClient's deleteRecords) and OffsetForLeaderEpoch (consumers
validating their positions).

DeleteRecords moves a partition's log start forward, as retention does and through the same durable store
updates: the intake is trimmed to the offset asked for (-1: the high watermark) and, for a topic read back from its
Iceberg table, the log start consumers see over the table moves there too. The table keeps its rows (it is the
topic's history); read-back never serves below the log start. As Kafka: DELETE on the topic, else
TOPIC_AUTHORIZATION_FAILED; an offset past the high watermark, OFFSET_OUT_OF_RANGE; the answer's low watermark is
the new log start.

icelog is one broker whose leader never changes: every partition's leader epoch is LEADER_EPOCH (0), the epoch
Metadata, DescribeTopicPartitions and ListOffsets report. OffsetForLeaderEpoch answers, as Kafka's
Partition.lastOffsetForLeaderEpoch, the current epoch ending at the high watermark for any epoch asked for up to it
(a later one: UNDEFINED_EPOCH, as Kafka's epoch cache); it, Fetch and ListOffsets fence a current_leader_epoch that
differs from it (`check_current_leader_epoch`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin.topics import DeleteRecordsResponse
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

    from icelog.log.partition import PartitionLog

LEADER_EPOCH = 0  # a broker alone: its leader never changes (PartitionLog.leader_epoch's default)
HIGH_WATERMARK = -1  # DeleteRecords: up to the high watermark
DeletedPartition = DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult
EpochEndOffset = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult.EpochEndOffset


def _trim(ctx: RequestContext, part: PartitionLog, offset: int) -> int:
    """On a worker thread: make `offset` the partition's log start in the store (durably); return the bytes of the
    intake chunks it drops."""
    store = ctx.broker.logs.store
    dropped = sum(c.length for c in part.chunks_from(part.log_start_offset) if c.end_offset <= offset)
    if offset > part.log_start_offset:
        store.trim_intake(part.topic_id, part.partition, offset)
    if part.older_sources and offset > part.retention_start_offset:
        store.move_retention_start(part.topic_id, part.partition, offset)
    return dropped


async def _delete(ctx: RequestContext, topic: str, index: int, offset: int) -> int:
    """The partition's new low watermark (raises KafkaApiError with Kafka's code)."""
    _, part = ctx.broker.logs.partition(topic, index)
    hw = part.high_watermark
    if offset == HIGH_WATERMARK:
        offset = hw
    if offset < 0 or offset > hw:
        raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is outside [0, {hw}]")
    if offset > part.visible_start_offset:
        dropped = await asyncio.to_thread(_trim, ctx, part, offset)
        if offset > part.log_start_offset:
            part.drop_chunks_before(offset, dropped)
            ctx.broker.logs.catalog.release_due = True  # the next retention pass deletes files no chunk uses
        if part.older_sources:
            part.retention_start_offset = max(part.retention_start_offset, offset)
    return part.visible_start_offset


@handles(ApiKey.DeleteRecords)
async def delete_records(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    topics = []
    for topic in request.topics:
        allowed = ctx.authorize(ACLOperation.DELETE, ACLResourceType.TOPIC, topic.name)
        results = []
        for req in topic.partitions:
            result = DeletedPartition(partition_index=req.partition_index, low_watermark=-1, error_code=0)
            try:
                if not allowed:
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                result.low_watermark = await _delete(ctx, topic.name, req.partition_index, req.offset)
            except KafkaApiError as exc:
                result.error_code = int(exc.code)
            results.append(result)
        topics.append(DeleteRecordsResponse.DeleteRecordsTopicResult(name=topic.name, partitions=results))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


def check_current_leader_epoch(current: int, part: PartitionLog) -> None:
    """Kafka's leader check of a request's current_leader_epoch: a negative one (unknown) is not checked, a later one
    is UNKNOWN_LEADER_EPOCH (the client knows a leader this broker does not), an earlier one FENCED_LEADER_EPOCH."""
    if current > part.leader_epoch:
        raise KafkaApiError(ErrorCode.UNKNOWN_LEADER_EPOCH)
    if 0 <= current < part.leader_epoch:
        raise KafkaApiError(ErrorCode.FENCED_LEADER_EPOCH)


def _epoch_end(ctx: RequestContext, topic: str, req: Any, allowed: bool) -> Any:
    out = EpochEndOffset(error_code=0, partition=req.partition, leader_epoch=-1, end_offset=-1)
    try:
        if not allowed:
            raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        _, part = ctx.broker.logs.partition(topic, req.partition)
        check_current_leader_epoch(req.current_leader_epoch, part)
        if req.leader_epoch <= part.leader_epoch:
            out.leader_epoch, out.end_offset = part.leader_epoch, part.high_watermark
    except KafkaApiError as exc:
        out.error_code = int(exc.code)
    return out


@handles(ApiKey.OffsetForLeaderEpoch)
async def offset_for_leader_epoch(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    # replica_id (v3+): -1 from consumers; icelog has no followers, so a broker id is answered as a consumer is.
    topics = []
    for topic in request.topics:
        allowed = ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, topic.topic)
        topics.append(OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(
            topic=topic.topic, partitions=[_epoch_end(ctx, topic.topic, req, allowed) for req in topic.partitions]))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
