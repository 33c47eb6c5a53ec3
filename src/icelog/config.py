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


class IntakeSettings(BaseModel):
    """How the durable intake log writes."""

    segment_bytes: int = Field(256 * 1024 * 1024, gt=0, description="Start a new intake file past this size.")
    flush_max_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Upper bound on the bytes one group commit (one fsync) carries."
    )
    fsync: bool = Field(True, description="fsync each group commit before acknowledging (turn off only in tests).")


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
    retention_check_interval_ms: int = Field(5000, gt=0)
    topic_defaults: dict[str, str] = Field(
        default_factory=dict, description="Topic config defaults for new topics, e.g. retention.ms: '86400000'."
    )
    intake: IntakeSettings = Field(default_factory=IntakeSettings)

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

    @property
    def metadata_url(self) -> str:
        return self.meta_url or f"sqlite:///{self.data_dir / 'meta.db'}"

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
