"""Request/response classes from kafka-python 3's generated protocol (Kafka's own JSON message specs)."""

from __future__ import annotations

import importlib
import pkgutil
import struct
from dataclasses import dataclass
from typing import Any

import kafka.protocol as _protocol
from kafka.protocol.api_message import ApiMessage

_REQUEST_PREFIX = struct.Struct(">hhi")


def _load_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    for module in pkgutil.walk_packages(_protocol.__path__, "kafka.protocol."):
        if ".old" in module.name or "generate" in module.name:
            continue
        importlib.import_module(module.name)

    def subclasses(cls: type) -> list[type]:
        out = []
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


def decode_request(frame: bytes, api_key: int, api_version: int) -> Any:
    """Decode header and body; raises on malformed input."""
    return REQUEST_CLASSES[api_key].decode(frame, version=api_version, header=True)


def encode_response(response: Any, api_version: int, correlation_id: int) -> bytes:
    """Frame a response with its header (ApiVersions always uses header v0; the class knows)."""
    response._header = None
    response.API_VERSION = api_version  # before with_header: kafka-python's setter expects a request header
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def response_class(api_key: int) -> type[ApiMessage]:
    return RESPONSE_CLASSES[api_key]
