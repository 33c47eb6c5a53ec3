"""Fetch (a long poll over the partition logs) and ListOffsets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse

from icelog.errors import KafkaApiError
from icelog.wire.context import RequestContext, handles

PartitionData = FetchResponse.FetchableTopicResponse.PartitionData
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
READ_COMMITTED = 1


@handles(ApiKey.Fetch)
async def fetch(ctx: RequestContext, request: Any) -> Any:
    logs = ctx.broker.logs
    max_bytes = request.max_bytes if ctx.api_version >= 3 else 0x7FFFFFFF
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    while True:
        responses, total_bytes, waiters = _read_all(ctx, request, logs, max_bytes)
        remaining = deadline - time.monotonic()
        if total_bytes >= max(request.min_bytes, 1) or remaining <= 0 or not waiters:
            return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)
        _, unfinished = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for waiter in unfinished:
            waiter.cancel()


def _read_all(ctx: RequestContext, request: Any, logs: Any, max_bytes: int) -> tuple[list[Any], int, list[Any]]:
    responses = []
    total = 0
    waiters = []
    read_committed = ctx.api_version >= 4 and request.isolation_level == READ_COMMITTED
    for topic in request.topics:
        partitions = []
        for req in topic.partitions:
            data = PartitionData(
                partition_index=req.partition, error_code=0, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1, records=b"",
            )
            partitions.append(data)
            try:
                _, part = logs.partition(topic.topic, req.partition)
                data.high_watermark = part.high_watermark
                data.last_stable_offset = stable = part.last_stable_offset
                data.log_start_offset = part.log_start_offset
                budget = min(req.partition_max_bytes, max_bytes - total)
                upper = stable if read_committed else None
                batches = part.read(req.fetch_offset, budget, upper) if budget > 0 or total == 0 else []
            except KafkaApiError as exc:
                data.error_code = int(exc.code)
                continue
            if read_committed:  # the reader drops these producers' records up to their abort markers
                data.aborted_transactions = [
                    PartitionData.AbortedTransaction(producer_id=r.producer_id, first_offset=r.first_offset)
                    for r in part.aborted_ranges(req.fetch_offset, stable)
                ]
            if batches:
                data.records = batches[0] if len(batches) == 1 else b"".join(batches)
                total += len(data.records)
            elif req.fetch_offset >= (stable if read_committed else part.high_watermark):
                waiters.append(part.data_waiter())
        responses.append(FetchResponse.FetchableTopicResponse(topic=topic.topic, partitions=partitions))
    return responses, total, waiters


@handles(ApiKey.ListOffsets)
async def list_offsets(ctx: RequestContext, request: Any) -> Any:
    logs = ctx.broker.logs
    topics = []
    for topic in request.topics:
        partitions = []
        for req in topic.partitions:
            out = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=req.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1,
                old_style_offsets=[],
            )
            partitions.append(out)
            try:
                _, part = logs.partition(topic.name, req.partition_index)
            except KafkaApiError as exc:
                out.error_code = int(exc.code)
                continue
            if req.timestamp == LATEST:
                committed = ctx.api_version >= 2 and request.isolation_level == READ_COMMITTED
                out.offset = part.last_stable_offset if committed else part.high_watermark
            elif req.timestamp == EARLIEST:
                out.offset = part.log_start_offset
            else:
                found = part.max_timestamp_offset() if req.timestamp == MAX_TIMESTAMP else (
                    part.offset_for_timestamp(req.timestamp)
                )
                if found is not None:
                    out.offset, out.timestamp = found
            if ctx.api_version == 0:
                out.old_style_offsets = [out.offset] if out.offset >= 0 else []
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)
