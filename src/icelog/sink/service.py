"""Running a sink: the archiver's passes over a source cluster (sink/source_store.SourceView), its status file.

A sink is the built-in archiver pointed at another cluster: the same planner, tasks, layouts, primary-key tables,
dead-letter tables and maintenance, with settings derived from the broker's (`sink_settings`): the tasks fetch
from the source (read_committed) with the sink's client settings, tables go to the sink's namespace, schemas
come from the source's registry (if any), and the sink's local state (primary-key indexes, pass figures, its
status) lives in `<data_dir>/sinks/<name>/`. One process runs a sink at a time (the store's `sink-<name>.lock`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icelog.archive.locks import ArchiverLock
from icelog.archive.service import ArchiveService
from icelog.client.cluster import SourceCluster
from icelog.client.properties import parse
from icelog.config import Settings, SinkSettings
from icelog.errors import ConfigError, first_line
from icelog.meta.backends import open_store
from icelog.sink.source_store import SourceView
from icelog.table.config import archive_config, table_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
# How often the watcher looks at the source's end offsets: one ListOffsets per topic (to each partition leader)
# every 100 ms is a consumer's fetch rate, and a look every poll interval (500 ms) would stamp a run up to that late,
# its archive delays with it (freshness p50 +0.25 s).
WATCH_EVERY_S = 0.1


def sink_dir(settings: Settings, name: str) -> Path:
    return Path(settings.data_dir).resolve() / "sinks" / name


def sink_settings(settings: Settings, name: str) -> Settings:
    """The archiver's settings for sink `name`: the broker's lake (catalog, warehouse, Spark) and metadata store,
    the sink's source, namespace, registry and client."""
    sink = settings.sinks[name]
    archive = settings.archive.model_copy(update={
        "namespace": sink.namespace or name,
        "default_kind": "iceberg",
        "read_via": "kafka",
        "bootstrap_servers": sink.bootstrap_servers,
        "client_properties": dict(sink.client),
        "catalog_uri": settings.catalog_uri,
        "warehouse": settings.warehouse,
    })
    return settings.model_copy(update={
        "data_dir": sink_dir(settings, name),
        "meta_url": settings.metadata_url,
        "registry_url": sink.registry_url,
        "registry_listen": "off",  # a sink's schemas are its source's (registry_url) or none: raw bytes
        "archive": archive,
    })


def group_of(settings: Settings, name: str) -> str:
    return settings.sinks[name].group_id or f"icelog-sink-{name}"


def source_cluster(sink: SinkSettings) -> SourceCluster:
    """A client of the sink's source cluster, with the sink's client settings."""
    return SourceCluster([a.strip() for a in sink.bootstrap_servers.split(",") if a.strip()], parse(sink.client))


def open_view(settings: Settings, name: str) -> SourceView:
    """Sink `name`'s view of its source, over the metadata store `settings` name (the broker's or derived)."""
    sink = settings.sinks[name]
    local = open_store(settings.metadata_url)
    try:
        return SourceView(name, sink, group_of(settings, name), source_cluster(sink), local)
    except BaseException:
        local.close()
        raise


def selected(settings: Settings, names: Sequence[str] | None) -> list[str]:
    """The sinks to run: those named, or every configured one."""
    if not settings.sinks:
        raise ConfigError("no sinks are configured: add a `sinks:` section to icelog.yaml (see docs/sink.md)")
    unknown = sorted(set(names or ()) - set(settings.sinks))
    if unknown:
        raise ConfigError(f"no sink named {', '.join(unknown)}; configured: {', '.join(sorted(settings.sinks))}")
    return list(names) if names else sorted(settings.sinks)


