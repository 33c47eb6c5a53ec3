"""Topic names and Kafka-style topic configs: the keys icelog knows, their defaults and validation."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from icelog.errors import ErrorCode, KafkaApiError
from icelog.table.config import CHECKS as TABLE_CHECKS
from icelog.table.config import (
    CLEANUP_POLICY,
    FIXED_AT_CREATION,
    ICEBERG_PREFIX,
    check_cleanup_policy,
    check_iceberg_key,
    cleanup_policies,
    compacts,
    table_config,
)
from icelog.topic_configs.archive import CHECKS as ARCHIVE_CHECKS
from icelog.topic_configs.checks import Check, check_long, check_ratio, one_of
from icelog.topic_configs.schema import CHECKS as SCHEMA_CHECKS

MAX_TOPIC_NAME_LENGTH = 249
# Each partition costs memory and start-up work in the broker; a request for millions would stall it.
MAX_PARTITIONS_PER_TOPIC = 10_000
_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(name: str | None) -> str:
    """Return the name if Kafka would accept it, else raise INVALID_TOPIC_EXCEPTION."""
    if not name:
        raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if name in (".", ".."):
        raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters"
        )
    if not _LEGAL_TOPIC_NAME.match(name):
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_' and '-'",
        )
    return name


@dataclass(frozen=True)
class TopicConfigKey:
    """A topic config key icelog understands."""

    name: str
    default: str
    check: Check
    doc: str


RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
TIMESTAMP_TYPE = "message.timestamp.type"
TIMESTAMP_BEFORE_MAX_MS = "message.timestamp.before.max.ms"
TIMESTAMP_AFTER_MAX_MS = "message.timestamp.after.max.ms"
_LONG_MAX = (1 << 63) - 1
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"

TOPIC_CONFIG_KEYS: dict[str, TopicConfigKey] = {
    key.name: key
    for key in (
        TopicConfigKey(RETENTION_MS, "604800000", check_long(-1), "Delete intake data older than this (-1: keep)."),
        TopicConfigKey(RETENTION_BYTES, "-1", check_long(-1), "Keep at most this many intake bytes per partition."),
        TopicConfigKey(MAX_MESSAGE_BYTES, "1048588", check_long(0), "Largest record batch accepted."),
        TopicConfigKey(TIMESTAMP_TYPE, "CreateTime", one_of("CreateTime", "LogAppendTime"),
                       "CreateTime: a record keeps the producer's timestamp (within the two bounds below); "
                       "LogAppendTime: the broker's clock at append."),
        TopicConfigKey(TIMESTAMP_BEFORE_MAX_MS, str(_LONG_MAX), check_long(0),
                       "CreateTime: a record whose timestamp is more than this before the broker's clock is "
                       "refused with INVALID_TIMESTAMP (its whole batch; Kafka 4's default: no bound)."),
        TopicConfigKey(TIMESTAMP_AFTER_MAX_MS, "3600000", check_long(0),
                       "CreateTime: a record whose timestamp is more than this after the broker's clock is "
                       "refused with INVALID_TIMESTAMP (its whole batch; Kafka 4's default: one hour)."),
        TopicConfigKey(CLEANUP_POLICY, "delete", check_cleanup_policy,
                       "compact: the archive table keeps the latest record per key (a primary-key table), and "
                       "retention.ms / retention.bytes do not apply (they do with compact,delete); the intake "
                       "itself is not compacted."),
        TopicConfigKey(DELETE_RETENTION_MS, "86400000", check_long(0),
                       "Compacted topics: a tombstone stays readable at least this long. The table holds no "
                       "tombstones, so a compacted topic's archived intake is kept at least this long."),
        TopicConfigKey(MIN_COMPACTION_LAG_MS, "0", check_long(0), "Accepted for compatibility (the table is "
                       "compacted by each archive pass)."),
        TopicConfigKey(MAX_COMPACTION_LAG_MS, "9223372036854775807", check_long(1), "Accepted for compatibility."),
        TopicConfigKey("min.cleanable.dirty.ratio", "0.5", check_ratio, "Accepted for compatibility."),
        TopicConfigKey("compression.type", "producer", one_of("producer"), "Batches are stored as produced."),
        TopicConfigKey("min.insync.replicas", "1", check_long(1), "Accepted for compatibility; one durable copy."),
        TopicConfigKey("segment.bytes", "268435456", check_long(14), "Accepted for compatibility."),
        TopicConfigKey("segment.ms", "604800000", check_long(1), "Accepted for compatibility."),
    )
}

# Keys under this prefix belong to icelog's own features (archiving, schemas); they persist as given.
ICELOG_PREFIX = "icelog."


# The icelog.* families whose every key icelog knows: an unknown key in them is a typo that would otherwise be
# stored and silently do nothing (`icelog.table.bucketkey`). Keys outside them (`icelog.owner`) persist as given.
OWNED_PREFIXES = ("icelog.archive.", "icelog.schema.", "icelog.table.", "icelog.intake.")
KNOWN_ICELOG_KEYS = {**ARCHIVE_CHECKS, **SCHEMA_CHECKS, **TABLE_CHECKS}


def _check_icelog_key(key: str, value: str | None) -> None:
    """Validate the icelog.* keys that have a known meaning (archive, schema, table), refuse unknown keys in their
    families (deleting one is allowed, to clean up); other icelog.* keys persist as given."""
    check = KNOWN_ICELOG_KEYS.get(key)
    if check is None and value is not None and key.startswith(OWNED_PREFIXES):
        close = difflib.get_close_matches(key, KNOWN_ICELOG_KEYS, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(sorted(KNOWN_ICELOG_KEYS))})"
        raise KafkaApiError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}{hint}")
    if check is None or value is None:
        return
    try:
        check(value)
    except ValueError as exc:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG, f"invalid value for {key}: {exc}") from None


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str | None]:
    """Check keys and values; raise INVALID_CONFIG naming the offending key."""
    for key, value in configs.items():
        if key.startswith(ICELOG_PREFIX):
            _check_icelog_key(key, value)
            continue
        if key.startswith(ICEBERG_PREFIX):  # forwarded to the archive table as a property (table/config.py)
            try:
                check_iceberg_key(key, value)
            except ValueError as exc:
                raise KafkaApiError(ErrorCode.INVALID_CONFIG, str(exc)) from None
            continue
        spec = TOPIC_CONFIG_KEYS.get(key)
        if spec is None:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
        if value is None:
            continue
        try:
            spec.check(value)
        except ValueError as exc:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG, f"invalid value for {key}: {exc}") from None
    return dict(configs)


def validate_table_configs(configs: Mapping[str, str], broker_defaults: Mapping[str, str]) -> None:
    """Check that a topic's table configs (layout, partition.by, bucket.key) fit together; INVALID_CONFIG if not."""
    try:
        table_config(configs, broker_defaults)
    except ValueError as exc:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG, str(exc)) from None


