"""Topic names and topic configs: Kafka's keys and icelog.schema.*, their defaults, and the validation of every key.

The archive and table keys (icelog.archive.*, icelog.table.*, iceberg.*) are defined with the archive and table
configs they resolve to, in table/config.py; validate_topic_configs checks them all.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from icelog.checks import Check, check_long, check_ratio, one_of
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

MAX_TOPIC_NAME_LENGTH = 249
# Each partition costs memory and start-up work in the broker; a request for millions would stall it.
MAX_PARTITIONS_PER_TOPIC = 10_000
_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
# Kafka's internal topics: icelog keeps what they hold in the metadata store (the group and transaction coordinator
# shards are their partitions), so no topic may take their names. Kafka creates them with the first group or
# transaction and then answers TOPIC_ALREADY_EXISTS, as icelog does from the start.
INTERNAL_TOPIC_NAMES = frozenset({"__consumer_offsets", "__transaction_state"})


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


def refuse_internal_topic_name(name: str) -> None:
    """TOPIC_ALREADY_EXISTS for a Kafka internal topic's name, as Kafka answers once it has created it."""
    if name in INTERNAL_TOPIC_NAMES:
        raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS,
                            f"Topic '{name}' already exists: Kafka's internal topic, kept in icelog's metadata store")


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

# -- icelog.schema.*: each side's schema --------------------------------------------------------------------------
# Per-topic schema configs (Bufstream's data_enforcement, as `icelog.schema.*` topic configs).
#
# For each side (key, value) of a topic:
#   icelog.schema.<side>                 auto | none | topic-name | subject:<SUBJECT>
#       auto        use TopicNameStrategy (<topic>-<side>) when that subject exists in the registry
#       none        the side is raw bytes
#       topic-name  the subject <topic>-<side> (TopicNameStrategy), required to exist
#       subject:S   an explicit subject
#   icelog.schema.<side>.message          fully-qualified message name (default: from the payload's message
#                                         indexes, else the first message of the schema)
#   icelog.schema.<side>.coerce           true | false: add the registry envelope (magic byte, schema id,
#                                         message indexes) to payloads produced without it
#   icelog.schema.<side>.on.parse.error   pass | reject: on produce, a payload that does not parse is stored
#                                         as is (pass; the archive sets __err__ and __raw__) or the batch is
#                                         refused with INVALID_RECORD and nothing is stored (reject)
SIDES = ("key", "value")
MODE_AUTO, MODE_NONE, MODE_TOPIC_NAME, SUBJECT_PREFIX = "auto", "none", "topic-name", "subject:"
ON_ERROR_PASS, ON_ERROR_REJECT = "pass", "reject"


def key_of(side: str, suffix: str = "") -> str:
    """The topic config key for one side, e.g. key_of('value', 'coerce') -> 'icelog.schema.value.coerce'."""
    return f"icelog.schema.{side}" + (f".{suffix}" if suffix else "")


def _check_mode(value: str) -> None:
    if value in (MODE_AUTO, MODE_NONE, MODE_TOPIC_NAME):
        return
    if value.startswith(SUBJECT_PREFIX) and len(value) > len(SUBJECT_PREFIX):
        return
    raise ValueError(f"{value!r} is not one of auto, none, topic-name, subject:<SUBJECT>")


def _check_bool(value: str) -> None:
    if value not in ("true", "false"):
        raise ValueError(f"{value!r} is not true or false")


def _check_on_error(value: str) -> None:
    if value not in (ON_ERROR_PASS, ON_ERROR_REJECT):
        raise ValueError(f"{value!r} is not pass or reject")


def _check_message(value: str) -> None:
    if not value or " " in value:
        raise ValueError(f"{value!r} is not a message name")


SCHEMA_CHECKS: dict[str, Check] = {}
for _side in SIDES:
    SCHEMA_CHECKS[key_of(_side)] = _check_mode
    SCHEMA_CHECKS[key_of(_side, "message")] = _check_message
    SCHEMA_CHECKS[key_of(_side, "coerce")] = _check_bool
    SCHEMA_CHECKS[key_of(_side, "on.parse.error")] = _check_on_error


@dataclass(frozen=True)
class SideSchemaConfig:
    """How one side (key or value) of a topic relates to the schema registry."""

    side: str
    subject: str | None  # None: raw bytes
    required: bool  # False for `auto`: a missing subject means raw bytes
    message: str | None
    coerce: bool
    reject_on_parse_error: bool


def side_config(topic: str, side: str, configs: Mapping[str, str]) -> SideSchemaConfig:
    """Resolve one side's schema settings from a topic's explicit configs."""
    mode = configs.get(key_of(side), MODE_AUTO)
    subject: str | None
    if mode == MODE_NONE:
        subject = None
    elif mode.startswith(SUBJECT_PREFIX):
        subject = mode[len(SUBJECT_PREFIX) :]
    else:
        subject = f"{topic}-{side}"
    return SideSchemaConfig(
        side=side,
        subject=subject,
        required=mode not in (MODE_AUTO,),
        message=configs.get(key_of(side, "message")),
        coerce=configs.get(key_of(side, "coerce"), "false") == "true",
        reject_on_parse_error=configs.get(key_of(side, "on.parse.error"), ON_ERROR_PASS) == ON_ERROR_REJECT,
    )


# -- every icelog.* key --------------------------------------------------------------------------------------------
# Keys under this prefix belong to icelog's own features (archiving, schemas); they persist as given.
ICELOG_PREFIX = "icelog."


# The icelog.* families whose every key icelog knows: an unknown key in them is a typo that would otherwise be
# stored and silently do nothing (`icelog.table.bucketkey`). Keys outside them (`icelog.owner`) persist as given.
OWNED_PREFIXES = ("icelog.archive.", "icelog.schema.", "icelog.table.", "icelog.intake.")
KNOWN_ICELOG_KEYS = {**SCHEMA_CHECKS, **TABLE_CHECKS}


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
