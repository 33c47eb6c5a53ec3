"""One error root for icelog, and the Kafka error codes the broker answers with."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Kafka protocol error codes icelog returns (see Kafka's `Errors.java`)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REQUEST = 42
    INVALID_CONFIG = 40
    POLICY_VIOLATION = 44
    INVALID_TIMESTAMP = 32
    KAFKA_STORAGE_ERROR = 56
    INVALID_RECORD = 87


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

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message