class SinkService:
    """One sink: the view of its source and the archive service running passes over it."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.name = name
        self.settings = sink_settings(settings, name)
        # Its state dir before the first pass: the pass counters (archive/pass_stats.py) go there, and a sink's
        # first `--once` lost them (a warning, no directory) since only write_status, after the pass, made it.
        Path(self.settings.data_dir).mkdir(parents=True, exist_ok=True)
        self.view = open_view(settings, name)
        self.lock = ArchiverLock(self.view.local, f"sink-{name}.lock")
        self._service: ArchiveService | None = None
        self.last_error = ""

    def attach(self, spark: SparkSession) -> ArchiveService:
        """The archive service of this sink, on `spark` (one session serves every sink of a process)."""
        self._service = ArchiveService(self.settings, spark=spark, store=self.view, on_gap=self.view.report_gap,
                                       after_pass=self.write_status, maintenance_args=("--sink", self.name))
        return self._service

    @property
    def service(self) -> ArchiveService:
        assert self._service is not None, "attach a Spark session first"
        return self._service

    def watch(self) -> None:
        """Continuous runs: the source's offsets are looked at every WATCH_EVERY_S (or poll interval, if shorter),
        between passes and during them (source_store.SourceView.watch), so the archive delays count from when
        records arrive: a run is stamped at most that long after its first record came."""
        every_s = min(self.settings.archive.poll_interval_ms / 1000, WATCH_EVERY_S)
        self.view.watch(source_cluster(self.view.sink), every_s)

    def acquire(self, wait_s: float) -> None:
        """One process runs this sink (LockHeldError, retriable, naming the lock, otherwise)."""
        self.lock.acquire(wait_s)

    def run_once(self) -> int:
        """One forced pass of every topic; prints a line per topic; the exit status (1 if any failed)."""
        try:
            results = self.service.run_once(force=True)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {first_line(exc)}"
            self.write_status()
            raise
        for result in results:
            state = f"failed: {result.error}" if result.error else f"{result.records} records"
            print(f"{self.name}/{result.topic}: {state}; next offsets {result.offsets}")
        self.last_error = next((r.error for r in results if r.error), "")
        self.write_status()
        return 1 if any(r.error for r in results) else 0

    def status(self) -> dict[str, Any]:
        """Where each topic stands: source offsets, table offsets, lag (records and seconds), gaps, errors."""
        now_ms = int(time.time() * 1000)
        topics: dict[str, Any] = {}
        for topic in self.view.list_topics_cached():
            config = archive_config(topic.name, topic.configs, self.settings.topic_defaults, self.settings.archive)
            partitions = []
            for p in range(topic.partitions):
                offsets, archived, oldest_ms = self.view.partition_view(topic.topic_id, p)
                lag = None
                if offsets is not None and archived is not None:
                    lag = max(offsets.last_stable - max(archived, offsets.log_start), 0)
                partitions.append({
                    "partition": p,
                    "source_start": offsets.log_start if offsets else None,
                    "source_end": offsets.high_watermark if offsets else None,
                    "source_stable": offsets.last_stable if offsets else None,
                    "table_offset": archived,
                    "lag_records": lag,
                    "lag_seconds": round((now_ms - oldest_ms) / 1000, 1) if lag and oldest_ms >= 0 else 0.0,
                    "error": self.view.errors(topic.topic_id, p),
                })
            topics[topic.name] = {"table": table_key(config.namespace, config.table), "partitions": partitions}
        return {
            "sink": self.name,
            "at_ms": now_ms,
            "group_id": self.view.group_id,
            "bootstrap_servers": self.view.sink.bootstrap_servers,
            "topics": topics,
            "gaps": [g.__dict__ for g in self.view.gaps],
            "error": self.last_error,
        }

    def write_status(self) -> None:
        """`<data_dir>/sinks/<name>/status.json`, which `icelog status` shows (written after every pass)."""
        try:
            data = self.status()
            path = Path(self.settings.data_dir) / STATUS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(data, indent=1))
            os.replace(temporary, path)
        except Exception as exc:  # status is for people; a pass never fails for it
            log.warning("sink %s: could not write its status: %s", self.name, first_line(exc))

    def close(self) -> None:
        self.lock.release()
        if self._service is not None:
            self._service.close()  # closes the view too: the source's connections and the local store
        else:
            self.view.close()


def read_status(settings: Settings, name: str) -> dict[str, Any] | None:
    """The status the sink last wrote (None if it never ran here)."""
    path = sink_dir(settings, name) / STATUS_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data
