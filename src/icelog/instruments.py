"""The Prometheus instruments the hot paths update: the Kafka listener (per API) and the intake's group commits.

Every labelled child is created once, up front, so a request costs a dict lookup and a few increments, never a
label set. Everything read at scrape time instead (offsets, lag, tables) is in `icelog.metrics`. Each broker has
its own CollectorRegistry (None of this touches prometheus-client's global registry).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Request latency: a Produce is an fsync (ms), a Fetch may long-poll for its max_wait_ms (seconds).
REQUEST_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FSYNC_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
COMMIT_BYTES_BUCKETS = tuple(float(1 << n) for n in range(10, 27, 2))  # 1 KiB .. 64 MiB
COMMIT_APPENDS_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)


class ApiInstruments:
    """One Kafka API's children: what a request of it updates."""

    __slots__ = ("errors", "received", "requests", "seconds", "sent")

    def __init__(self, metrics: WireMetrics, api: str) -> None:
        self.requests = metrics.requests.labels(api)
        self.errors = metrics.errors.labels(api)
        self.seconds = metrics.seconds.labels(api)
        self.received = metrics.received.labels(api)
        self.sent = metrics.sent.labels(api)


class WireMetrics:
    """Requests, errors, latency and bytes per Kafka API; open connections per listener."""

    def __init__(self, registry: CollectorRegistry, apis: Mapping[int, str], listeners: Iterable[str]) -> None:
        self.requests = Counter("icelog_requests", "Kafka requests answered (or failed), per API.", ["api"],
                                registry=registry)
        self.errors = Counter(
            "icelog_request_errors", "Kafka requests that failed: the handler raised (the connection is closed) or "
            "the response's top-level error code is not 0.", ["api"], registry=registry,
        )
        self.seconds = Histogram(
            "icelog_request_duration_seconds", "From a request read whole to its response written, per API "
            "(a Fetch's long poll included).", ["api"], buckets=REQUEST_SECONDS_BUCKETS, registry=registry,
        )
        self.received = Counter("icelog_request_bytes", "Bytes of Kafka requests read (size prefix included).",
                                ["api"], registry=registry)
        self.sent = Counter("icelog_response_bytes", "Bytes of Kafka responses written (size prefix included).",
                            ["api"], registry=registry)
        self.connections = Gauge("icelog_connections", "Open Kafka client connections, per listener.",
                                 ["listener"], registry=registry)
        self.by_key = {key: ApiInstruments(self, name) for key, name in apis.items()}
        self.by_listener = {name: self.connections.labels(name) for name in listeners}


class IntakeMetrics:
    """The intake writer's group commits: their size, and the fsync that makes them durable."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.commit_bytes = Histogram(
            "icelog_intake_group_commit_bytes", "Bytes written by one intake group commit (all its frames).",
            buckets=COMMIT_BYTES_BUCKETS, registry=registry,
        )
        self.commit_appends = Histogram(
            "icelog_intake_group_commit_appends", "Appends (a partition's batches of one Produce) in one group commit.",
            buckets=COMMIT_APPENDS_BUCKETS, registry=registry,
        )
        self.fsync_seconds = Histogram(
            "icelog_intake_fsync_seconds", "Duration of one group commit's fdatasync.",
            buckets=FSYNC_SECONDS_BUCKETS, registry=registry,
        )

    def observe_commit(self, written_bytes: int, appends: int, fsync_seconds: float) -> None:
        """Called by the intake's I/O thread after each group commit."""
        self.commit_bytes.observe(written_bytes)
        self.commit_appends.observe(appends)
        self.fsync_seconds.observe(fsync_seconds)


class ObjectStoreMetrics:
    """The intake's requests to object storage, per kind (put, get, delete, list): what a user pays for."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("icelog_object_store_requests", "Requests to the intake's object store.", ["kind"],
                                registry=registry)
        self.errors = Counter("icelog_object_store_errors", "Requests to the intake's object store that failed "
                              "(each retry counts).", ["kind"], registry=registry)
        self.bytes = Counter("icelog_object_store_bytes", "Bytes sent (put) or received (get) by the intake's "
                             "object store requests.", ["kind"], registry=registry)
        self.seconds = Histogram("icelog_object_store_request_seconds", "Duration of one object store request.",
                                 ["kind"], buckets=REQUEST_SECONDS_BUCKETS, registry=registry)

    def observe(self, kind: str, size: int, seconds: float, failed: bool) -> None:
        """Called after each request, on the thread that made it."""
        self.requests.labels(kind).inc()
        if failed:
            self.errors.labels(kind).inc()
        self.bytes.labels(kind).inc(size)
        self.seconds.labels(kind).observe(seconds)
