"""Prometheus metrics and health endpoints of a broker (docs/metrics.md).

`icelog.instruments` holds what the hot paths update (requests, group commits); this package adds what is read
when Prometheus scrapes (collector.py), the freshness observations (freshness.py), /readyz (health.py) and the
listener (server.py). It sits above the wire, the log and the archive, which never import it.
"""

from __future__ import annotations

from collections.abc import Callable

from kafka.protocol.api_key import ApiKey
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, disable_created_metrics

from icelog.config import Settings
from icelog.instruments import IntakeMetrics, ObjectStoreMetrics, WireMetrics
from icelog.log.manager import LogManager
from icelog.meta.store import MetadataStore
from icelog.metrics.collector import BrokerCollector
from icelog.metrics.freshness import FreshnessWatch
from icelog.metrics.health import Readiness
from icelog.metrics.memory import MemoryCollector
from icelog.metrics.server import MetricsServer
from icelog.readback.service import ReadBack
from icelog.security.connections import METRICS_MAX_CONNECTIONS
from icelog.security.tls import server_context

__all__ = ["BrokerMetrics"]


class BrokerMetrics:
    """One broker's registry, its instruments and collectors, and the listener that serves them."""

    def __init__(self, settings: Settings, store: MetadataStore, logs: LogManager, readback: ReadBack,
                 apis: list[int], kafka_serving: Callable[[], bool], archiver_alive: Callable[[], bool],
                 archiver_restarts: Callable[[], int], max_connections: int = METRICS_MAX_CONNECTIONS) -> None:
        self.settings = settings
        # No `_created` series beside every counter (prometheus-client's default): they double the series for a
        # figure Prometheus does not use.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)
        names = {key: ApiKey(key).name for key in apis if key in ApiKey._value2member_map_}
        self.wire = WireMetrics(self.registry, names, [spec.name for spec in settings.listener_specs])
        self.intake = IntakeMetrics(self.registry)
        self.object_store = ObjectStoreMetrics(self.registry)
        self.freshness = FreshnessWatch(self.registry, store)
        self.registry.register(BrokerCollector(settings, store, logs, readback, archiver_restarts))
        self.registry.register(MemoryCollector(settings, logs, readback))
        self.readiness = Readiness(settings, store, logs, kafka_serving, archiver_alive)
        self.server = MetricsServer(self.registry, self.readiness, server_context(settings, client_auth="none"),
                                    max_connections)

    async def start(self) -> None:
        host, _, port = self.settings.metrics_listen.rpartition(":")
        await self.server.start(host or "0.0.0.0", int(port))

    async def stop(self) -> None:
        await self.server.stop()
