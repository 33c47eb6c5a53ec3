"""Per-topic archive and table configs: whether and where a topic is archived, and the shape of its table.

icelog.archive.* (ArchiveTopicConfig, archive_config): whether, where and how fast a topic is archived
  icelog.archive.kind          iceberg | none (default: archive.default_kind).
  icelog.archive.iceberg.table [NAMESPACE.]TABLE (default: archive.namespace and the topic's name).
  icelog.archive.max.bytes     the most intake bytes one pass archives.
  icelog.archive.complete.delay.max.ms, icelog.archive.idle.max.ms
                               how long records may wait before a pass takes them.
  icelog.archive.max.lag.bytes unarchived intake bytes of the topic before produce is refused.
  icelog.intake.retention.ms   how long archived intake is kept (-1: Kafka's retention only).
  icelog.table.auto.maintenance true | false: the archiver compacts and expires the table.
  icelog.archive.layout        record | table. `record` (default): Bufstream's key/value/headers/kafka structs.
                               `table`: Fluss's layout, the messages' fields as top-level columns and the system
                               columns __bucket, __offset, __timestamp last (table/layout.py). Fixed at creation.
Precedence: explicit topic config < broker `topic_defaults` < `archive:` settings (the built-in defaults); the
broker (retention, back-pressure) and the archiver resolve a topic's archive config here, so they agree.

The table's shape (TableTopicConfig, table_config):
  icelog.table.partition.by    <col>[,<col>] (table layout): identity partitions on those columns first, then the
                               bucket. Fixed at creation.
  icelog.table.bucket.key      <col> (table layout): the spec is bucket(<col>, <partitions>) with Iceberg's bucket
                               function, and produce refuses a record whose partition is not its bucket. One column
                               only (Iceberg has no multi-argument bucket transform yet). Fixed at creation.
  icelog.table.primary.key     <col>[,<col>] (table layout): value columns identifying a row; the table is an
                               upsert table (the latest record per key), whatever cleanup.policy says; a null
                               value names no row and deletes nothing.
  cleanup.policy=compact       an upsert table keyed by the record key (__key, or key.__raw__ in the record layout);
                               also with compact,delete (as in Kafka: compacted, and retention.ms / retention.bytes
                               apply; with compact alone they do not). Both fixed at creation (archive/upsert.py).
  iceberg.<name>               forwarded to the table as the property <name> (iceberg.write.target-file-size-bytes).
Every other explicit topic config is recorded on the table as `icelog.<key>` (FORWARD_PREFIX).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from icelog.checks import check_long, one_of

ARCHIVE_KIND = "icelog.archive.kind"
ARCHIVE_TABLE = "icelog.archive.iceberg.table"
ARCHIVE_LAYOUT = "icelog.archive.layout"
ARCHIVE_MAX_BYTES = "icelog.archive.max.bytes"
ARCHIVE_COMPLETE_DELAY_MAX_MS = "icelog.archive.complete.delay.max.ms"
ARCHIVE_IDLE_MAX_MS = "icelog.archive.idle.max.ms"
ARCHIVE_MAX_LAG_BYTES = "icelog.archive.max.lag.bytes"
INTAKE_RETENTION_MS = "icelog.intake.retention.ms"
TABLE_AUTO_MAINTENANCE = "icelog.table.auto.maintenance"  # true: the archiver compacts/expires the table
PARTITION_BY = "icelog.table.partition.by"
BUCKET_KEY = "icelog.table.bucket.key"
PRIMARY_KEY = "icelog.table.primary.key"
CLEANUP_POLICY = "cleanup.policy"
ICEBERG_PREFIX = "iceberg."
FORWARD_PREFIX = "icelog."  # a topic config `k` (not iceberg.*) becomes the table property `icelog.k`

# The table layout's own top-level columns, in table order after the messages' fields. Named here (the config
# layer) because configs name them (icelog.table.bucket.key=__key) and both the lake and the schema layer use them.
KEY_BYTES, KEY_ERR = "__key", "__key_err"  # the key as produced (always); why a key did not decode
VALUE_BYTES, VALUE_PREFIX, VALUE_ERR = "__value", "__value_prefix", "__value_err"  # as record layout's __raw__ etc.
HEADERS, BATCH_START = "__headers", "__batch_start"
BUCKET, OFFSET, TIMESTAMP = "__bucket", "__offset", "__timestamp"  # Fluss's system columns, last
SYSTEM_COLUMNS = (KEY_BYTES, KEY_ERR, VALUE_BYTES, VALUE_PREFIX, VALUE_ERR, HEADERS, BATCH_START, BUCKET, OFFSET,
                  TIMESTAMP)

KIND_ICEBERG, KIND_NONE = "iceberg", "none"
ARCHIVE_KINDS = (KIND_ICEBERG, KIND_NONE)
LAYOUT_RECORD, LAYOUT_TABLE = "record", "table"
LAYOUTS = (LAYOUT_RECORD, LAYOUT_TABLE)
# Configs that shape the table (columns, spec): changing them on an existing topic is refused.
FORMAT_VERSIONS = ("1", "2", "3")  # iceberg.format-version values Spark's Iceberg 1.10 writes
PARTITIONABLE_SYSTEM = (KEY_BYTES,)  # the layout's own columns a partition.by or bucket.key may name
FIXED_AT_CREATION = (ARCHIVE_LAYOUT, PARTITION_BY, BUCKET_KEY, PRIMARY_KEY, CLEANUP_POLICY)
RECORD_KEY_PATH = "key.__raw__"  # the record layout's key bytes: the primary key of its compacted topics


def _check_table(value: str) -> None:
    if not value or value.startswith(".") or value.endswith("."):
        raise ValueError(f"{value!r} is not a table name (NAMESPACE.TABLE or TABLE)")


def column_list(value: str) -> list[str]:
    """The column names of a comma-separated config value (blanks dropped)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _check_partition_by(value: str) -> None:
    names = column_list(value)
    if not names:
        raise ValueError("names no column (a comma-separated list of top-level columns)")
    if len(set(names)) != len(names):
        raise ValueError(f"{value!r} names a column twice")
    _no_layout_column(names)


