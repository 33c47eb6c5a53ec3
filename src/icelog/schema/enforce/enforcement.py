"""Data enforcement on produce: add the registry envelope (coerce), refuse payloads that do not parse, and keep
records of a topic with `icelog.table.bucket.key` in the partition equal to their Iceberg bucket (buckets.py).

Only topics whose `icelog.schema.<side>.coerce` or `.on.parse.error=reject` is set on a side with a
subject, or that have a bucket key, pay anything: `Enforcer.applies` is a dict look-up for every other topic,
and their batches are never decompressed. Schemas come from a `SchemaSource` (the embedded registry, or an
external one over HTTP). Compiled schemas are cached by id (immutable); a subject's latest id for
`registry_cache_ttl_ms`.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor_pb2 import FileDescriptorSet
from google.protobuf.message import DecodeError

try:  # aiokafka's compiled (Cython) record builder: several times kafka-python's pure one
    from aiokafka.record._crecords import DefaultRecordBatchBuilder
except ImportError:  # pragma: no cover - aiokafka without its extension
    from kafka.record.default_records import DefaultRecordBatchBuilder

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.batch import BatchHeader
from icelog.records.record_format import ATTR_COMPRESSION_MASK
from icelog.records.walk import INLINE_INFLATION, RecordBatch, read_batch
from icelog.schema.avro_schema import AvroSchema
from icelog.schema.codec import avro_codec, json_codec
from icelog.schema.codec.record_decode import ENVELOPE_BYTES, split_envelope
from icelog.schema.compiled import CompiledSchema, record_fields
from icelog.schema.enforce.buckets import BucketLocator
from icelog.schema.protobuf_schema import (
    InvalidSchemaError,
    encode_envelope,
    main_file_of,
    message_descriptor,
    message_indexes_of,
    parse_envelope,
)
from icelog.schema.registry_client import RegistryClient, SchemaNotFoundError
from icelog.table.config import BUCKET_KEY, KEY_BYTES, table_config
from icelog.table.iceberg_types import Column
from icelog.table.protobuf_types import message_columns
from icelog.table.rules import BUCKETABLE, check_spec_columns
from icelog.topics import SIDES, SideSchemaConfig, side_config

_PARSER_CACHE_SIZE = 4096
_SLICE = 1024  # records checked between two turns of the event loop


class SchemaSource(Protocol):
    """Where enforcement gets schemas: the embedded registry or an external one."""

    async def latest_id(self, subject: str) -> int | None:
        """The schema id of the subject's latest version, or None if the subject has none."""

    async def compiled(self, schema_id: int) -> CompiledSchema:
        """The compiled schema with this id (InvalidSchemaError if there is none)."""


class EmbeddedRegistry(Protocol):
    """What enforcement asks the embedded registry (registry/service.py's RegistryService, not imported here to
    keep this module free of aiohttp)."""

    def latest_schema_id(self, subject: str) -> int | None: ...
    def compiled(self, schema_id: int) -> CompiledSchema: ...


class LocalSchemaSource:
    """The embedded registry (store reads inline; protoc runs in a thread on a cold cache)."""

    def __init__(self, service: EmbeddedRegistry) -> None:
        self.service = service

    async def latest_id(self, subject: str) -> int | None:
        schema_id: int | None = self.service.latest_schema_id(subject)
        return schema_id

    async def compiled(self, schema_id: int) -> CompiledSchema:
        from icelog.schema.registry.service import RegistryError

        try:
            compiled: CompiledSchema = await asyncio.get_running_loop().run_in_executor(
                None, self.service.compiled, schema_id
            )
        except RegistryError as exc:
            raise InvalidSchemaError(exc.message) from None
        return compiled


class HttpSchemaSource:
    """An external Confluent-compatible registry (`registry_url`): the shared registry client, off the event loop."""

    def __init__(self, url: str) -> None:
        self.client = RegistryClient(url)

    async def latest_id(self, subject: str) -> int | None:
        return await asyncio.to_thread(self.client.latest_id, subject)

    async def compiled(self, schema_id: int) -> CompiledSchema:
        try:
            return await asyncio.to_thread(self.client.by_id, schema_id)
        except SchemaNotFoundError as exc:
            raise InvalidSchemaError(str(exc)) from None


