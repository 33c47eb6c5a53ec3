"""Fetch (a long poll over the partition logs) and ListOffsets."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.context import RequestContext, handles
from icelog.wire.handlers.records_admin import check_current_leader_epoch

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

PartitionData = FetchResponse.FetchableTopicResponse.PartitionData
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
READ_COMMITTED = 1


@handles(ApiKey.Fetch)
async def fetch(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """A long poll: answer when min_bytes are readable or max_wait_ms has passed.

    File reads run on a worker thread (the event loop never waits on the disk); the long-poll waiters
    are cancelled, and so leave their partitions, whenever the Fetch ends.
    """
    logs = ctx.broker.logs
    max_bytes = request.max_bytes if ctx.api_version >= 3 else 0x7FFFFFFF
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    read_committed = ctx.api_version >= 4 and request.isolation_level == READ_COMMITTED
    denied = {t.topic for t in request.topics if not ctx.authorize(ACLOperation.READ, ACLResourceType.TOPIC, t.topic)}
    while True:
        plan = _plan(request, logs, read_committed, denied)
        if any(item.readable for item in plan):
            total = await asyncio.to_thread(_read_planned, plan, max_bytes)
        else:
            total = 0
        remaining = deadline - time.monotonic()
        idle = [item for item in plan if item.error == 0 and not item.records and not item.readable]
        if total >= max(request.min_bytes, 1) or remaining <= 0 or not idle:
            return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=_responses(request, plan))
        waiters = [item.part.data_waiter() for item in idle]
        try:
            # Data may have landed while the reads ran on the worker thread: look again at once.
            if not any(item.end() > item.seen_end for item in idle):
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


@dataclass
class _PartitionRead:
    """One partition of a Fetch: what the event loop decided, then what the worker thread read."""

    data: Any
    part: Any = None
    offset: int = 0
    partition_max_bytes: int = 0
    upper: int | None = None
    read_committed: bool = False
    seen_end: int = 0  # the end (LSO or high watermark) when planned
    error: int = 0
    records: bytes = b""

    @property
    def readable(self) -> bool:
        return self.error == 0 and self.offset < self.seen_end

    def end(self) -> int:
        end: int = self.part.last_stable_offset if self.read_committed else self.part.high_watermark
        return end


def _plan(request: Any, logs: Any, read_committed: bool, denied: set[str]) -> list[_PartitionRead]:
    """On the event loop: offsets, watermarks and aborted ranges of every partition asked for
    (TOPIC_AUTHORIZATION_FAILED for those of `denied` topics, which the principal may not READ)."""
    plan = []
    for topic in request.topics:
        for req in topic.partitions:
            data = PartitionData(
                partition_index=req.partition, error_code=0, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1, records=b"",
            )
            item = _PartitionRead(data, offset=req.fetch_offset, partition_max_bytes=req.partition_max_bytes,
                                  read_committed=read_committed)
            plan.append(item)
            try:
                if topic.topic in denied:
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                _, part = logs.partition(topic.topic, req.partition)
                check_current_leader_epoch(req.current_leader_epoch, part)  # -1 below Fetch v9
                data.high_watermark = part.high_watermark
                data.last_stable_offset = stable = part.last_stable_offset
                data.log_start_offset = part.visible_start_offset
                part.check_fetch_offset(req.fetch_offset)
            except KafkaApiError as exc:
                item.error = data.error_code = int(exc.code)
                continue
            item.part = part
            item.upper = stable if read_committed else None
            item.seen_end = stable if read_committed else part.high_watermark
            if read_committed:  # the reader drops these producers' records up to their abort markers
                data.aborted_transactions = [
                    PartitionData.AbortedTransaction(producer_id=r.producer_id, first_offset=r.first_offset)
                    for r in part.aborted_ranges(req.fetch_offset, stable)
                ]
    return plan


def _read_planned(plan: list[_PartitionRead], max_bytes: int) -> int:
    """On a worker thread: read each partition's batches within the request's byte budget."""
    total = 0
    for item in plan:
        if not item.readable:
            continue
        budget = min(item.partition_max_bytes, max_bytes - total)
        if budget <= 0 and total > 0:
            continue
        try:
            batches = item.part.read(item.offset, budget, item.upper)
        except KafkaApiError as exc:  # retention moved the log start past the offset meanwhile
            item.error = item.data.error_code = int(exc.code)
            continue
        except FileNotFoundError:  # ... and deleted the file: the offset is below the log start now
            item.error = item.data.error_code = int(ErrorCode.OFFSET_OUT_OF_RANGE)
            continue
        if batches:
            item.records = batches[0] if len(batches) == 1 else b"".join(batches)
            total += len(item.records)
    return total


def _responses(request: Any, plan: list[_PartitionRead]) -> list[Any]:
    out = []
    items = iter(plan)
    for topic in request.topics:
        partitions = []
        for _ in topic.partitions:
            item = next(items)
            item.data.records = item.records
            partitions.append(item.data)
        out.append(FetchResponse.FetchableTopicResponse(topic=topic.topic, partitions=partitions))
    return out


@handles(ApiKey.ListOffsets)
async def list_offsets(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    logs = ctx.broker.logs
    topics = []
    for topic in request.topics:
        partitions = []
        denied = not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, topic.name)
        for req in topic.partitions:
            out = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=req.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1,
                old_style_offsets=[],
            )
            partitions.append(out)
            try:
                if denied:
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                _, part = logs.partition(topic.name, req.partition_index)
                check_current_leader_epoch(req.current_leader_epoch, part)  # -1 below ListOffsets v4
            except KafkaApiError as exc:
                out.error_code = int(exc.code)
                continue
            if req.timestamp == LATEST:
                committed = ctx.api_version >= 2 and request.isolation_level == READ_COMMITTED
                out.offset = part.last_stable_offset if committed else part.high_watermark
            elif req.timestamp == EARLIEST:
                out.offset = part.visible_start_offset
            else:
                # File (and table) reads: on a worker thread, never on the event loop.
                if req.timestamp == MAX_TIMESTAMP:
                    found = await asyncio.to_thread(part.max_timestamp_offset)
                else:
                    found = await asyncio.to_thread(part.offset_for_timestamp, req.timestamp)
                if found is not None:
                    out.offset, out.timestamp = found
            if out.offset >= 0:  # every offset was written under the one leader's epoch
                out.leader_epoch = part.leader_epoch
            if ctx.api_version == 0:
                out.old_style_offsets = [out.offset] if out.offset >= 0 else []
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)
