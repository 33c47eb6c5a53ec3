"""One error root for icelog, and the Kafka error codes the broker answers with."""

from __future__ import annotations

import logging
import time
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
# Codes of Kafka's Errors.java that kafka-python does not know yet.
_NEWER_CODES = {"INVALID_REGULAR_EXPRESSION": 128}  # ConsumerGroupHeartbeat v1's SubscribedTopicRegex (KIP-848)


def _error_code_members() -> list[tuple[str, int]]:
    """(name, code) of every Kafka error kafka-python knows: Kafka's name first, then any alias."""
    members: list[tuple[str, int]] = []
    known = {code: error for code, error in kafka.errors.kafka_errors.items() if code is not None}
    for code, error in sorted(known.items()):
        name = _KAFKA_NAMES.get(error.message, error.message)
        members.append((name, code))
        if name != error.message:
            members.append((error.message, code))
    members.extend((name, code) for name, code in _NEWER_CODES.items() if code not in known)
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
    """Root of every error icelog raises on purpose.

    `retriable` (a class attribute, as aiokafka's `KafkaError.retriable`): whether the same operation may succeed
    later with nothing changed (a dependency down, a race lost), as against a fault that needs a fix (a config,
    the data, a table). Callers decide by type and by this flag, never by the message.
    """

    retriable: bool = False


_last_retry_line: dict[str, float] = {}


def log_retry(logger: logging.Logger, what: str, exc: BaseException, every_s: float = 30.0) -> None:
    """A background task's failure it will retry: a retriable IcelogError (a dependency down: the metadata store,
    the catalog) is one line at most every `every_s` per `what`, without a traceback, since it repeats until the
    dependency returns; anything else is logged with its traceback, as a fault to fix."""
    if isinstance(exc, IcelogError) and exc.retriable:
        now = time.monotonic()
        if now - _last_retry_line.get(what, -every_s) >= every_s:
            _last_retry_line[what] = now
            logger.warning("%s failed: %s; will retry", what, exc)
        return
    logger.error("%s failed; will retry", what, exc_info=exc)


class ConfigError(IcelogError):
    """The configuration (file, environment or flags) is invalid; the message says how to fix it."""


class StoreError(IcelogError):
    """The metadata store refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """The metadata store cannot be reached now (its database is down, restarting or unreachable): the operation
    may succeed later unchanged. Raised by a networked backend (PostgreSQL); the message names where, never a
    password."""

    retriable = True


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
        # Whether the client may retry: kafka-python's classification of the code
        self.retriable = is_retriable(code)


class TableChangedError(IcelogError):
    """Another writer changed the table while an operation worked from an older snapshot (a race lost, not an
    outage): redone from the new snapshot, at once."""

    retriable = True


class CommitConflictError(TableChangedError):
    """Iceberg refused a commit that conflicts with a concurrent one (Java's CommitFailedException once its
    commit retries are spent, or a ValidationException of the commit's checks); converted at the JVM boundary
    (icelog.lake.jvm_errors)."""


class TableMismatchError(IcelogError):
    """A table is not one the operation can write as it is (it holds another topic's archive, has another primary
    key, content icelog does not write): not retried until a config or the table changes."""


def first_line(exc: BaseException | str) -> str:
    """The first line of an error's message (or of a text), at most 500 characters: for logs and `icelog status`,
    never a decision.

    (A JVM failure converted at the boundary, icelog.lake.jvm_errors, has the Java exception's own line as its
    message, not py4j's "An error occurred while calling o438.execute.".)
    """
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else ""
