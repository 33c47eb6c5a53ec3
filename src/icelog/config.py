"""The broker's one typed configuration: defaults < icelog.yaml < ICELOG_* environment < CLI flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from icelog.errors import ConfigError

DEFAULT_CONFIG_FILE = "icelog.yaml"
SETTINGS_ENV = "ICELOG_ARCHIVER_SETTINGS"  # a parent broker's Settings as JSON, for its archiver and maintenance


class IntakeSettings(BaseModel):
    """How the durable intake log writes."""

    segment_bytes: int = Field(256 * 1024 * 1024, gt=0, description="Start a new intake file past this size.")
    flush_max_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Upper bound on the bytes one group commit (one fsync) carries."
    )
    fsync: bool = Field(True, description="fsync each group commit before acknowledging (turn off only in tests).")
    preallocate_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Allocate the active intake file this far ahead of its writes (Kafka's log.preallocate): "
        "an fsync of writes inside allocated space skips the block allocation an appending write costs. "
        "0 turns it off.",
    )
    producer_snapshot_interval_ms: int = Field(
        30000, gt=0, description="How often partitions that moved get a producer-state snapshot (start-up replays "
        "only the intake after it)."
    )
    index_cache_chunks: int = Field(
        4096,
        ge=2,
        description="Intake index rows each partition keeps in memory: its newest chunks, and as many older ones "
        "cached for reads (the rest are looked up in the metadata store, so start-up does not grow with the intake).",
    )
    min_free_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=0,
        description="Refuse an append (retriable NOT_ENOUGH_REPLICAS) that would leave the data dir less free space.",
    )


class ArchiveSettings(BaseModel):
    """The Spark archiver: where the Iceberg catalog is, how Spark runs, and per-topic archive defaults."""

    enabled: bool = Field(True, description="`icelog serve` runs `icelog archive` as a child process.")
    default_kind: str = Field(
        "iceberg",
        pattern="^(iceberg|none)$",
        description="icelog.archive.kind of topics that do not set it: iceberg archives, none does not.",
    )
    catalog_type: str = Field("jdbc", pattern="^(jdbc|rest|hadoop)$", description="Iceberg catalog kind.")
    catalog_uri: str | None = Field(
        None, description="jdbc:... or http(s)://... (REST); default jdbc:sqlite:<data_dir>/catalog.db."
    )
    catalog_name: str = Field("lake", description="Spark catalog name (the default catalog of `icelog sql`).")
    catalog_properties: dict[str, str] = Field(
        default_factory=dict, description="Extra Iceberg catalog properties, e.g. jdbc.user, jdbc.password."
    )
    warehouse: str | None = Field(None, description="Warehouse location; default file://<data_dir>/warehouse.")
    namespace: str = Field("icelog", description="Namespace of archive tables (a topic's table config wins).")
    spark_master: str = Field(
        default_factory=lambda: f"local[{max(1, (os.cpu_count() or 2) // 2)}]",
        description="spark.master: local[N] (default: half the cores, the rest stay the broker's), or spark://HOST:PORT.",
    )
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark conf entries.")
    poll_interval_ms: int = Field(500, gt=0, description="How often the archiver looks for due archives.")
    retry_backoff_max_ms: int = Field(
        30000, gt=0, description="Longest wait between retries of a failing topic (backoff is per topic)."
    )
    topic_wait_ms: int = Field(
        30000, gt=0, description="Longest a continuous pass waits for one topic before going on to the others."
    )
    nice: int = Field(
        10, ge=0, le=19, description="CPU niceness the archiver process (and Spark under it) runs at; 0: as the broker."
    )
    max_lag_bytes: int = Field(
        4 * 1024 * 1024 * 1024,
        gt=0,
        description="Default icelog.archive.max.lag.bytes: unarchived intake per topic before produce is refused.",
    )
    max_bytes: int = Field(
        128 * 1024 * 1024, gt=0, description="Default icelog.archive.max.bytes: an archive is cut at this size."
    )
    complete_delay_max_ms: int = Field(
        2000, ge=0, description="Default icelog.archive.complete.delay.max.ms: longest an archive stays open."
    )
    idle_max_ms: int = Field(
        500, ge=0, description="Default icelog.archive.idle.max.ms: complete an archive idle this long."
    )
    intake_retention_ms: int = Field(
        3600000,
        ge=-1,
        description="Default icelog.intake.retention.ms: drop archived intake older than this once consumers "
        "can read the table instead (-1: keep it).",
    )
    readback_cache_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="Record batches built from archive tables kept in memory (LRU)."
    )
    maintenance_interval_ms: int = Field(
        300_000, gt=0, description="Least time between two automatic maintenance rounds of one table."
    )
    maintenance_min_new_files: int = Field(
        50, ge=1, description="Data files added since the last round that make a table due for compaction."
    )
    maintenance_small_file_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Data files below this size are compacted (min-file-size-bytes)."
    )
    maintenance_group_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Most bytes one compaction commit (and one rewrite task) rewrites (max-file-group-size-bytes); "
        "at most maintenance_small_file_bytes, so a compacted file fills a group alone and is not rewritten again.",
    )
    maintenance_min_input_files: int = Field(
        2, ge=2, description="Fewest small files of one partition worth rewriting (min-input-files)."
    )
    maintenance_delete_ratio: float = Field(
        0.3, gt=0, le=1, description="Rewrite a data file once deletes cover this share of its rows."
    )
    maintenance_snapshot_age_ms: int = Field(
        3_600_000, gt=0, description="history.expire.max-snapshot-age-ms of tables that do not set it."
    )
    maintenance_min_snapshots: int = Field(
        10, ge=1, description="history.expire.min-snapshots-to-keep of tables that do not set it."
    )
    maintenance_orphan_age_ms: int = Field(
        86_400_000,
        ge=3_600_000,
        description="Only files unreferenced and older than this are removed as orphans (at least 1 h).",
    )
    maintenance_max_manifests: int = Field(
        32, ge=2, description="Rewrite a table's manifests once its current snapshot has more than this many."
    )
    maintenance_nice: int = Field(
        19,
        ge=0,
        le=19,
        description="CPU niceness of maintenance rounds: the archiver runs each round as a child process "
        "(`icelog maintain --due`, a Spark of its own) at this niceness, so archive passes get the CPU first.",
    )


class Settings(BaseSettings):
    """Everything `icelog serve` needs; each field can come from icelog.yaml, ICELOG_<NAME> or a flag."""

    model_config = SettingsConfigDict(env_prefix="ICELOG_", env_nested_delimiter="__", extra="forbid")

    listen: str = Field("localhost:9092", description="HOST:PORT of the Kafka listener.")
    advertised_host: str | None = Field(None, description="Host name clients are told to connect to.")
    data_dir: Path = Field(Path("./icelog-data"), description="Where all state lives.")
    node_id: int = Field(0, ge=0)
    cluster_id: str = "icelog-cluster"
    meta_url: str | None = Field(None, description="Metadata store; default sqlite:///<data_dir>/meta.db.")
    auto_create_topics_enable: bool = Field(True, description="Kafka's auto.create.topics.enable.")
    num_partitions: int = Field(1, ge=1, description="Partitions of auto-created topics (Kafka's num.partitions).")
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, gt=0, description="Largest request accepted.")
    connections_max_idle_ms: int = Field(
        600000, gt=0, description="Kafka's connections.max.idle.ms: close a connection with no request in flight "
        "that sent no request for this long."
    )
    queued_max_request_bytes: int = Field(
        200 * 1024 * 1024,
        gt=0,
        description="Kafka's queued.max.request.bytes: bytes of requests being read or handled, over all "
        "connections; at the bound the broker stops reading requests until some finish, and a single request "
        "larger than it closes its connection.",
    )
    max_connections: int = Field(
        2147483647, gt=0, description="Kafka's max.connections: further connections are closed when accepted."
    )
    max_connections_per_ip: int = Field(
        2147483647, gt=0, description="Kafka's max.connections.per.ip: further connections from one address "
        "are closed when accepted."
    )
    retention_check_interval_ms: int = Field(5000, gt=0)
    group_initial_rebalance_delay_ms: int = Field(
        3000, ge=0, description="Kafka's group.initial.rebalance.delay.ms: wait for more members of a new group."
    )
    group_min_session_timeout_ms: int = Field(6000, gt=0, description="Kafka's group.min.session.timeout.ms.")
    group_max_session_timeout_ms: int = Field(1800000, gt=0, description="Kafka's group.max.session.timeout.ms.")
    transaction_max_timeout_ms: int = Field(900000, gt=0, description="Kafka's transaction.max.timeout.ms.")
    registry_listen: str = Field(
        "localhost:8081",
        description="HOST:PORT of the embedded Confluent-compatible schema registry ('off': do not serve it).",
    )
    registry_url: str | None = Field(
        None, description="An external schema registry (http://HOST:PORT); when set, icelog serves none of its own."
    )
    registry_cache_ttl_ms: int = Field(
        5000, ge=0, description="How long produce-time enforcement trusts a subject's cached latest schema."
    )
    topic_defaults: dict[str, str] = Field(
        default_factory=dict, description="Topic config defaults for new topics, e.g. retention.ms: '86400000'."
    )
    intake: IntakeSettings = Field(default_factory=lambda: IntakeSettings())  # type: ignore[call-arg]
    archive: ArchiveSettings = Field(default_factory=lambda: ArchiveSettings())  # type: ignore[call-arg]

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"listen must be HOST:PORT, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0] or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @field_validator("registry_listen")
    @classmethod
    def _check_registry_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if value != "off" and (not sep or not port.isdigit()):
            raise ValueError(f"registry_listen must be HOST:PORT or off, got {value!r}")
        return value

    @property
    def serves_registry(self) -> bool:
        """Whether this broker serves the embedded schema registry."""
        return self.registry_url is None and self.registry_listen != "off"

    @property
    def metadata_url(self) -> str:
        return self.meta_url or f"sqlite:///{self.data_dir / 'meta.db'}"

    @property
    def catalog_uri(self) -> str:
        """The Iceberg catalog URI (embedded default: JDBC on SQLite in the data directory)."""
        return self.archive.catalog_uri or f"jdbc:sqlite:{Path(self.data_dir).resolve() / 'catalog.db'}"

    @property
    def warehouse(self) -> str:
        return self.archive.warehouse or (Path(self.data_dir).resolve() / "warehouse").as_uri()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) win over the environment, which wins over the YAML file.
        yaml_file = _yaml_file_for_load
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if yaml_file is not None:
            sources += (YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),)
        return sources


_yaml_file_for_load: Path | None = None


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from the YAML file (if any), the ICELOG_* environment and explicit overrides."""
    global _yaml_file_for_load
    path = Path(config_file) if config_file else Path(os.environ.get("ICELOG_CONFIG", DEFAULT_CONFIG_FILE))
    if config_file and not path.exists():
        raise ConfigError(f"config file {path} does not exist; create it or drop --config")
    if path.exists():
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if content is not None and not isinstance(content, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    _yaml_file_for_load = path if path.exists() else None
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        where = path if path.exists() else "environment/flags"
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    finally:
        _yaml_file_for_load = None
