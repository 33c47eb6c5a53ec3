"""Request/response classes from kafka-python 3's generated protocol (Kafka's own JSON message specs), and the few it
lacks from `wire/messages` (built the same way)."""

from __future__ import annotations

import importlib
import io
import pkgutil
import struct
from dataclasses import dataclass
from typing import Any

import kafka.protocol as _protocol
from kafka.protocol.api_message import ApiMessage

from icelog.wire import messages  # noqa: F401  (KIP-848's APIs: their classes join kafka-python's below)

_REQUEST_PREFIX = struct.Struct(">hhi")


def _load_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    for module in pkgutil.walk_packages(_protocol.__path__, "kafka.protocol."):
        if ".old" in module.name or "generate" in module.name:
            continue
        importlib.import_module(module.name)

    def subclasses(cls: type) -> list[Any]:
        out: list[Any] = []
        sub: Any
        for sub in cls.__subclasses__():
            out.append(sub)
            out.extend(subclasses(sub))
        return out

    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    for cls in subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        (requests if cls.is_request() else responses)[cls.API_KEY] = cls
    return requests, responses


REQUEST_CLASSES, RESPONSE_CLASSES = _load_classes()


@dataclass(frozen=True, slots=True)
class RequestPrefix:
    """The fixed start of every request header, readable before the version is known to be valid."""

    api_key: int
    api_version: int
    correlation_id: int


def read_prefix(frame: bytes) -> RequestPrefix:
    """api_key, api_version and correlation_id of a request frame (ValueError if too short)."""
    if len(frame) < _REQUEST_PREFIX.size:
        raise ValueError(f"request of {len(frame)} bytes is shorter than a request header")
    return RequestPrefix(*_REQUEST_PREFIX.unpack_from(frame))


def decode_request(frame: bytes, api_key: int, api_version: int) -> ApiMessage:
    """Decode header and body; raises on malformed input.

    kafka-python's decoder slices strings and bytes without checking that the frame is long enough, so a
    request cut short would decode as a different one (a topic name missing its last letters, which
    Metadata would then auto-create). This runs the same compiled decoder but keeps its end position, to
    refuse any request whose fields run past the end of the frame.
    """
    cls: Any = REQUEST_CLASSES[api_key]
    header_buffer = io.BytesIO(frame)
    header = cls.parse_header(header_buffer, version=api_version)
    flexible = cls.flexible_version_q(api_version)
    decode_body = cls._struct.compiled_decode_from(
        api_version, compact=flexible, tagged=flexible, data_class=cls
    )
    request, end = decode_body(memoryview(frame), header_buffer.tell())
    if end > len(frame):
        raise ValueError(f"fields run {end - len(frame)} bytes past the end of the {len(frame)}-byte request")
    request._header = header
    return request


def null_field(request: ApiMessage, api_version: int) -> str | None:
    """The first array, string or bytes field that came as null (length -1) where Kafka's schema says it cannot
    be, or None.

    kafka-python decodes a -1 length as None whatever the schema says; Kafka's own parser refuses such a
    request ("non-nullable field ... was serialized as null") and closes the connection, so the server
    does the same instead of handing handlers a None where they iterate. The path names schema fields
    only (e.g. "topics[].partitions"), never client data.
    """
    struct: Any = type(request)._struct
    return _null_field(struct, request, api_version, "")


@dataclass(frozen=True, slots=True)
class _NullCheck:
    """One field to look at: an array, string or bytes that may not be null, or a struct (array) with such fields
    inside."""

    name: str
    nullable: bool  # null is allowed here (only arrays, strings and bytes are checked for null)
    is_array: bool
    is_value: bool  # a string or bytes
    inner: tuple[_NullCheck, ...]  # checks for each element (struct arrays) or for the struct itself


_CHECKS: dict[tuple[int, int], tuple[_NullCheck, ...]] = {}
_NULLABLE_KINDS = ("string", "bytes", "records")  # the field types whose length may say -1 (null)


def _checks(struct: Any, version: int) -> tuple[_NullCheck, ...]:
    """The fields of `struct` worth walking at `version`, computed once (the schema objects live forever), so
    a Fetch of 500 partitions visits only the fields that can be null."""
    key = (id(struct), version)
    cached = _CHECKS.get(key)
    if cached is not None:
        return cached
    out: list[_NullCheck] = []
    for field in struct.untagged_fields(version):
        if field.is_array():
            inner = _checks(field.array_of, version) if field.is_struct_array() else ()
            out.append(_NullCheck(field.name, field.nullable_for_version_q(version), True, False, inner))
        elif field.is_struct():
            inner = _checks(field, version)
            if inner:
                out.append(_NullCheck(field.name, True, False, False, inner))
        elif getattr(field, "_type_str", None) in _NULLABLE_KINDS and not field.nullable_for_version_q(version):
            out.append(_NullCheck(field.name, False, False, True, ()))
    _CHECKS[key] = result = tuple(out)
    return result


def _null_field(struct: Any, value: Any, version: int, path: str) -> str | None:
    return _find_null(_checks(struct, version), value, path)


def _find_null(checks: tuple[_NullCheck, ...], value: Any, path: str) -> str | None:
    for check in checks:
        item = getattr(value, check.name, None)
        if item is None:
            if (check.is_array or check.is_value) and not check.nullable:
                return f"{path}{check.name}"
            continue
        if not check.inner:
            continue
        elements = item if check.is_array else (item,)
        prefix = f"{path}{check.name}[]." if check.is_array else f"{path}{check.name}."
        for element in elements:
            found = _find_null(check.inner, element, prefix)
            if found is not None:
                return found
    return None


def encode_response(response: ApiMessage, api_version: int, correlation_id: int) -> bytes:
    """Frame a response with its header (ApiVersions always uses header v0; the class knows)."""
    response._header = None
    response.API_VERSION = api_version  # before with_header: kafka-python's setter expects a request header
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def response_class(api_key: int) -> type[ApiMessage]:
    return RESPONSE_CLASSES[api_key]
