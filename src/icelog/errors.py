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
    NOT_ENOUGH_REPLICAS = 19  # retriable: icelog's back-pressure refusal (archive lag or free disk)
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
    # consumer groups, idempotent producers and transactions
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    OPERATION_NOT_ATTEMPTED = 55
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90


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
