"""One error root for icelog, and the Kafka error codes the broker answers with."""

from __future__ import annotations

from collections.abc import Sequence
from enum import EnumMeta, IntEnum
from typing import TYPE_CHECKING

import kafka.errors

# kafka-python names a few codes as older Kafka releases did; icelog answers with the names of Kafka's
# current Errors.java, and kafka-python's names stay as aliases of the same values.
_KAFKA_NAMES = {
    "NO_ERROR": "NONE",
    "UNKNOWN": "UNKNOWN_SERVER_ERROR",
    "NOT_LEADER_FOR_PARTITION": "NOT_LEADER_OR_FOLLOWER",
    "MESSAGE_SIZE_TOO_LARGE": "MESSAGE_TOO_LARGE",
    "INVALID_TOPIC": "INVALID_TOPIC_EXCEPTION",
}


def _error_code_members() -> list[tuple[str, int]]:
    """(name, code) of every Kafka error kafka-python knows: Kafka's name first, then any alias."""
    members: list[tuple[str, int]] = []
    known = {code: error for code, error in kafka.errors.kafka_errors.items() if code is not None}
    for code, error in sorted(known.items()):
        name = _KAFKA_NAMES.get(error.message, error.message)
        members.append((name, code))
        if name != error.message:
            members.append((error.message, code))
    return members


if TYPE_CHECKING:  # the members are generated at import time; give the type checker their type

    class _ErrorCodeMeta(EnumMeta):
        def __getattr__(cls, name: str) -> ErrorCode: ...

    class ErrorCode(IntEnum, metaclass=_ErrorCodeMeta):
        """Kafka protocol error codes (Kafka's `Errors.java`), generated from kafka-python's `kafka.errors`."""

else:
    ErrorCode = IntEnum("ErrorCode", _error_code_members(), module=__name__)
    ErrorCode.__doc__ = "Kafka protocol error codes (Kafka's `Errors.java`), generated from kafka-python's errors."


def is_retriable(code: int) -> bool:
    """Whether a client may retry a request that failed with `code` (kafka-python's `retriable` flag)."""
    return bool(kafka.errors.for_code(code).retriable)


class IcelogError(Exception):
    """Root of every error icelog raises on purpose."""


class ConfigError(IcelogError):
    """The configuration (file, environment or flags) is invalid; the message says how to fix it."""


class StoreError(IcelogError):
    """The metadata store refused or failed an operation."""


class TopicExistsError(StoreError):
    """A topic with that name already exists."""


class UnknownTopicError(StoreError):
    """No topic with that name exists."""


class IntakeCorruptError(IcelogError):
    """An intake file holds bytes that fail their length or CRC check."""


class KafkaApiError(IcelogError):
    """A request fails with a Kafka error code that goes back to the client."""

    def __init__(self, code: ErrorCode, message: str = "", record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message
        # (index of the record in its batch, why): Produce v8+ answers them as record_errors (KIP-467)
        self.record_errors = list(record_errors)

    @property
    def retriable(self) -> bool:
        """Whether the client may retry (kafka-python's classification of the code)."""
        return is_retriable(self.code)
