"""Per-topic archive configs (`icelog.archive.*`, `icelog.intake.retention.ms`): keys, defaults, parsing.

The broker (retention) and the archiver both resolve a topic's archive settings here, so they agree.
Precedence: explicit topic config < broker `topic_defaults` < `archive:` settings (the built-in defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icelog.topic_configs.checks import check_long, one_of

if TYPE_CHECKING:
    from icelog.config import ArchiveSettings

ARCHIVE_KIND = "icelog.archive.kind"
ARCHIVE_TABLE = "icelog.archive.iceberg.table"
ARCHIVE_MAX_BYTES = "icelog.archive.max.bytes"
ARCHIVE_COMPLETE_DELAY_MAX_MS = "icelog.archive.complete.delay.max.ms"
ARCHIVE_IDLE_MAX_MS = "icelog.archive.idle.max.ms"
INTAKE_RETENTION_MS = "icelog.intake.retention.ms"
ARCHIVE_MAX_LAG_BYTES = "icelog.archive.max.lag.bytes"
TABLE_AUTO_MAINTENANCE = "icelog.table.auto.maintenance"  # true: the archiver compacts/expires the table

KIND_ICEBERG = "iceberg"
KIND_NONE = "none"
ARCHIVE_KINDS = (KIND_ICEBERG, KIND_NONE)


def _check_kind(value: str) -> None:
    if value not in ARCHIVE_KINDS:
        raise ValueError(f"{value!r} is not one of {', '.join(ARCHIVE_KINDS)}")


def _check_table(value: str) -> None:
    if not value or value.startswith(".") or value.endswith("."):
        raise ValueError(f"{value!r} is not a table name (NAMESPACE.TABLE or TABLE)")


# Validators for the icelog.* keys this module owns; topics.validate_topic_configs consults it.
CHECKS = {
    ARCHIVE_KIND: _check_kind,
    ARCHIVE_TABLE: _check_table,
    ARCHIVE_MAX_BYTES: check_long(1),
    ARCHIVE_COMPLETE_DELAY_MAX_MS: check_long(0),
    ARCHIVE_IDLE_MAX_MS: check_long(0),
    INTAKE_RETENTION_MS: check_long(-1),
    ARCHIVE_MAX_LAG_BYTES: check_long(1),
    TABLE_AUTO_MAINTENANCE: one_of("true", "false"),
}


@dataclass(frozen=True)
class ArchiveTopicConfig:
    """How (and whether) one topic is archived."""

    kind: str
    namespace: str
    table: str
    max_bytes: int
    complete_delay_max_ms: int
    idle_max_ms: int
    intake_retention_ms: int  # -1: intake follows Kafka's retention.ms / retention.bytes only
    max_lag_bytes: int = 4 * 1024 * 1024 * 1024  # unarchived intake bytes of the topic before produce is refused
    auto_maintenance: bool = True  # the archiver maintains the table (compaction, expiry, orphans, manifests)

    @property
    def enabled(self) -> bool:
        return self.kind == KIND_ICEBERG

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)


def table_key(namespace: str, table: str) -> str:
    """A table's name in the metadata store's maintenance records and in its lock files (`ns.table`)."""
    return f"{namespace}.{table}"


def archive_config(
    topic: str, explicit: Mapping[str, str], broker_defaults: Mapping[str, str], settings: ArchiveSettings
) -> ArchiveTopicConfig:
    """Resolve a topic's archive config from its explicit configs, broker topic defaults and settings."""

    def get(key: str, default: object) -> str:
        if key in explicit:
            return explicit[key]
        if key in broker_defaults:
            return broker_defaults[key]
        return str(default)

    table = get(ARCHIVE_TABLE, "")
    namespace, sep, name = table.rpartition(".")
    if not sep:
        namespace, name = settings.namespace, table or topic
    return ArchiveTopicConfig(
        kind=get(ARCHIVE_KIND, settings.default_kind),
        namespace=namespace,
        table=name,
        max_bytes=int(get(ARCHIVE_MAX_BYTES, settings.max_bytes)),
        complete_delay_max_ms=int(get(ARCHIVE_COMPLETE_DELAY_MAX_MS, settings.complete_delay_max_ms)),
        idle_max_ms=int(get(ARCHIVE_IDLE_MAX_MS, settings.idle_max_ms)),
        intake_retention_ms=int(get(INTAKE_RETENTION_MS, settings.intake_retention_ms)),
        max_lag_bytes=int(get(ARCHIVE_MAX_LAG_BYTES, settings.max_lag_bytes)),
        auto_maintenance=get(TABLE_AUTO_MAINTENANCE, "true") == "true",
    )
