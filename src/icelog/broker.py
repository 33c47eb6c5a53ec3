"""Runs a broker: metadata store, intake recovery, the Kafka listener and background upkeep."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import uuid
from collections.abc import Callable
from typing import Any

from icelog import allocator
from icelog.archive.service import ArchiverProcess
from icelog.client.markers import inter_broker_channel
from icelog.cluster.controller import ClusterController
from icelog.cluster.view import GROUP_SHARDS_ID, TXN_SHARDS_ID
from icelog.config import Settings
from icelog.coordinator.consumer_model import ConsumerGroupSettings, TopicsView
from icelog.coordinator.group_model import GroupSettings
from icelog.coordinator.group_shards import GroupShards
from icelog.coordinator.groups import GroupCoordinator
from icelog.coordinator.transactions import TransactionCoordinator
from icelog.coordinator.txn_shards import TxnShards
from icelog.errors import log_retry
from icelog.log import pressure
from icelog.log.backends import clustered
from icelog.log.manager import LogManager
from icelog.log.partition import OffsetRangeSource
from icelog.meta.backends import open_store
from icelog.meta.store import BrokerLease, TopicRecord
from icelog.metrics import BrokerMetrics
from icelog.readback.service import ReadBack
from icelog.schema.codec.registry_source import StoreSchemaSource
from icelog.schema.enforce.enforcement import Enforcer, HttpSchemaSource, LocalSchemaSource, SchemaSource
from icelog.schema.registry.server import RegistryServer, registry_server
from icelog.schema.registry.service import RegistryService
from icelog.schema.registry_client import RegistryClient
from icelog.security.authorizer import Authorizer
from icelog.security.connections import connection_budgets, raise_descriptor_limit
from icelog.security.oauth import TokenValidator
from icelog.topics import EffectiveConfig
from icelog.wire.context import HANDLERS, BrokerState
from icelog.wire.server import KafkaServer, ListenerError

log = logging.getLogger(__name__)

TRIM_CHECK_S = 10.0  # how often malloc's free memory is held against memory.malloc_free_max_bytes


class Broker:
    """One icelog broker process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # The whole store; each part below is handed the slices it uses (the log closes it on shutdown).
        self.store = open_store(settings.metadata_url)
        self.logs = LogManager(settings, self.store)
        # One of a cluster (intake on object storage, metadata in PostgreSQL): it serves the partitions and
        # coordinator shards it leads (cluster/controller.py). A restart is a new incarnation of its node id.
        self.lease: BrokerLease | None = None
        self.cluster: ClusterController | None = None
        self._replaced: str | None = None
        if clustered(settings):
            self.lease = BrokerLease(settings.node_id, uuid.uuid4().hex)
            self.logs.join_cluster(self.lease)
        first = settings.listener_specs[0]  # the listeners' own addresses are known once they are bound
        self.state = BrokerState(settings, self.logs, first.advertised_host or first.host, first.port)
        self.state.security = self.store
        if "OAUTHBEARER" in settings.sasl_mechanisms:
            self.state.tokens = TokenValidator(settings)
        self.groups = GroupCoordinator(self.store, GroupSettings(
            settings.group_initial_rebalance_delay_ms, settings.group_min_session_timeout_ms,
            settings.group_max_session_timeout_ms,
        ), ConsumerGroupSettings(
            session_timeout_ms=settings.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=settings.group_consumer_heartbeat_interval_ms,
            assignors=tuple(settings.group_consumer_assignors.split(",")),
        ), lambda: TopicsView(self.logs.topics))
        self.transactions = TransactionCoordinator(
            self.store, self.logs, self.groups, settings.transaction_max_timeout_ms
        )
        self.state.groups, self.state.transactions = self.groups, self.transactions
        self.txn_shards: TxnShards | None = None
        self.group_shards: GroupShards | None = None
        if self.lease is not None:  # it coordinates the transactional ids of the shards it leads
            view = lambda: self.cluster.view if self.cluster is not None else None  # noqa: E731
            self.txn_shards = TxnShards(self.transactions, view, inter_broker_channel(settings, view),
                                      self.lease)
        if settings.authorizes:  # ACLs from the store; None lets every principal do anything
            self.state.authorizer = Authorizer(
                self.store, settings.super_user_set, settings.allow_everyone_if_no_acl_found
            )
        # Descriptors: the soft limit raised to the hard one, then split between the servers so that the broker's
        # own files and /healthz always have some (security/connections.py).
        self.budgets = connection_budgets(raise_descriptor_limit(), settings.max_connections)
        self.server = KafkaServer(self.state, self.budgets.kafka)
        # The embedded schema registry, unless an external one is configured (registry_url).
        self.registry_service = RegistryService(self.store)
        # (after state.authorizer is set: subjects follow topic ACLs)
        self.registry: RegistryServer | None = None
        if settings.serves_registry:
            self.registry = registry_server(settings, self.registry_service, self.store, self.state.authorizer,
                                            self.state.logins, self.budgets.registry)
        self.schema_source: SchemaSource = LocalSchemaSource(self.registry_service)
        if settings.registry_url:
            self.schema_source = HttpSchemaSource(settings.registry_url)
        self.state.enforcer = Enforcer(self.schema_source, settings.registry_cache_ttl_ms, settings.topic_defaults)
        self._stopping = asyncio.Event()
        self._retention: asyncio.Future[int] | None = None  # the retention pass in flight, on a worker thread
        self.archiver: ArchiverProcess | None = None
        self.sinks: ArchiverProcess | None = None  # `icelog sink`, when icelog.yaml configures sinks
        # Read-back: partitions of archived topics serve offsets below the intake from the Iceberg table.
        schemas = (RegistryClient(settings.registry_url) if settings.registry_url
                   else StoreSchemaSource(self.store))
        self.readback = ReadBack(settings, schemas)
        if self.readback.enabled:
            self.logs.older_sources = self._older_sources
        # Prometheus metrics, /healthz and /readyz (metrics_listen); None: not served, and nothing is counted.
        self.metrics: BrokerMetrics | None = None
        if settings.serves_metrics:
            self.metrics = BrokerMetrics(
                settings, self.store, self.logs, self.readback, sorted(HANDLERS), self.server.serving,
                lambda: self.archiver is not None and self.archiver.running(),
                lambda: self.archiver.restarts if self.archiver is not None else 0, self.budgets.metrics,
            )
            self.state.wire_metrics = self.metrics.wire
            self.logs.storage.on_commit = self.metrics.intake.observe_commit
            self.logs.storage.on_request = self.metrics.object_store.observe

    def _older_sources(self, record: TopicRecord, config: EffectiveConfig, partition: int) -> list[OffsetRangeSource]:
        source = self.readback.source(record.topic_id, record.name, record.configs, partition, config.log_append_time)
        return [] if source is None else [source]

    def _check_budgets(self) -> None:
        """Say at start-up what the descriptor limit allows, and warn when max_connections leaves too little."""
        budgets, auto = self.budgets, connection_budgets(self.budgets.descriptors, None)
        log.info("descriptor limit %d: up to %d Kafka connections, %d registry, %d metrics, %d for the broker's files",
                 budgets.descriptors, budgets.kafka, budgets.registry, budgets.metrics, budgets.own_files)
        if budgets.kafka > auto.kafka:
            log.warning("max_connections=%d leaves %d of the process's %d descriptors for the registry, /healthz and "
                        "the broker's own files: a flood of connections can stop them (at most %d keeps %d free; "
                        "or raise the limit: ulimit -n)", budgets.kafka, max(0, budgets.own_files + budgets.registry
                        + budgets.metrics), budgets.descriptors, auto.kafka, budgets.descriptors - auto.kafka)

    async def run(self) -> None:
        """Recover, serve until SIGINT/SIGTERM, then shut down cleanly."""
        self._check_budgets()
        registry_logins = self.registry is not None and self.registry.access is not None
        plain_logins = "PLAIN" in self.settings.sasl_mechanisms and any(s.sasl for s in self.settings.listener_specs)
        if registry_logins or plain_logins:
            self.state.logins.warm()  # password checks run in a process: spawn it before the first login
        self.logs.open()
        # Plan the tables before serving: the log start consumers see must be the table's from the start.
        await asyncio.to_thread(self.readback.refresh_all)
        self.logs.start()
        if self.lease is None:
            self.groups.load()
        else:  # a cluster's broker: the groups of the coordinator shards it takes (below)
            self.groups.shards = self.group_shards = GroupShards(self.groups, self.lease)
        self.transactions.load()
        if self.lease is None:  # (a cluster's broker: once it leads the partitions the markers go to, below)
            await self.transactions.recover()  # before serving: finish or abort what a crash left open
        self.groups.start()
        self.transactions.start()
        if self.registry is not None:  # before the Kafka listener: a taken port stops start-up cleanly
            host, _, port = self.settings.registry_listen.rpartition(":")
            try:
                await self.registry.start(host or "0.0.0.0", int(port))
            except OSError as exc:
                raise SystemExit(
                    f"icelog: cannot serve the schema registry on {self.settings.registry_listen}: {exc} "
                    "(set registry_listen / --registry-listen, or off)"
                ) from exc
        if self.metrics is not None:
            try:
                await self.metrics.start()
            except OSError as exc:
                raise SystemExit(
                    f"icelog: cannot serve metrics on {self.settings.metrics_listen}: {exc} "
                    "(set metrics_listen / --metrics-listen, or off)"
                ) from exc
        try:
            await self.server.start(accepting=self.lease is None)
        except ListenerError as exc:
            raise SystemExit(
                f"icelog: cannot serve Kafka on {exc.where}: {exc.strerror} (another broker on that port? set "
                "listeners, or listen / --listen)"
            ) from exc
        cluster_task: asyncio.Task[None] | None = None
        if self.lease is not None:
            settings = self.settings
            assert self.group_shards is not None and self.txn_shards is not None
            self.cluster = ClusterController(
                self.store, self.logs, self.lease, heartbeat_interval_ms=settings.broker_heartbeat_interval_ms,
                session_timeout_ms=settings.broker_session_timeout_ms, endpoints=self.server.advertised,
                rack=settings.broker_rack,
                shard_owners={GROUP_SHARDS_ID: self.group_shards, TXN_SHARDS_ID: self.txn_shards},
                on_replaced=self._on_replaced, on_topic_deleted=self.groups.forget_topic,
            )
            self.state.cluster = self.cluster
            await self.cluster.join()
            await self.transactions.recover()
            self.server.accept()
            cluster_task = asyncio.create_task(self.cluster.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        if self.settings.archive.enabled:
            # A child process: the Spark driver must not share this event loop (or its GIL).
            self.archiver = ArchiverProcess(self.settings)
            self.archiver.start()
        if self.settings.sinks:
            self.sinks = ArchiverProcess(self.settings, "sink")
            self.sinks.start()
        upkeep = asyncio.create_task(self._upkeep())
        readback_task = asyncio.create_task(self._refresh_readback())
        pressure_task = asyncio.create_task(self._refresh_pressure())
        trim_task = asyncio.create_task(self._trim_memory())
        tls = any(spec.tls for spec in self.settings.listener_specs)
        print(
            f"icelog serving Kafka on {', '.join(self.server.endpoints())} (data in {self.settings.data_dir})"
            + (f", schema registry on {'https' if tls else 'http'}://{self.settings.registry_listen}"
               if self.registry is not None else "")
            + (f", metrics on {'https' if tls else 'http'}://{self.settings.metrics_listen}"
               if self.metrics is not None else ""),
            flush=True,
        )
        stop_wait = asyncio.create_task(self._stopping.wait())
        waiters: set[asyncio.Future[Any]] = {stop_wait, self.logs.storage.failure()}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        upkeep.cancel()
        if cluster_task is not None:
            cluster_task.cancel()
        if self._retention is not None:  # a retention pass in flight ends first (it uses the store)
            await asyncio.wait({self._retention})
        pressure_task.cancel()
        readback_task.cancel()
        trim_task.cancel()
        if self.archiver is not None:
            if stop_wait.done() and self.archiver.running():
                print("icelog stopping: the archiver first ends the pass in flight (at most 15 s)", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, self.archiver.stop)
        if self.sinks is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.sinks.stop)
        await self.server.stop()
        if self.registry is not None:
            await self.registry.stop()
        if self.metrics is not None:
            await self.metrics.stop()
        await self.transactions.stop()
        await self.groups.stop()
        self.state.logins.close()
        failed = self.logs.storage.failed
        await self.logs.close(self.cluster.leave if self.cluster is not None and self._replaced is None else None)
        if failed is not None:
            raise SystemExit(f"icelog: stopped because the intake could not be written: {failed}")
        if self._replaced is not None:
            raise SystemExit(f"icelog: stopped: {self._replaced}")
        log.info("icelog stopped")

    def _on_replaced(self, why: str) -> None:
        """Another process registered this node id: this one serves nothing more and stops (fail-stop)."""
        log.critical("stopping: %s", why)
        self._replaced = why
        self._stopping.set()

    async def _upkeep(self) -> None:
        interval = self.settings.retention_check_interval_ms / 1000
        loop = asyncio.get_running_loop()
        on_loop = _on_loop(loop)
        while True:
            await asyncio.sleep(interval)
            if self.archiver is not None:
                self.archiver.check()
            if self.sinks is not None:
                self.sinks.check()
            # On a worker thread: a retention pass reads the store, commits trims durably (an fsync) and
            # deletes files, and each would stall every connection; only its in-memory changes run here.
            # Shielded: shutting down waits for a pass in flight (`run`) instead of closing the store under it.
            self._retention = loop.run_in_executor(None, lambda: self.logs.enforce_retention(on_loop=on_loop))
            try:
                await asyncio.shield(self._retention)
            except Exception as exc:
                log_retry(log, "retention pass", exc)


    async def _refresh_readback(self) -> None:
        """Keep each archived partition's table plan current (so the event loop reads start offsets from memory)."""
        while self.readback.enabled:
            await asyncio.sleep(1.0)
            served = {state.record.topic_id for state in list(self.logs.topics.values())}
            await asyncio.to_thread(self.readback.refresh_all, served)

    async def _trim_memory(self) -> None:
        """Give malloc's free memory back to the system once it holds more than memory.malloc_free_max_bytes
        (allocator.py says why it accumulates); on a worker thread, as malloc_trim walks every arena."""
        bound = self.settings.memory.malloc_free_max_bytes
        while True:
            await asyncio.sleep(TRIM_CHECK_S)
            freed = await asyncio.to_thread(allocator.trim, bound)
            if freed is not None:
                log.debug("gave back malloc's free memory (%d bytes free)", freed)

    async def _refresh_pressure(self) -> None:
        """Keep the back-pressure counters current (log/pressure.py): store and disk reads off the event loop."""
        while True:
            try:
                states = await asyncio.to_thread(self.store.archive_states)
                unarchived = await asyncio.to_thread(self.logs.count_unarchived, states)
                written = self.logs.storage.stats.bytes_written  # what the reading can see, at least
                capacity = await asyncio.to_thread(self.logs.storage.capacity)
                self.logs.apply_pressure(unarchived, capacity.free_bytes, written)
            except Exception as exc:
                log_retry(log, "back-pressure refresh", exc)
            else:
                if self.metrics is not None:  # produce → visible in Iceberg, as archived offsets move
                    try:
                        await asyncio.to_thread(self.metrics.freshness.observe, states, self.store)
                    except Exception as exc:
                        log_retry(log, "freshness observation", exc)
            await asyncio.sleep(pressure.REFRESH_INTERVAL_S)


def _on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], None]], None]:
    """For a worker thread: run a change on the event loop and wait until it is done (its error raised here)."""

    def run(change: Callable[[], None]) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def call() -> None:
            try:
                change()
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        loop.call_soon_threadsafe(call)
        done.result()

    return run