class TopicConfigs(Protocol):
    """A topic's stored record (meta/store.py's TopicRecord), replaced on every config change."""

    @property
    def configs(self) -> Mapping[str, str]: ...


class ProducedTopic(Protocol):
    """A topic as the broker serves it (log/manager.py's TopicState, which this layer does not import)."""

    @property
    def name(self) -> str: ...
    @property
    def record(self) -> TopicConfigs: ...
    @property
    def partitions(self) -> Sized: ...


class InvalidRecordsError(KafkaApiError):
    """Records of a batch failed enforcement; Produce answers INVALID_RECORD with per-record errors."""

    def __init__(self, record_errors: list[tuple[int, str]], what: str = "failed schema checks") -> None:
        first = record_errors[0][1]
        super().__init__(ErrorCode.INVALID_RECORD, f"{len(record_errors)} record(s) {what}: {first}")
        self.record_errors = record_errors


@dataclass
class _Parser:
    """Validates payloads of one (schema id, message) pair."""

    indexes: list[int]
    parse: Callable[[bytes], object]


@dataclass
class TopicPlan:
    """What enforcement does for one topic's current configs."""

    record: TopicConfigs  # the TopicRecord the plan was made for (replaced on every config change)
    sides: list[SideSchemaConfig] = field(default_factory=list)
    bucket_key: str | None = None  # icelog.table.bucket.key: each record's partition must be its Iceberg bucket
    schema_sides: list[SideSchemaConfig] = field(default_factory=list)  # value then key, those with a subject