def layout_column_problem(name: str) -> str | None:
    """Why `name` cannot partition or bucket a table when it is one of the layout's own columns (offsets,
    timestamps, error and bytes columns: whatever the schema); None otherwise."""
    if name in SYSTEM_COLUMNS and name not in PARTITIONABLE_SYSTEM:
        return (f"names {name!r}, a column of the layout itself ({BUCKET} is always partitioned); name a field of "
                f"the key's or value's schema, or {KEY_BYTES}")
    return None


def _no_layout_column(names: list[str]) -> None:
    """Refused when the topic is created rather than by every archive pass after (layout_column_problem)."""
    for name in names:
        problem = layout_column_problem(name)
        if problem:
            raise ValueError(problem)


def _check_bucket_key(value: str) -> None:
    names = column_list(value)
    if not names:
        raise ValueError("names no column")
    if len(names) > 1:
        raise ValueError(
            f"{value!r} names {len(names)} columns; Iceberg has no multi-argument bucket transform, so a table has "
            "one bucket key (use icelog.table.partition.by for the others)"
        )
    _no_layout_column(names)


def check_iceberg_key(key: str, value: str | None = None) -> None:
    """An `iceberg.<name>` key must name a property, and not one icelog keeps for itself; `format-version`
    must be one the archive writes (else every archive pass would fail on it)."""
    name = key[len(ICEBERG_PREFIX) :]
    if not name or name.startswith("icelog.") or any(c.isspace() for c in name):
        raise ValueError(f"{key!r} does not name an Iceberg table property (iceberg.<property>, not icelog.*)")
    if name == "format-version" and value is not None and value.strip() not in FORMAT_VERSIONS:
        raise ValueError(
            f"{key}={value!r}: the archive writes Iceberg format versions {', '.join(FORMAT_VERSIONS)} (primary-key "
            "tables are always 3)"
        )


CLEANUP_POLICIES = ("delete", "compact")


def cleanup_policies(value: str) -> frozenset[str]:
    """A cleanup.policy value's policies: Kafka takes a list ("compact,delete": compacted, and retention applies)."""
    return frozenset(column_list(value))


def compacts(policy: str) -> bool:
    """Whether a cleanup.policy value has compact: the topic's table is a primary-key table."""
    return "compact" in cleanup_policies(policy)


def check_cleanup_policy(value: str) -> None:
    names = column_list(value)
    unknown = [name for name in names if name not in CLEANUP_POLICIES]
    if not names or unknown:
        raise ValueError(f"{value!r} is not delete, compact or both (compact,delete)")


def _check_primary_key(value: str) -> None:
    names = column_list(value)
    if not names:
        raise ValueError("names no column (a comma-separated list of top-level value columns)")
    if len(set(names)) != len(names):
        raise ValueError(f"{value!r} names a column twice")


