"""Produce: validate batches, assign offsets, wait for the group commit (acks=1/all).

Records are checked where they arrive, on the event loop, while that is cheap: a partition whose records
decompress to at most INLINE_INFLATION. A bigger one (a large batch, or a compression bomb) is checked on
the one validation thread, so it delays no other client; a Produce's records may decompress to
MAX_REQUEST_INFLATION together, each batch's to MAX_UNCOMPRESSED_BYTES (what librdkafka reads back).
The Produce requests of one connection append in the order they were sent (`Connection.produce_turn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer import ProduceResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.batch import BatchHeader, first_batch_codec
from icelog.log.record_format import CODEC_ZSTD
from icelog.log.records import INLINE_INFLATION, MAX_UNCOMPRESSED_BYTES, InflationLimitError
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

    from icelog.log.manager import LogManager, TopicState
    from icelog.log.partition import PartitionLog

PartitionResponse = ProduceResponse.TopicProduceResponse.PartitionProduceResponse

# What the records of one Produce may decompress to, over all its partitions (each batch's alone: at most
# MAX_UNCOMPRESSED_BYTES): the work one request can ask of the validation thread.
MAX_REQUEST_INFLATION = 256 << 20


def _lower_priority() -> None:
    """The validation thread runs only when a core has nothing else to do (Linux's SCHED_IDLE, per thread):
    when the CPU is short, the event loop (everyone else's requests) goes first."""
    with contextlib.suppress(OSError, AttributeError):  # elsewhere the thread keeps the process's priority
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))


# One thread: big requests are checked one after another, and the other core stays the event loop's.
_VALIDATOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="produce-validate", initializer=_lower_priority)

# Test hook (fault injection for the idempotence tests): drop the connection instead of answering the
# first N Produce requests that appended data, after the data is durable, so clients must retry.
_drop_responses_left = int(os.environ.get("ICELOG_TEST_DROP_PRODUCE_RESPONSES", "0") or 0)


@dataclass
class _Part:
    """One partition of the request, on its way to the log."""

    result: ApiMessage  # a PartitionResponse
    topic: TopicState
    partition: PartitionLog
    records: bytes
    batches: list[BatchHeader] | None = None


class _Inflation:
    """The decompressed bytes a request's records may still take."""

    def __init__(self) -> None:
        self.left = MAX_REQUEST_INFLATION

    async def validate(self, logs: LogManager, topic: TopicState, records: bytes) -> list[BatchHeader]:
        """`records` checked for `topic` (LogManager.validate): here if they are small once decompressed, else
        on the validation thread."""
        left = self.left
        try:
            batches = logs.validate(topic, records, min(INLINE_INFLATION, left))
        except InflationLimitError:
            if left <= INLINE_INFLATION:
                raise self._spent() from None
            try:
                batches = await asyncio.get_running_loop().run_in_executor(
                    _VALIDATOR, logs.validate, topic, records, left
                )
            except InflationLimitError as exc:
                raise (exc if exc.limit >= MAX_UNCOMPRESSED_BYTES else self._spent()) from None
        self.left -= sum(b.records_size for b in batches)
        return batches

    @staticmethod
    def _spent() -> KafkaApiError:
        return KafkaApiError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the records of one Produce may decompress to {MAX_REQUEST_INFLATION} bytes, and these are more",
        )


@handles(ApiKey.Produce)
async def produce(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    previous, mine = ctx.connection.produce_turn()
    try:
        return await _produce(ctx, request, previous, mine)
    finally:
        ctx.connection.pass_turn(mine)


def _refuse(result: ApiMessage, exc: KafkaApiError) -> None:
    result.error_code = int(exc.code)
    result.error_message = exc.message
    if exc.record_errors:
        result.record_errors = [
            PartitionResponse.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
            for i, m in exc.record_errors
        ]


async def _produce(
    ctx: RequestContext, request: ApiMessage, previous: asyncio.Future[None] | None, mine: asyncio.Future[None]
) -> ApiMessage:
    logs = ctx.broker.logs
    acks = request.acks
    responses = []
    parts: list[_Part] = []
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
            except KafkaApiError as exc:
                _refuse(result, exc)
                continue
            parts.append(_Part(result, topic, partition, records))
        responses.append(
            ProduceResponse.TopicProduceResponse(name=topic_data.name, partition_responses=partition_responses)
        )
    inflation = _Inflation()
    enforcer = ctx.broker.enforcer
    for part in parts:
        try:
            part.batches = await inflation.validate(logs, part.topic, part.records)
            if enforcer is not None and enforcer.applies(part.topic):
                enforced = await enforcer.enforce(part.topic, part.records, part.batches, part.result.index)
                if enforced is not part.records:  # coerced: the rewritten batches are checked again
                    part.records = enforced
                    part.batches = await inflation.validate(logs, part.topic, enforced)
        except KafkaApiError as exc:
            _refuse(part.result, exc)
            part.batches = None
    if previous is not None:
        await previous  # the connection's Produce before this one has appended
    pending: list[tuple[ApiMessage, asyncio.Future[None]]] = []
    for part in parts:
        if part.batches is None:
            continue
        try:
            appended, done = logs.append(part.topic, part.partition, part.records, part.batches)
        except KafkaApiError as exc:
            _refuse(part.result, exc)
            continue
        part.result.base_offset = appended.base_offset
        part.result.log_append_time_ms = appended.log_append_time
        pending.append((part.result, done))
    ctx.connection.pass_turn(mine)
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