def validate_config_change(
    current: Mapping[str, str], set_configs: Mapping[str, str], delete_keys: Iterable[str]
) -> None:
    """Refuse changing the configs that shape a topic's table (its layout and spec) once the topic exists.

    cleanup.policy may change as long as it keeps (or keeps lacking) compact: adding or removing delete only
    turns retention on or off, as in Kafka.
    """
    for key in FIXED_AT_CREATION:
        changed = (key in set_configs and set_configs[key] != current.get(key)) or (
            key in delete_keys and key in current
        )
        if changed and key == CLEANUP_POLICY:
            after = "delete" if key in delete_keys else set_configs.get(key, "delete")
            before = current.get(key, "delete")
            if compacts(after) != compacts(before):
                raise KafkaApiError(
                    ErrorCode.INVALID_CONFIG,
                    f"{key} may gain or lose delete (retention), not compact once the topic exists: compact makes "
                    f"the archive table a primary-key table (here {before!r} → {after!r}); create a new topic with "
                    "the policy you want",
                )
            continue
        if changed:
            raise KafkaApiError(
                ErrorCode.INVALID_CONFIG,
                f"{key} is fixed when the topic is created (it shapes the archive table's columns and partition "
                "spec); create a new topic with the value you want",
            )


def validate_together(configs: Mapping[str, str], broker_defaults: Mapping[str, str]) -> None:
    """Refuse Kafka configs that conflict with each other, as Kafka does (INVALID_CONFIG)."""
    values = EffectiveConfig.of(configs, broker_defaults).values  # with every key's default
    low, high = int(values[MIN_COMPACTION_LAG_MS]), int(values[MAX_COMPACTION_LAG_MS])
    if low > high:
        raise KafkaApiError(
            ErrorCode.INVALID_CONFIG,
            f"min.compaction.lag.ms ({low}) is greater than max.compaction.lag.ms ({high})",
        )


@dataclass(frozen=True)
class EffectiveConfig:
    """A topic's configs with defaults filled in, typed for the code that enforces them."""

    values: dict[str, str]
    explicit: frozenset[str]

    @classmethod
    def of(cls, explicit: Mapping[str, str], broker_defaults: Mapping[str, str]) -> EffectiveConfig:
        values = {key.name: key.default for key in TOPIC_CONFIG_KEYS.values()}
        values.update(broker_defaults)
        values.update(explicit)
        return cls(values, frozenset(explicit))

    @property
    def retention_ms(self) -> int:
        return int(self.values[RETENTION_MS])

    @property
    def retention_bytes(self) -> int:
        return int(self.values[RETENTION_BYTES])

    @property
    def delete_retention_ms(self) -> int:
        return int(self.values[DELETE_RETENTION_MS])

    @property
    def max_message_bytes(self) -> int:
        return int(self.values[MAX_MESSAGE_BYTES])

    @property
    def compacted(self) -> bool:
        """cleanup.policy has compact: every record needs a key (Kafka refuses one without, INVALID_RECORD)."""
        return compacts(self.values[CLEANUP_POLICY])

    @property
    def deletes(self) -> bool:
        """cleanup.policy has delete: retention.ms / retention.bytes apply (Kafka ignores them on compact alone)."""
        return "delete" in cleanup_policies(self.values[CLEANUP_POLICY])

    @property
    def log_append_time(self) -> bool:
        return self.values[TIMESTAMP_TYPE] == "LogAppendTime"

    def timestamp_window(self, now_ms: int) -> tuple[int, int] | None:
        """[earliest, latest]: the record timestamps a CreateTime topic accepts at `now_ms` (Kafka's LogValidator:
        message.timestamp.before.max.ms / after.max.ms around the broker's clock, clamped to a long); None for a
        LogAppendTime topic, whose records take the broker's clock."""
        if self.log_append_time:
            return None
        before, after = int(self.values[TIMESTAMP_BEFORE_MAX_MS]), int(self.values[TIMESTAMP_AFTER_MAX_MS])
        return max(now_ms - before, -_LONG_MAX - 1), min(now_ms + after, _LONG_MAX)