# Validators of the icelog.* keys this module owns; topics.validate_topic_configs consults it.
CHECKS = {
    ARCHIVE_KIND: one_of(*ARCHIVE_KINDS),
    ARCHIVE_TABLE: _check_table,
    ARCHIVE_LAYOUT: one_of(*LAYOUTS),
    ARCHIVE_MAX_BYTES: check_long(1),
    ARCHIVE_COMPLETE_DELAY_MAX_MS: check_long(0),
    ARCHIVE_IDLE_MAX_MS: check_long(0),
    ARCHIVE_MAX_LAG_BYTES: check_long(1),
    INTAKE_RETENTION_MS: check_long(-1),
    TABLE_AUTO_MAINTENANCE: one_of("true", "false"),
    PARTITION_BY: _check_partition_by,
    BUCKET_KEY: _check_bucket_key,
    PRIMARY_KEY: _check_primary_key,
}


# -- whether, where and how fast a topic is archived ---------------------------------------------------------------
class ArchiveDefaults(Protocol):
    """The broker-wide defaults of the archive keys: config.ArchiveSettings (the `archive:` settings)."""

    @property
    def default_kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def complete_delay_max_ms(self) -> int: ...
    @property
    def idle_max_ms(self) -> int: ...
    @property
    def intake_retention_ms(self) -> int: ...
    @property
    def max_lag_bytes(self) -> int: ...


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
    topic: str, explicit: Mapping[str, str], broker_defaults: Mapping[str, str], settings: ArchiveDefaults
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


# -- the table's shape ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableTopicConfig:
    """A topic's table layout settings (resolved from explicit configs over broker defaults)."""

    layout: str = LAYOUT_RECORD
    partition_by: tuple[str, ...] = ()
    bucket_key: str | None = None
    primary_key: tuple[str, ...] = ()  # the columns (paths) identifying a row of an upsert table; () appends

    @property
    def is_table(self) -> bool:
        return self.layout == LAYOUT_TABLE


def table_config(explicit: Mapping[str, str], broker_defaults: Mapping[str, str] | None = None) -> TableTopicConfig:
    """Resolve a topic's table settings; raise ValueError when they do not fit together."""
    configs = {**(broker_defaults or {}), **explicit}
    layout = configs.get(ARCHIVE_LAYOUT, LAYOUT_RECORD)
    partition_by = tuple(column_list(configs.get(PARTITION_BY, "")))
    bucket = column_list(configs.get(BUCKET_KEY, ""))
    if (partition_by or bucket) and layout != LAYOUT_TABLE:
        raise ValueError(f"{PARTITION_BY} and {BUCKET_KEY} need {ARCHIVE_LAYOUT}=table")
    if bucket and bucket[0] in partition_by:
        raise ValueError(f"column {bucket[0]!r} is both the bucket key and a partition column")
    primary = tuple(column_list(configs.get(PRIMARY_KEY, "")))
    if primary and layout != LAYOUT_TABLE:
        raise ValueError(f"{PRIMARY_KEY} names value columns, which need {ARCHIVE_LAYOUT}=table "
                         f"(with the record layout, {CLEANUP_POLICY}=compact keys the table by the record key)")
    if not primary and compacts(configs.get(CLEANUP_POLICY, "delete")):
        primary = (KEY_BYTES,) if layout == LAYOUT_TABLE else (RECORD_KEY_PATH,)
    version = configs.get(f"{ICEBERG_PREFIX}format-version")
    if primary and version is not None and version.strip() != "3":
        raise ValueError(
            f"{ICEBERG_PREFIX}format-version={version!r}: a primary-key table is format 3 (its DVs need it)"
        )
    for mode in (f"{ICEBERG_PREFIX}write.{kind}.mode" for kind in ("delete", "update", "merge")):
        if primary and configs.get(mode, "merge-on-read").strip() != "merge-on-read":
            raise ValueError(
                f"{mode}={configs[mode]!r}: a primary-key table is merge-on-read (deletes are deletion vectors, "
                "which its index follows; copy-on-write would rewrite data files under it)"
            )
    return TableTopicConfig(layout, partition_by, bucket[0] if bucket else None, primary)


def forwarded_properties(explicit: Mapping[str, str]) -> dict[str, str]:
    """The table properties a topic's explicit configs forward: iceberg.<p> → p, any other k → icelog.k."""
    out: dict[str, str] = {}
    for key, value in explicit.items():
        if key.startswith(ICEBERG_PREFIX):
            out[key[len(ICEBERG_PREFIX) :]] = value
        else:
            out[FORWARD_PREFIX + key] = value
    return out
