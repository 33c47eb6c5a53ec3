"""Produce: validate batches, assign offsets, wait for the group commit (acks=1/all)."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer import ProduceResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.batch import first_batch_codec
from icelog.log.record_format import CODEC_ZSTD
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

PartitionResponse = ProduceResponse.TopicProduceResponse.PartitionProduceResponse

# Test hook (fault injection for the idempotence tests): drop the connection instead of answering the
# first N Produce requests that appended data, after the data is durable, so clients must retry.
_drop_responses_left = int(os.environ.get("ICELOG_TEST_DROP_PRODUCE_RESPONSES", "0") or 0)


@handles(ApiKey.Produce)
async def produce(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    logs = ctx.broker.logs
    acks = request.acks
    pending: list[tuple[Any, asyncio.Future[None]]] = []
    responses = []
    throttle_ms = 0  # back-pressure (log/pressure.py): the largest throttle of the partitions written
    for topic_data in request.topic_data:
        partition_responses = []
        for data in topic_data.partition_data:
            result = PartitionResponse(index=data.index, error_code=0, base_offset=-1, log_append_time_ms=-1)
            partition_responses.append(result)
            try:
                if acks not in (0, 1, -1):
                    raise KafkaApiError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1, got {acks}")
                if ctx.api_version < 3:
                    raise KafkaApiError(
                        ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, "Produce v0-2 carries old message sets"
                    )
                topic, partition = logs.partition(topic_data.name, data.index)
                result.log_start_offset = partition.visible_start_offset
                throttle_ms = max(throttle_ms, logs.admission(topic))  # raises past a bound: nothing stored
                records = data.records or b""
                if ctx.api_version < 7 and first_batch_codec(records) == CODEC_ZSTD:
                    raise KafkaApiError(  # as Kafka's ProduceRequest.validateRecords (zstd came with v7)
                        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"Produce v{ctx.api_version} may not use zstd (v7+)"
                    )
                enforcer = ctx.broker.enforcer
                if enforcer is not None and records and enforcer.applies(topic):
                    records = await enforcer.enforce(topic, records, topic.config.max_message_bytes, data.index)
                appended, done = logs.append(topic, partition, records)
            except KafkaApiError as exc:
                result.error_code = int(exc.code)
                result.error_message = exc.message
                if exc.record_errors:
                    result.record_errors = [
                        PartitionResponse.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                        for i, m in exc.record_errors
                    ]
                continue
            result.base_offset = appended.base_offset
            result.log_append_time_ms = appended.log_append_time
            pending.append((result, done))
        responses.append(
            ProduceResponse.TopicProduceResponse(name=topic_data.name, partition_responses=partition_responses)
        )
    if acks == 0:
        return None
    for result, done in pending:
        try:
            await done
        except KafkaApiError as exc:
            result.error_code = int(exc.code)
            result.base_offset = -1
    global _drop_responses_left
    if _drop_responses_left > 0 and pending:
        _drop_responses_left -= 1
        raise ConnectionAbortedError("ICELOG_TEST_DROP_PRODUCE_RESPONSES: dropping the connection unanswered")
    if throttle_ms and ctx.api_version < 6:
        # Before KIP-219 (Produce v6) the broker throttles by answering late; newer clients wait themselves.
        await asyncio.sleep(throttle_ms / 1000)
    return ProduceResponse(responses=responses, throttle_time_ms=throttle_ms)
