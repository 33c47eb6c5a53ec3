"""Produce: validate batches, assign offsets, wait for the group commit (acks=1/all).

Records are checked where they arrive, on the event loop, while that is cheap: up to INLINE_CHECK_COST
per request, as their headers declare it (`batch.check_cost`), and never more than a payload declares.
The others (bombs, batches declaring more, payloads that do not say past the request's share) are checked
in the validation process (`wire/validator.py`), so they delay no other client. A Produce's records may
decompress to MAX_REQUEST_INFLATION together, each batch's to MAX_UNCOMPRESSED_BYTES (what librdkafka
reads back). The Produce requests of one connection append in the order they were sent (`Connection.produce_turn`).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer import ProduceResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.batch import BatchHeader, check_cost, first_batch_codec
from icelog.records.record_format import CODEC_ZSTD
from icelog.records.walk import CHECK_COST, MAX_UNCOMPRESSED_BYTES, InflationLimitError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

    from icelog.log.appends import AppendResult
    from icelog.log.manager import LogManager, TopicState
    from icelog.log.partition import PartitionLog
    from icelog.wire.validator import Validator

PartitionResponse = ProduceResponse.TopicProduceResponse.PartitionProduceResponse

# What the records of one Produce may decompress to, over all its partitions (each batch's alone: at most
# MAX_UNCOMPRESSED_BYTES): the work one request can ask of the validation process.
MAX_REQUEST_INFLATION = 256 << 20
# The check work one request may do on the event loop, in bytes of uncompressed records (`batch.check_cost`):
# 64 MiB is ~16 ms here (64 MiB uncompressed, ~21 MiB of lz4 or snappy, 16 MiB of zstd, 5 MiB of gzip). A
# client's request of 1 MB batches for a dozen partitions stays here (a trip to the validation process per
# request cost produce throughput 60 %); a bomb, or a batch declaring more than that, goes there.
INLINE_CHECK_COST = 64 << 20
_DEAREST = max(CHECK_COST.values())


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
    """The decompressed bytes a request's records may still take, and the check work left to the event loop."""

    def __init__(self) -> None:
        self.left = MAX_REQUEST_INFLATION
        self.inline_left = INLINE_CHECK_COST

    async def validate(
        self, logs: LogManager, validator: Validator, topic: TopicState, records: bytes
    ) -> list[BatchHeader]:
        """`records` checked for `topic` (LogManager.validate): here if what their headers declare costs no more
        than the request's share of the event loop, else in the validation process."""
        cost = check_cost(records)
        batches = None
        if cost is None and self.inline_left > 0:
            # A payload that does not say (zstd-jni's frames): tried here, as if the dearest codec, up to the
            # share left; past it, in the validation process.
            limit = min(self.left, self.inline_left // _DEAREST)
            try:
                batches = logs.validate(topic, records, limit)
            except InflationLimitError as exc:
                if limit == self.left:
                    raise self._refusal(exc) from None
                self.inline_left = 0
            else:
                self.inline_left -= sum(b.records_size for b in batches) * _DEAREST
        elif cost is not None and cost <= self.inline_left:
            self.inline_left -= cost
            try:
                batches = logs.validate(topic, records, self.left)
            except InflationLimitError as exc:
                raise self._refusal(exc) from None
        if batches is None:
            if self.left <= 0:
                raise self._spent()
            config = topic.config
            try:
                batches = await validator.check(
                    records, config.max_message_bytes, config.compacted, config.log_append_time, self.left,
                    config.timestamp_window(int(time.time() * 1000)),
                )
            except InflationLimitError as exc:
                self.left -= exc.limit  # the work it took to find out
                raise self._refusal(exc) from None
        self.left -= sum(b.records_size for b in batches)
        return batches

    def _refusal(self, exc: InflationLimitError) -> KafkaApiError:
        """What to answer for records past a limit: a batch's own (its limit is MAX_UNCOMPRESSED_BYTES) as it
        is, the request's as the request's."""
        return exc if exc.limit >= MAX_UNCOMPRESSED_BYTES else self._spent()

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
    # Kafka's authorizer: WRITE on the transactional id (else every partition fails), then WRITE per topic
    transactional_id = request.transactional_id if ctx.api_version >= 3 else None
    txn_denied = transactional_id is not None and not ctx.authorize(
        ACLOperation.WRITE, ACLResourceType.TRANSACTIONAL_ID, transactional_id
    )
    for topic_data in request.topic_data:
        partition_responses = []
        topic_denied = txn_denied or not ctx.authorize(ACLOperation.WRITE, ACLResourceType.TOPIC, topic_data.name)
        for data in topic_data.partition_data:
            result = PartitionResponse(index=data.index, error_code=0, base_offset=-1, log_append_time_ms=-1)
            partition_responses.append(result)
            if topic_denied:
                result.error_code = int(
                    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if txn_denied
                    else ErrorCode.TOPIC_AUTHORIZATION_FAILED
                )
                continue
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
    validator = ctx.broker.validator
    enforcer = ctx.broker.enforcer
    for part in parts:
        try:
            part.batches = await inflation.validate(logs, validator, part.topic, part.records)
            if enforcer is not None and enforcer.applies(part.topic):
                enforced = await enforcer.enforce(part.topic, part.records, part.batches, part.result.index)
                if enforced is not part.records:  # coerced: the rewritten batches are checked again
                    part.records = enforced
                    part.batches = await inflation.validate(logs, validator, part.topic, enforced)
        except KafkaApiError as exc:
            _refuse(part.result, exc)
            part.batches = None
    transactions = ctx.broker.transactions
    if transactions is not None and transactional_id is not None:
        for part in parts:  # (a cluster's broker: batches of ids coordinated elsewhere, verified from the store)
            if part.batches is None:
                continue
            try:
                await transactions.verify_remote(transactional_id, part.topic.name, part.partition, part.batches)
            except KafkaApiError as exc:
                _refuse(part.result, exc)
                part.batches = None
    if previous is not None:
        await previous  # the connection's Produce before this one has appended
    pending: list[tuple[ApiMessage, AppendResult, asyncio.Future[None]]] = []
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
        pending.append((part.result, appended, done))
    ctx.connection.pass_turn(mine)
    if acks == 0:
        return None
    for result, appended, done in pending:
        try:
            await done
            result.base_offset = appended.acked_offset  # a sequencing store assigns it at commit
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
