"""Several real icelog brokers sharing one PostgreSQL database and one SeaweedFS bucket (issue 46): each a
`BrokerProcess` with its own node id, port and data dir, so tests can kill -9 any one, delete its data dir and
start it again."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from icelog.client.connection import BrokerConnection
from icelog.client.properties import ClientProperties
from tests.support.broker import BrokerProcess, free_port
from tests.support.postgres import PostgresCluster
from tests.support.seaweedfs import BUCKET, SeaweedFS

# Short heartbeats, so a dead broker's partitions move within a few seconds (the defaults: 1 s and 6 s).
CLUSTER_ENV = {
    "ICELOG_BROKER_HEARTBEAT_INTERVAL_MS": "500",
    "ICELOG_BROKER_SESSION_TIMEOUT_MS": "4000",
    "ICELOG_INTAKE__COMMIT_INTERVAL_MS": "50",
    "ICELOG_ARCHIVE__ENABLED": "false",
}


@contextmanager
def three_brokers(postgres: PostgresCluster, root: Path, topics: Mapping[str, int] | None = None,
                  **options: Any) -> Iterator[BrokerCluster]:
    """A SeaweedFS of its own, a new PostgreSQL database and three brokers over them, started, with `topics`
    ({name: partitions}) created and led; everything stopped on leaving. `options` go to BrokerCluster."""
    store = SeaweedFS(root / "seaweedfs").start()
    try:
        brokers = BrokerCluster(root, store, postgres.new_database(), **options)
        try:
            brokers.start()
            if topics:
                admin = AdminClient({"bootstrap.servers": brokers.bootstrap, **brokers.client})
                for future in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
                    future.result(30)
                brokers.wait_settled(tuple(topics))
            yield brokers
        finally:
            brokers.stop()
    finally:
        store.discard()  # (nothing reads it again)


class BrokerCluster:
    """`size` brokers, node ids 0..size-1, over `meta_url` and s3://BUCKET/`prefix`."""

    def __init__(self, root: Path, store: SeaweedFS, meta_url: str, size: int = 3, prefix: str = "cluster",
                 env: dict[str, str] | None = None, protocol: str | None = None,
                 client: dict[str, str] | None = None, node_env: Mapping[int, dict[str, str]] | None = None) -> None:
        """`protocol`: each broker's one listener speaks it (default: PLAINTEXT on `--listen`); `client`: the
        librdkafka settings (security.protocol, SASL credentials) this class's own admin clients use; `node_env`:
        more environment for some brokers, by node id (a fault to inject in one)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.store = store
        self.meta_url = meta_url
        self.client = client or {}
        base = {**CLUSTER_ENV, **store.env(), "ICELOG_META_URL": meta_url,
                "ICELOG_INTAKE__URL": f"s3://{BUCKET}/{prefix}", **(env or {})}
        self.brokers = []
        for n in range(size):
            port = free_port() if protocol else None  # the listener names it: it must not move on a restart
            listener = {"ICELOG_LISTENERS": f"{protocol}://127.0.0.1:{port}"} if protocol else {}
            # (a cluster's broker listens once it holds its share: slow on a busy machine)
            self.brokers.append(BrokerProcess(root / f"broker-{n}", port=port, start_timeout=120,
                                              env={**base, **listener, **(node_env or {}).get(n, {}),
                                                   "ICELOG_NODE_ID": str(n)}))

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def alive(self) -> list[int]:
        return [n for n, b in enumerate(self.brokers) if b.proc is not None and b.proc.poll() is None]

    def start(self) -> BrokerCluster:
        for broker in self.brokers:
            broker.start()
        self.wait_settled(timeout=90)
        return self

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()

    def wait_settled(self, topics: tuple[str, ...] = (), timeout: float = 60.0) -> dict[str, dict[int, int]]:
        """Until every running broker is listed by Metadata (asked of each running broker) and every partition of
        `topics` has a running leader; the leaders {topic: {partition: node}}."""
        deadline = time.monotonic() + timeout
        running = set(self.alive())
        last = ""
        while time.monotonic() < deadline:
            try:
                leaders = self._leaders(running, topics)
            except AssertionError as exc:
                last = str(exc)
                time.sleep(0.2)
                continue
            return leaders
        raise AssertionError(f"the cluster did not settle in {timeout}s: {last}")

    def _leaders(self, running: set[int], topics: tuple[str, ...]) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for n in running:
            admin = AdminClient({"bootstrap.servers": self.brokers[n].bootstrap, **self.client})
            md = admin.list_topics(timeout=5)
            listed = set(md.brokers)
            assert listed == running, f"broker {n} lists brokers {sorted(listed)}, running {sorted(running)}"
            for topic in topics:
                meta = md.topics.get(topic)
                assert meta is not None and meta.error is None, f"topic {topic}: {meta and meta.error}"
                leaders = {p: part.leader for p, part in meta.partitions.items()}
                assert all(node in running for node in leaders.values()), f"{topic} leaders {leaders}"
                if topic in out:
                    assert out[topic] == leaders, f"brokers disagree on {topic}: {out[topic]} / {leaders}"
                out[topic] = leaders
        return out


class ProducerStream:
    """An idempotent acks=all producer writing unique values round-robin over `partitions` on a thread of its own,
    as fast as it can or at about `rate` records a second, remembering every delivery report (a failed one is an
    error the application would see). A context manager: leaving it flushes, and every record must be answered."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float | None = None) -> None:
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "compression.type": "lz4", "message.timeout.ms": 120_000, "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 1000,
            # A bounded buffer, as an application has: unbounded, "as fast as it can" queues faster than a loaded
            # machine acknowledges, and records would time out in the queue for no fault of the brokers. A stall
            # still shows: the buffer fills and the acknowledgements stop.
            "queue.buffering.max.messages": 4000,
        })
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, str] = {}
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer-stream", daemon=True)
        self._rng = random.Random(7)

    def _report(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked[msg.value()] = (msg.partition(), msg.offset())
        else:
            self.failed[msg.value()] = str(err)

    def _run(self) -> None:
        pause = 10 / self.rate if self.rate else 0.0
        while not self._stop.wait(pause):
            for _ in range(10 if self.rate else 20):
                value = f"v-{self.sent:08d}-".encode() + b"x" * self._rng.randrange(0, 200)
                try:
                    self.producer.produce(self.topic, value, partition=self.sent % self.partitions,
                                          on_delivery=self._report)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0 if self.rate else 0.005)

    def __enter__(self) -> ProducerStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self.producer.flush(120) == 0, "every record answered"
        del self.producer  # (destroyed now: it would go on trying brokers a test stopped until collected)

    def acked_count(self) -> int:
        return len(self.acked)


