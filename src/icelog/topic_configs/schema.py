"""Per-topic schema configs (Bufstream's data_enforcement, as `icelog.schema.*` topic configs).

For each side (key, value) of a topic:
  icelog.schema.<side>                 auto | none | topic-name | subject:<SUBJECT>
      auto        use TopicNameStrategy (<topic>-<side>) when that subject exists in the registry
      none        the side is raw bytes
      topic-name  the subject <topic>-<side> (TopicNameStrategy), required to exist
      subject:S   an explicit subject
  icelog.schema.<side>.message          fully-qualified message name (default: from the payload's message
                                        indexes, else the first message of the schema)
  icelog.schema.<side>.coerce           true | false: add the registry envelope (magic byte, schema id,
                                        message indexes) to payloads produced without it
  icelog.schema.<side>.on.parse.error   pass | reject: on produce, a payload that does not parse is stored
                                        as is (pass; the archive sets __err__ and __raw__) or the batch is
                                        refused with INVALID_RECORD and nothing is stored (reject)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

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


CHECKS: dict[str, Callable[[str], None]] = {}
for _side in SIDES:
    CHECKS[key_of(_side)] = _check_mode
    CHECKS[key_of(_side, "message")] = _check_message
    CHECKS[key_of(_side, "coerce")] = _check_bool
    CHECKS[key_of(_side, "on.parse.error")] = _check_on_error


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