class Enforcer:
    """Applies a topic's schema configs to produced record batches."""

    def __init__(
        self, source: SchemaSource, latest_ttl_ms: int, topic_defaults: Mapping[str, str] | None = None
    ) -> None:
        self.source = source
        self.topic_defaults = dict(topic_defaults or {})  # broker-wide icelog.schema.* defaults
        self.latest_ttl_s = latest_ttl_ms / 1000
        self._plans: dict[str, TopicPlan] = {}
        self._latest: dict[str, tuple[int | None, float]] = {}
        self._compiled: dict[int, CompiledSchema] = {}
        self._parsers: dict[tuple[int, tuple[int, ...] | str], _Parser] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.buckets = BucketLocator()

    def applies(self, topic: ProducedTopic) -> bool:
        """Whether produced batches of this topic (a TopicState) need enforcement at all."""
        plan = self._plans.get(topic.name)
        if plan is None or plan.record is not topic.record:
            configs = {**self.topic_defaults, **topic.record.configs}
            sides = [side_config(topic.name, s, configs) for s in SIDES]
            active = [s for s in sides if s.subject is not None and (s.coerce or s.reject_on_parse_error)]
            try:
                bucket_key = table_config(topic.record.configs, self.topic_defaults).bucket_key
            except ValueError:  # refused when the topic was created; nothing to keep here
                bucket_key = None
            with_subject = [s for s in reversed(sides) if s.subject is not None]
            plan = TopicPlan(topic.record, active, bucket_key, with_subject)
            self._plans[topic.name] = plan
        return bool(plan.sides) or plan.bucket_key is not None

    async def enforce(
        self, topic: ProducedTopic, records: bytes, batches: list[BatchHeader], partition: int = -1
    ) -> bytes:
        """Check (and with coerce, rewrite) one partition's produced batches, `batches` as the broker validated
        them (`LogManager.validate`); raise InvalidRecordsError."""
        plan = self._plans[topic.name]
        # One lock per topic: while a cold look-up waits, later produces to the topic queue behind it, so
        # batches of an idempotent producer still reach the log in the order they arrived.
        lock = self._locks.setdefault(topic.name, asyncio.Lock())
        async with lock:
            return await self._enforce(plan, records, batches, partition, len(topic.partitions))

    async def _enforce(
        self, plan: TopicPlan, records: bytes, batches: list[BatchHeader], partition: int, buckets: int
    ) -> bytes:
        sides = plan.sides
        view = memoryview(records)
        out: list[bytes] = []
        errors: list[tuple[int, str]] = []
        misplaced: list[tuple[int, str]] = []
        changed = False
        index = 0
        # A subject's latest id is looked up once per request, not per record.
        latest = {s.side: await self._latest_id(s.subject) for s in sides if s.subject is not None}
        if plan.bucket_key is not None:
            for s in plan.schema_sides:
                if s.side not in latest and s.subject is not None and plan.bucket_key != KEY_BYTES:
                    latest[s.side] = await self._latest_id(s.subject)
        for header in batches:
            raw = bytes(view[header.position : header.position + header.size])
            # Big batches are read on a worker thread, and the loop below gives other clients their turn
            # every _SLICE records: no request holds the event loop for long.
            if header.records_size <= INLINE_INFLATION:
                batch = read_batch(raw)
            else:
                batch = await asyncio.to_thread(read_batch, raw)
            rows = []
            batch_changed = False
            for offset, timestamp, key, value, headers in batch.records:
                if index % _SLICE == _SLICE - 1:
                    await asyncio.sleep(0)
                for side in sides:
                    payload = key if side.side == "key" else value
                    if payload is None:
                        continue
                    try:
                        fixed = await self._check(side, bytes(payload), latest[side.side])
                    except InvalidSchemaError as exc:
                        if side.reject_on_parse_error:
                            errors.append((index, f"{side.side}: {exc}"))
                        continue
                    if fixed is not None:
                        batch_changed = True
                        if side.side == "key":
                            key = fixed
                        else:
                            value = fixed
                if plan.bucket_key is not None:
                    problem = await self._misplaced(plan, key, value, latest, partition, buckets)
                    if problem is not None:
                        misplaced.append((index, problem))
                rows.append((offset - batch.base_offset, timestamp, key, value, headers))
                index += 1
            if batch_changed:
                changed = True
                out.append(_rebuild(batch, header.attributes, rows))
            else:
                out.append(raw)
        if errors:
            raise InvalidRecordsError(errors)
        if misplaced:
            raise InvalidRecordsError(misplaced, "are not in the partition of their Iceberg bucket")
        return b"".join(out) if changed else records

    async def _misplaced(
        self, plan: TopicPlan, key: Any, value: Any, latest: Mapping[str, int | None], partition: int, buckets: int
    ) -> str | None:
        """Why a record is refused by its topic's bucket key (None: it is in its bucket's partition)."""
        column = plan.bucket_key
        assert column is not None
        found: tuple[str, Any] | None = None
        if column == KEY_BYTES:
            found = ("binary", None if key is None else bytes(key))
        for side in [] if found is not None else plan.schema_sides:
            payload = key if side.side == "key" else value
            if payload is None:
                continue
            payload = bytes(payload)
            envelope = parse_envelope(payload)
            which: tuple[int, ...] | str
            known = latest.get(side.side)
            if known is not None and not isinstance(await self._compiled_schema(known), FileDescriptorSet):
                framed = await self._record_envelope(payload)  # Avro / JSON: no message indexes
                which = ""
                schema_id, body = (known, payload) if framed is None else (framed, payload[ENVELOPE_BYTES:])
            elif envelope is not None:
                schema_id, indexes, start = envelope
                which, body = tuple(indexes), payload[start:]
            else:
                if known is None:
                    continue
                schema_id, which, body = known, side.message or "", payload
            try:
                compiled = await self._compiled_schema(schema_id)
                reader = self.buckets.reader(compiled, schema_id, which, column)
                if reader is None:
                    continue
                found = (reader.signature, reader.read(body))
            except Exception as exc:  # protobuf, fastavro and json raise their own types for a bad body
                return f"cannot read {column} from the {side.side} to find its bucket ({BUCKET_KEY}): {exc}"
            break
        if found is None:
            return f"no schema of the key or value has a field {column!r} ({BUCKET_KEY}), so the record has no bucket"
        signature, cell = found
        if cell is None:
            return f"{column} is null; a record of a topic with {BUCKET_KEY} needs a value to choose its partition"
        try:
            bucket = self.buckets.bucket(signature, cell, buckets)
        except ValueError as exc:
            return str(exc)
        if bucket == partition:
            return None
        return (
            f"{column}={cell!r} belongs in partition {bucket} (Iceberg bucket({column}, {buckets})), not {partition}; "
            "partition records with Iceberg's bucket function (docs/table-layout.md: Table topics)"
        )

    async def check_table_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        """At CreateTopics: refuse (INVALID_CONFIG) partition.by / bucket.key columns the subjects' schemas lack.

        Only when a subject already has a schema; otherwise the archive checks at its first pass (topic status).
        Without a configured message every message of the schema is a candidate (the produced one is not known).
        """
        merged = {**self.topic_defaults, **configs}
        try:
            table = table_config(merged)
        except ValueError:
            return  # the topic config validation refuses it with the reason
        if not table.partition_by and table.bucket_key is None:
            return
        columns: dict[str, Column] = {}
        found_schema = False
        for side in SIDES:
            config = side_config(topic, side, merged)
            if config.subject is None:
                continue
            try:
                schema_id = await self.source.latest_id(config.subject)
                if schema_id is None:
                    continue
                compiled = await self._compiled_schema(schema_id)
            except InvalidSchemaError:
                continue
            found_schema = True
            if not isinstance(compiled, descriptor_pb2.FileDescriptorSet):
                for column in record_fields(compiled, side):
                    if column.name not in columns or column.signature in BUCKETABLE:
                        columns[column.name] = column
                continue
            fds = compiled
            main = main_file_of(fds)
            names = [config.message] if config.message else [
                (f"{main.package}." if main.package else "") + m.name for m in main.message_type
            ]
            for name in names:
                for column in message_columns(message_descriptor(fds, None, message_name=name)):
                    if column.name not in columns or column.signature in BUCKETABLE:
                        columns[column.name] = column
        if not found_schema:
            return
        columns[KEY_BYTES] = Column(KEY_BYTES, "binary")
        try:
            check_spec_columns(list(columns.values()), table.partition_by, table.bucket_key)
        except ValueError as exc:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG, str(exc)) from None

    async def _compiled_schema(self, schema_id: int) -> CompiledSchema:
        found = self._compiled.get(schema_id)
        if found is None:
            try:
                found = self._compiled[schema_id] = await self.source.compiled(schema_id)
            except InvalidSchemaError:
                raise
            except Exception as exc:
                raise KafkaApiError(ErrorCode.UNKNOWN_SERVER_ERROR, f"schema registry: {exc}") from exc
        return found

    async def _descriptor_set(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        compiled = await self._compiled_schema(schema_id)
        if not isinstance(compiled, descriptor_pb2.FileDescriptorSet):
            raise InvalidSchemaError(f"schema id {schema_id} is not a Protobuf schema")
        return compiled

    async def _record_envelope(self, payload: bytes) -> int | None:
        """The schema id of an Avro/JSON payload's envelope, or None when the payload has none.

        An Avro body may itself start with byte 0 (a null union branch, an int 0): the bytes are an envelope
        only when they name a registered Avro or JSON schema.
        """
        envelope = split_envelope(payload)
        if envelope is None:
            return None
        try:
            compiled = await self._compiled_schema(envelope[0])
        except InvalidSchemaError:
            return None
        return None if isinstance(compiled, descriptor_pb2.FileDescriptorSet) else envelope[0]

    async def _check(self, side: SideSchemaConfig, payload: bytes, latest: int | None) -> bytes | None:
        """Validate one payload; return the payload with an envelope added (coerce), or None if unchanged.

        `latest` is the subject's latest schema id (None: the subject has no schema).
        """
        if latest is not None and not isinstance(await self._compiled_schema(latest), descriptor_pb2.FileDescriptorSet):
            return await self._check_record(side, payload, latest)
        envelope = parse_envelope(payload)
        if envelope is not None:
            schema_id, indexes, offset = envelope
            if side.reject_on_parse_error:
                parser = await self._parser(schema_id, tuple(indexes))
                parser.parse(payload[offset:])
            return None
        if latest is None:
            if side.required:
                raise InvalidSchemaError(f"subject {side.subject} has no schema")
            return None  # `auto` and no subject: the side is raw bytes
        parser = await self._parser(latest, side.message or ())
        if side.reject_on_parse_error:
            parser.parse(payload)
        return encode_envelope(latest, parser.indexes) + payload if side.coerce else None

    async def _check_record(self, side: SideSchemaConfig, payload: bytes, latest: int) -> bytes | None:
        """`_check` for a side whose subject holds Avro or JSON schemas (envelope: magic byte and schema id)."""
        schema_id = await self._record_envelope(payload)
        body = payload if schema_id is None else payload[ENVELOPE_BYTES:]
        if side.reject_on_parse_error:
            compiled = await self._compiled_schema(latest if schema_id is None else schema_id)
            if isinstance(compiled, AvroSchema):
                problem = avro_codec.payload_problem(compiled, body)
            else:
                assert not isinstance(compiled, descriptor_pb2.FileDescriptorSet)
                problem = json_codec.payload_problem(compiled, body)
            if problem is not None:
                raise InvalidSchemaError(problem)
        if schema_id is None and side.coerce:
            return struct.pack(">bI", 0, latest) + payload
        return None

    async def _latest_id(self, subject: str) -> int | None:
        cached = self._latest.get(subject)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            schema_id = await self.source.latest_id(subject)
        except Exception as exc:  # registry down or unreachable: a broker-side failure, not a bad record
            raise KafkaApiError(ErrorCode.UNKNOWN_SERVER_ERROR, f"schema registry: {exc}") from exc
        self._latest[subject] = (schema_id, now + self.latest_ttl_s)
        return schema_id

    async def _parser(self, schema_id: int, which: tuple[int, ...] | str) -> _Parser:
        key = (schema_id, which)
        parser = self._parsers.get(key)
        if parser is not None:
            return parser
        fds = await self._descriptor_set(schema_id)
        if isinstance(which, str):
            descriptor = message_descriptor(fds, None, message_name=which)
            indexes = message_indexes_of(main_file_of(fds), descriptor.full_name)
        else:
            descriptor = message_descriptor(fds, None, message_indexes=list(which) or [0])
            indexes = list(which) or [0]
        message_class = message_factory.GetMessageClass(descriptor)

        def parse(body: bytes) -> object:
            message = message_class()
            try:
                message.ParseFromString(body)
            except (DecodeError, RuntimeError, ValueError) as exc:
                raise InvalidSchemaError(f"does not parse as {descriptor.full_name}: {exc}") from None
            return message

        if len(self._parsers) >= _PARSER_CACHE_SIZE:
            self._parsers.clear()
        parser = self._parsers[key] = _Parser(indexes, parse)
        return parser


def _rebuild(batch: RecordBatch, attributes: int, rows: list[tuple[int, int, Any, Any, Any]]) -> bytes:
    """Re-encode a batch with new payloads, keeping offsets deltas, timestamps, headers, producer state
    and compression (the CRC is recomputed)."""
    builder = DefaultRecordBatchBuilder(
        2, attributes & ATTR_COMPRESSION_MASK, batch.is_transactional, batch.producer_id, batch.producer_epoch,
        batch.base_sequence, 1 << 30,
    )
    for offset_delta, timestamp, key, value, headers in rows:
        builder.append(offset_delta, timestamp, key, value, list(headers))  # aiokafka's builder takes only a list
    return bytes(builder.build())