class EpochWatch:
    """Asks every running broker of `cluster` for `topic`'s Metadata, round after round on a thread of its own, and
    remembers the leaders each (partition, leader epoch) was named with. Kafka's invariant: one epoch names one
    leader (-1, no leader, aside). Brokers' views differ for a heartbeat; if two of them named two leaders under one
    epoch, a client asking both would flip between them (librdkafka can then stay on the wrong broker for good)."""

    def __init__(self, cluster: BrokerCluster, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        self.named: dict[tuple[int, int], set[int]] = {}
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-watch", daemon=True)

    def _run(self) -> None:
        links: dict[int, BrokerConnection] = {}
        request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=self.topic)],
                                  allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                                  include_topic_authorized_operations=False)
        while not self._stop.wait(0.02):
            for n in self.cluster.alive():
                try:
                    if n not in links:
                        links[n] = BrokerConnection(self.cluster.brokers[n].bootstrap, ClientProperties())
                    answer = links[n].request(request, 9, MetadataResponse)
                except Exception:  # a broker killed or starting: asked again next round
                    link = links.pop(n, None)
                    if link is not None:
                        link.close()
                    continue
                self.answers += 1
                for part in (p for t in answer.topics for p in t.partitions):
                    if part.leader_id >= 0:
                        self.named.setdefault((part.partition_index, part.leader_epoch), set()).add(part.leader_id)
        for link in links.values():
            link.close()

    def __enter__(self) -> EpochWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def conflicts(self) -> dict[tuple[int, int], set[int]]:
        """{(partition, epoch): leaders} of every epoch named with more than one leader."""
        return {key: leaders for key, leaders in self.named.items() if len(leaders) > 1}
