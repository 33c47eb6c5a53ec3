"""Data enforcement on produce: add the registry envelope (coerce) and refuse payloads that do not parse.

Only topics whose `icelog.schema.<side>.coerce` or `.on.parse.error=reject` is set on a side with a
subject pay anything: `Enforcer.applies` is a dict look-up for every other topic, and their batches are
never decompressed. Schemas come from a `SchemaSource` (the embedded registry, or an external one over
HTTP). Compiled schemas are cached by id (immutable); a subject's latest id for `registry_cache_ttl_ms`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.message import DecodeError

try:  # aiokafka's compiled (Cython) record reader and builder: several times kafka-python's pure ones
    from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder
except ImportError:  # pragma: no cover - aiokafka without its extension
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from icelog.errors import ErrorCode, KafkaApiError
from icelog.log.batch import ATTR_COMPRESSION_MASK, parse_produced_batches
from icelog.schema.protobuf_schema import (
    InvalidSchemaError,
    compile_schema,
    encode_envelope,
    main_file_of,
    message_descriptor,
    message_indexes_of,
    parse_envelope,
)
from icelog.topic_configs.schema import SIDES, SideSchemaConfig, side_config

_PARSER_CACHE_SIZE = 4096


class SchemaSource(Protocol):
    """Where enforcement gets schemas: the embedded registry or an external one."""

    async def latest_id(self, subject: str) -> int | None:
        """The schema id of the subject's latest version, or None if the subject has none."""

    async def descriptor_set(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        """The compiled schema with this id (InvalidSchemaError if there is none)."""


class LocalSchemaSource:
    """The embedded registry (store reads inline; protoc runs in a thread on a cold cache)."""

    def __init__(self, service: Any) -> None:
        self.service = service  # RegistryService; not imported here to keep this module free of aiohttp

    async def latest_id(self, subject: str) -> int | None:
        schema_id: int | None = self.service.latest_schema_id(subject)
        return schema_id

    async def descriptor_set(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        from icelog.schema.registry.service import RegistryError

        try:
            fds: descriptor_pb2.FileDescriptorSet = await asyncio.get_running_loop().run_in_executor(
                None, self.service.compiled, schema_id
            )
        except RegistryError as exc:
            raise InvalidSchemaError(exc.message) from None
        return fds


class HttpSchemaSource:
    """An external Confluent-compatible registry (`registry_url`)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: Any = None

    async def _get(self, path: str) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._session.get(self.url + path) as response:
            body = await response.json(content_type=None)
            if response.status == 404:
                return None
            if response.status != 200:
                raise InvalidSchemaError(f"schema registry {self.url}{path}: {response.status} {body}")
            return body

    async def latest_id(self, subject: str) -> int | None:
        body = await self._get(f"/subjects/{quote(subject, safe='')}/versions/latest")
        return None if body is None else int(body["id"])

    async def descriptor_set(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        body = await self._get(f"/schemas/ids/{schema_id}")
        if body is None:
            raise InvalidSchemaError(f"schema {schema_id} not found in {self.url}")
        references: dict[str, str] = {}
        pending = list(body.get("references") or [])
        while pending:
            ref = pending.pop()
            if ref["name"] in references:
                continue
            found = await self._get(f"/subjects/{quote(ref['subject'], safe='')}/versions/{int(ref['version'])}")
            if found is None:
                raise InvalidSchemaError(f"reference {ref} not found in {self.url}")
            references[ref["name"]] = found["schema"]
            pending.extend(found.get("references") or [])
        loop = asyncio.get_running_loop()
        fds: descriptor_pb2.FileDescriptorSet = await loop.run_in_executor(
            None, compile_schema, body["schema"], references
        )
        return fds

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class InvalidRecordsError(KafkaApiError):
    """Records of a batch failed enforcement; Produce answers INVALID_RECORD with per-record errors."""

    def __init__(self, record_errors: list[tuple[int, str]]) -> None:
        first = record_errors[0][1]
        super().__init__(ErrorCode.INVALID_RECORD, f"{len(record_errors)} record(s) failed schema checks: {first}")
        self.record_errors = record_errors


@dataclass
class _Parser:
    """Validates payloads of one (schema id, message) pair."""

    indexes: list[int]
    parse: Callable[[bytes], object]


@dataclass
class TopicPlan:
    """What enforcement does for one topic's current configs."""

    record: object  # the TopicRecord the plan was made for (replaced on every config change)
    sides: list[SideSchemaConfig] = field(default_factory=list)


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
        self._fds: dict[int, descriptor_pb2.FileDescriptorSet] = {}
        self._parsers: dict[tuple[int, tuple[int, ...] | str], _Parser] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def applies(self, topic: Any) -> bool:
        """Whether produced batches of this topic (a TopicState) need enforcement at all."""
        plan = self._plans.get(topic.name)
        if plan is None or plan.record is not topic.record:
            configs = {**self.topic_defaults, **topic.record.configs}
            sides = [side_config(topic.name, s, configs) for s in SIDES]
            active = [s for s in sides if s.subject is not None and (s.coerce or s.reject_on_parse_error)]
            plan = TopicPlan(topic.record, active)
            self._plans[topic.name] = plan
        return bool(plan.sides)

    async def enforce(self, topic: Any, records: bytes, max_batch_bytes: int) -> bytes:
        """Check (and with coerce, rewrite) one partition's produced batches; raise InvalidRecordsError."""
        sides = self._plans[topic.name].sides
        # One lock per topic: while a cold look-up waits, later produces to the topic queue behind it, so
        # batches of an idempotent producer still reach the log in the order they arrived.
        lock = self._locks.setdefault(topic.name, asyncio.Lock())
        async with lock:
            return await self._enforce(sides, records, max_batch_bytes)

    async def _enforce(self, sides: Sequence[SideSchemaConfig], records: bytes, max_batch_bytes: int) -> bytes:
        view = memoryview(records)
        out: list[bytes] = []
        errors: list[tuple[int, str]] = []
        changed = False
        index = 0
        # A subject's latest id is looked up once per request, not per record.
        latest = {s.side: await self._latest_id(s.subject) for s in sides if s.subject is not None}
        for header in parse_produced_batches(records, max_batch_bytes):
            raw = bytes(view[header.position : header.position + header.size])
            batch = DefaultRecordBatch(raw)
            rows = []
            batch_changed = False
            for record in batch:
                key, value = record.key, record.value
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
                rows.append((record.offset - batch.base_offset, record.timestamp, key, value, record.headers))
                index += 1
            if batch_changed:
                changed = True
                out.append(_rebuild(batch, header.attributes, rows))
            else:
                out.append(raw)
        if errors:
            raise InvalidRecordsError(errors)
        return b"".join(out) if changed else records

    async def _check(self, side: SideSchemaConfig, payload: bytes, latest: int | None) -> bytes | None:
        """Validate one payload; return the payload with an envelope added (coerce), or None if unchanged.

        `latest` is the subject's latest schema id (None: the subject has no schema).
        """
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
        fds = self._fds.get(schema_id)
        if fds is None:
            try:
                fds = self._fds[schema_id] = await self.source.descriptor_set(schema_id)
            except InvalidSchemaError:
                raise
            except Exception as exc:
                raise KafkaApiError(ErrorCode.UNKNOWN_SERVER_ERROR, f"schema registry: {exc}") from exc
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


def _rebuild(batch: Any, attributes: int, rows: list[tuple[int, int, Any, Any, Any]]) -> bytes:
    """Re-encode a batch with new payloads, keeping offsets deltas, timestamps, headers, producer state
    and compression (the CRC is recomputed)."""
    builder = DefaultRecordBatchBuilder(
        2, attributes & ATTR_COMPRESSION_MASK, batch.is_transactional, batch.producer_id, batch.producer_epoch,
        batch.base_sequence, 1 << 30,
    )
    for offset_delta, timestamp, key, value, headers in rows:
        builder.append(offset_delta, timestamp, key, value, headers)
    return bytes(builder.build())
