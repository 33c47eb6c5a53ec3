"""A Kafka cluster seen as a client: its metadata, one connection per broker, each request sent to the broker that
answers it (a partition's leader, a group's coordinator).

The sink's driver archives topics of a cluster icelog does not run (Kafka, Redpanda, MSK, possibly several
brokers), and the archive tasks read through the same class from icelog's own broker. The metadata view (brokers,
each topic's partition leaders and id) is loaded as needed; a connection to a broker is opened on first use and
asks once which versions the broker serves (ApiVersions), so that each request goes at the highest version both
sides know within the range below: Kafka 2.0 to 4.x and icelog's broker all serve one. When the answer says the
view is stale (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE) or a connection breaks, the view is dropped and the request is tried once more; a second
failure is raised (BrokerRequestError or BrokerUnreachableError, their `retriable` flag kept) for the caller's own
retry policy. Blocking, and safe to share between threads (one lock: the requests go one at a time).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from icelog.client.connection import BrokerConnection, BrokerRequestError, BrokerUnreachableError, split_address
from icelog.client.fetch import FETCH_MAX_BYTES, READ_COMMITTED, READ_UNCOMMITTED, Fetched
from icelog.client.properties import ClientProperties
from icelog.errors import ErrorCode, is_retriable
from icelog.topics import INTERNAL_TOPIC_NAMES

T = TypeVar("T")

# The versions this client speaks, per API: the low end is what its fields need (read_committed ListOffsets is v2+,
# Fetch's aborted transactions v4+, FindCoordinator's key type v1+); the high end stops before topic ids replace
# names (Fetch 13, OffsetFetch 8 with groups arrays, FindCoordinator 4 with batched keys). Kafka 4 dropped the
# oldest versions of several APIs, which the low ends avoid too.
VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.Metadata: (4, 11),  # v4+ can say not to create a topic it is asked about; topic ids from v10
    ApiKey.ListOffsets: (2, 6),
    ApiKey.Fetch: (4, 12),
    ApiKey.DescribeConfigs: (1, 4),
    ApiKey.FindCoordinator: (1, 3),
    ApiKey.OffsetCommit: (2, 8),
    ApiKey.OffsetFetch: (1, 7),
}
EARLIEST = -2  # ListOffsets' timestamp for the log start offset
LATEST = -1  # ... for the end of the log: the high watermark, or the last stable offset with read_committed
TOPIC_RESOURCE = 2  # DescribeConfigs' resource type of a topic
GROUP_KEY = 0  # FindCoordinator's key type of a consumer group
# Answers that mean the metadata view (or the group's coordinator) is stale: refresh it, try once more.
STALE_VIEW = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
})
# FindCoordinator's answers while a broker loads its groups, asked again for up to COORDINATOR_WAIT_S (OffsetCommit's
# and OffsetFetch's COORDINATOR_LOAD_IN_PROGRESS likewise: `_while_loading`).
COORDINATOR_LOADING = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
COORDINATOR_WAIT_S = 15.0


@dataclass(frozen=True)
class PartitionOffsets:
    """A partition's offsets now: the first kept, the high watermark, and the last stable offset (where the first
    transaction still open starts; the high watermark when none is)."""

    log_start: int
    high_watermark: int
    last_stable: int


@dataclass(frozen=True)
class TopicLayout:
    """A topic as the metadata gives it: each partition's leader (a node id, -1 for none) and the topic id (None
    before Metadata v10)."""

    name: str
    topic_id: uuid.UUID | None
    leaders: Mapping[int, int]
    internal: bool


class _Link:
    """A connection and the API versions its broker serves (asked once, on connecting)."""

    def __init__(self, address: str, props: ClientProperties) -> None:
        self.address = address
        self.connection = BrokerConnection(address, props)
        try:
            answer = self.connection.request(ApiVersionsRequest(), 0, ApiVersionsResponse)
        except BaseException:
            self.connection.close()
            raise
        if answer.error_code:
            self.connection.close()
            raise _error(answer.error_code, f"ApiVersions of the broker at {address}")
        self.served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}

    def request(self, request: Any, response_class: Any) -> Any:
        """`request` at the highest version both sides speak; UNSUPPORTED_VERSION (not retriable) when none is."""
        key = int(request.API_KEY)
        low, high = VERSIONS[key]
        served_low, served_high = self.served.get(key, (0, -1))
        version = min(high, served_high)
        if version < max(low, served_low):
            name = ApiKey(key).name
            raise BrokerRequestError(
                f"the broker at {self.address} serves {name} versions {served_low}-{served_high}; icelog's client "
                f"speaks {low}-{high}", int(ErrorCode.UNSUPPORTED_VERSION), False)
        return self.connection.request(request, version, response_class)

    def close(self) -> None:
        self.connection.close()


class SourceCluster:
    """A Kafka cluster reached from `bootstrap` (host:port, tried in order) with `props`' security settings."""

    def __init__(self, bootstrap: Sequence[str], props: ClientProperties) -> None:
        self.bootstrap = list(bootstrap)
        self.props = props
        self._lock = threading.RLock()
        self._brokers: dict[int, str] = {}  # node id -> host:port
        self._topics: dict[str, TopicLayout] = {}
        self._coordinators: dict[str, int] = {}  # group id -> node id
        self._links: dict[int, _Link] = {}  # node id -> its connection, opened on first use
        self._seed: _Link | None = None  # a bootstrap connection not yet known as a node

    # -- the public calls -------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Reach the cluster and log in once (BrokerUnreachableError, BrokerLoginError say what failed)."""
        with self._lock:
            self._any_link()

    def topics(self) -> dict[str, int]:
        """Every topic but the internal ones (__consumer_offsets, __transaction_state), with its partition count."""
        with self._lock:
            self._once_more(lambda: self._load(None))
            return {t.name: len(t.leaders) for t in self._topics.values()
                    if not t.internal and t.name not in INTERNAL_TOPIC_NAMES}  # (a broker may not flag them)

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """The topic's id, if the cluster's Metadata version gives one (Kafka 2.8+, icelog)."""
        with self._lock:
            return self._once_more(lambda: self._layout(topic)).topic_id

    def offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, PartitionOffsets]:
        """Log start, high watermark and last stable offset of each partition (three ListOffsets per leader)."""
        wanted = sorted(set(partitions))

        def ask() -> dict[int, PartitionOffsets]:
            start = self._list_offsets(topic, wanted, EARLIEST, READ_UNCOMMITTED)
            end = self._list_offsets(topic, wanted, LATEST, READ_UNCOMMITTED)
            stable = self._list_offsets(topic, wanted, LATEST, READ_COMMITTED)
            return {p: PartitionOffsets(start[p], end[p], stable[p]) for p in wanted}

        with self._lock:
            return self._once_more(ask)

    def stable_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Each partition's last stable offset (one ListOffsets read_committed per leader): nothing at or past it
        is decided."""
        wanted = sorted(set(partitions))
        with self._lock:
            return self._once_more(lambda: self._list_offsets(topic, wanted, LATEST, READ_COMMITTED))

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's configs that have a value (DescribeConfigs: defaults included, sensitive ones left out)."""
        names = list(dict.fromkeys(topics))
        with self._lock:
            return self._once_more(lambda: self._describe_configs(names)) if names else {}

    def commit_offsets(self, group_id: str, topic: str, offsets: Mapping[int, int], metadata: str = "") -> None:
        """Commit `offsets` (partition -> next offset to read) for `group_id` as a standalone commit (generation -1,
        no member), as Kafka's Java consumer does for partitions it assigned itself; the group must have no active
        members. BrokerRequestError names the first partition the coordinator refused."""
        if not offsets:
            return
        with self._lock:
            self._while_loading(lambda: self._commit(group_id, topic, dict(offsets), metadata))

    def committed_offsets(self, group_id: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """The offsets `group_id` committed for each partition (-1 where it committed none)."""
        wanted = sorted(set(partitions))
        with self._lock:
            return self._while_loading(lambda: self._committed(group_id, topic, wanted)) if wanted else {}

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = FETCH_MAX_BYTES,
              committed: bool = False) -> Fetched:
        """The whole stored batches from the one holding `offset`, about `max_bytes` of them, from the partition's
        leader (none at the end of the log; with `committed`, at the last stable offset)."""
        with self._lock:
            return self._once_more(lambda: self._fetch(topic, partition, offset, max_bytes, committed))

    def close(self) -> None:
        with self._lock:
            for link in self._links.values():
                link.close()
            self._links.clear()
            if self._seed is not None:
                self._seed.close()
                self._seed = None

    def __enter__(self) -> SourceCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing ----------------------------------------------------------------------------------------------

    def _once_more(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, and once more with fresh metadata if it failed on a stale view or a broken connection."""
        try:
            return attempt()
        except BrokerRequestError as exc:
            if exc.code not in STALE_VIEW:
                raise
        except BrokerUnreachableError:
            pass
        self._topics.clear()
        self._coordinators.clear()
        return attempt()

    def _while_loading(self, attempt: Callable[[], T]) -> T:
        """`_once_more(attempt)`, asked again for up to COORDINATOR_WAIT_S while the group's coordinator answers
        COORDINATOR_LOAD_IN_PROGRESS (it has just taken the group over and is loading it: Kafka's clients retry it
        until their timeout, and so does this one)."""
        backoff = _Backoff()
        while True:
            try:
                return self._once_more(attempt)
            except BrokerRequestError as exc:
                if exc.code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS or not backoff.wait():
                    raise

    def _send(self, link: _Link, request: Any, response_class: Any) -> Any:
        """`request` over `link`; a broken link is closed and forgotten, so the next use reconnects."""
        try:
            return link.request(request, response_class)
        except BrokerUnreachableError:
            self._drop(link)
            raise

    def _drop(self, link: _Link) -> None:
        link.close()
        if self._seed is link:
            self._seed = None
        for node, known in list(self._links.items()):
            if known is link:
                del self._links[node]

    def _any_link(self) -> _Link:
        """An open connection: a broker's already open, else the first bootstrap address (then a known broker's)
        that answers."""
        for link in self._links.values():
            return link
        if self._seed is not None:
            return self._seed
        failures: list[str] = []
        for address in dict.fromkeys([*self.bootstrap, *self._brokers.values()]):
            try:
                self._seed = _Link(address, self.props)
                return self._seed
            except BrokerUnreachableError as exc:
                failures.append(str(exc))
        raise BrokerUnreachableError("; ".join(failures) or "no bootstrap servers given")

    def _node(self, node_id: int) -> _Link:
        """The connection to broker `node_id`, opened on first use."""
        link = self._links.get(node_id)
        if link is None:
            address = self._brokers.get(node_id)
            if address is None:
                raise BrokerRequestError(f"broker {node_id} is not in the cluster's metadata",
                                         int(ErrorCode.LEADER_NOT_AVAILABLE), True)
            link = self._links[node_id] = _Link(address, self.props)
        return link

    def _learn_broker(self, node_id: int, host: str, port: int) -> None:
        address = f"{host}:{port}"
        if self._brokers.get(node_id, address) != address:  # moved: its old connection goes
            old = self._links.pop(node_id, None)
            if old is not None:
                old.close()
        self._brokers[node_id] = address
        seed = self._seed
        if seed is not None and node_id not in self._links and split_address(seed.address) == (host, port):
            self._links[node_id], self._seed = seed, None  # the bootstrap connection is this broker's

    def _load(self, topics: Sequence[str] | None) -> Any:
        """Metadata of `topics` (every topic for None) into the view; the answer's topics returned."""
        request = MetadataRequest(
            topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False)
        response = self._send(self._any_link(), request, MetadataResponse)
        for broker in response.brokers:
            self._learn_broker(broker.node_id, broker.host, broker.port)
        if topics is None:
            self._topics.clear()
        for answered in response.topics:
            if answered.error_code and not answered.partitions:
                self._topics.pop(answered.name, None)
                continue
            topic_id = answered.topic_id if answered.topic_id and answered.topic_id.int else None
            leaders = {p.partition_index: p.leader_id for p in answered.partitions}
            self._topics[answered.name] = TopicLayout(answered.name, topic_id, leaders, bool(answered.is_internal))
        return response.topics

    def _layout(self, topic: str) -> TopicLayout:
        """The topic's layout, from the view or asked for; UNKNOWN_TOPIC_OR_PARTITION names a topic the cluster
        does not have."""
        layout = self._topics.get(topic)
        if layout is None:
            for answered in self._load([topic]):
                if answered.name == topic and answered.error_code and not answered.partitions:
                    raise _error(answered.error_code, f"Metadata of topic {topic!r}")
            layout = self._topics.get(topic)
            if layout is None:
                raise _error(int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), f"Metadata of topic {topic!r}")
        return layout

    def _check(self, topic: str, partitions: Iterable[int]) -> TopicLayout:
        """The topic's layout; UNKNOWN_TOPIC_OR_PARTITION if it lacks one of `partitions`."""
        layout = self._layout(topic)
        missing = sorted(set(partitions) - set(layout.leaders))
        if missing:
            raise _error(int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                         f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
                         f"(it has {len(layout.leaders)})")
        return layout

    def _leaders(self, topic: str, partitions: Sequence[int]) -> dict[int, list[int]]:
        """`partitions` grouped by their leader's node id."""
        layout = self._check(topic, partitions)
        out: dict[int, list[int]] = {}
        for p in partitions:
            leader = layout.leaders[p]
            if leader < 0:
                raise _error(int(ErrorCode.LEADER_NOT_AVAILABLE), f"partition {topic}-{p}")
            out.setdefault(leader, []).append(p)
        return out

    def _coordinator(self, group_id: str) -> _Link:
        """The connection to the group's coordinator (FindCoordinator, remembered until a request says otherwise)."""
        node = self._coordinators.get(group_id)
        if node is None:
            link = self._any_link()
            # A broker that has just started is still loading its group metadata: it answers
            # COORDINATOR_NOT_AVAILABLE (or _LOAD_IN_PROGRESS) for a few seconds, and Kafka's clients ask again
            # until their timeout. Found against Apache Kafka 4.1 restarted under a sink (tests/sink/
            # test_sink_kafka.py): a pass right after the restart failed.
            backoff = _Backoff()
            while True:
                response = self._send(link, FindCoordinatorRequest(key=group_id, key_type=GROUP_KEY),
                                      FindCoordinatorResponse)
                if response.error_code not in COORDINATOR_LOADING or not backoff.wait():
                    break
            if response.error_code:
                raise _error(response.error_code, f"FindCoordinator of group {group_id!r} from {link.address}",
                             response.error_message)
            self._learn_broker(response.node_id, response.host, response.port)
            node = self._coordinators[group_id] = response.node_id
        return self._node(node)

    # -- the requests -----------------------------------------------------------------------------------------

    def _list_offsets(self, topic: str, partitions: Sequence[int], timestamp: int, isolation: int) -> dict[int, int]:
        out: dict[int, int] = {}
        asked = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
        for leader, group in self._leaders(topic, partitions).items():
            link = self._node(leader)
            request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
                ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                    asked(partition_index=p, current_leader_epoch=-1, timestamp=timestamp) for p in group])])
            response = self._send(link, request, ListOffsetsResponse)
            for answered in response.topics:
                for data in answered.partitions:
                    if data.error_code:
                        raise _error(data.error_code, f"ListOffsets of {topic}-{data.partition_index} from "
                                                      f"{link.address}")
                    out[data.partition_index] = data.offset
            _require_all(out, group, f"ListOffsets of {topic} from {link.address}")
        return out

    def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool) -> Fetched:
        link = self._node(next(iter(self._leaders(topic, [partition]))))
        request = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
            isolation_level=READ_COMMITTED if committed else READ_UNCOMMITTED,
            session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=max_bytes,
                )
            ])],
            forgotten_topics_data=[], rack_id="",
        )
        response = self._send(link, request, FetchResponse)
        what = f"Fetch of {topic}-{partition} at {offset} from {link.address}"
        if response.error_code:  # v7+
            raise _error(response.error_code, what)
        answered = [p for t in response.responses for p in t.partitions if p.partition_index == partition]
        if not answered:
            raise _error(int(ErrorCode.UNKNOWN_SERVER_ERROR), f"{what}: the answer holds no such partition")
        data = answered[0]
        if data.error_code:
            raise _error(data.error_code, what)
        aborted = tuple((a.producer_id, a.first_offset) for a in data.aborted_transactions or ())
        return Fetched(bytes(data.records or b""), aborted)

    def _describe_configs(self, topics: Sequence[str]) -> dict[str, dict[str, str]]:
        link = self._any_link()
        request = DescribeConfigsRequest(resources=[
            DescribeConfigsRequest.DescribeConfigsResource(resource_type=TOPIC_RESOURCE, resource_name=t,
                                                           configuration_keys=None) for t in topics],
            include_synonyms=False, include_documentation=False)
        response = self._send(link, request, DescribeConfigsResponse)
        out: dict[str, dict[str, str]] = {}
        for result in response.results:
            if result.error_code:
                raise _error(result.error_code, f"DescribeConfigs of topic {result.resource_name!r} from "
                                                f"{link.address}", result.error_message)
            out[result.resource_name] = {c.name: c.value for c in result.configs if c.value is not None}
        _require_all(out, topics, f"DescribeConfigs from {link.address}")
        return out

    def _commit(self, group_id: str, topic: str, offsets: dict[int, int], metadata: str) -> None:
        self._check(topic, offsets)
        link = self._coordinator(group_id)
        request = OffsetCommitRequest(
            group_id=group_id, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            retention_time_ms=-1,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=p, committed_offset=o, committed_leader_epoch=-1, commit_timestamp=-1,
                    committed_metadata=metadata)
                for p, o in sorted(offsets.items())])])
        response = self._send(link, request, OffsetCommitResponse)
        for answered in response.topics:
            for data in answered.partitions:
                if data.error_code:
                    raise _error(data.error_code, f"OffsetCommit of group {group_id!r} for "
                                                  f"{topic}-{data.partition_index} to {link.address}")

    def _committed(self, group_id: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        self._check(topic, partitions)
        link = self._coordinator(group_id)
        request = OffsetFetchRequest(group_id=group_id, require_stable=False, topics=[
            OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=list(partitions))])
        response = self._send(link, request, OffsetFetchResponse)
        what = f"OffsetFetch of group {group_id!r} for {topic} from {link.address}"
        if response.error_code:  # v2+
            raise _error(response.error_code, what)
        out: dict[int, int] = {}
        for answered in response.topics:
            for data in answered.partitions:
                if data.error_code:
                    raise _error(data.error_code, f"OffsetFetch of group {group_id!r} for "
                                                  f"{topic}-{data.partition_index} from {link.address}")
                out[data.partition_index] = data.committed_offset
        return {p: out.get(p, -1) for p in partitions}


class _Backoff:
    """The pauses between asking a loading coordinator again: 0.1 s, doubling up to 1 s, for COORDINATOR_WAIT_S."""

    def __init__(self) -> None:
        self._deadline = time.monotonic() + COORDINATOR_WAIT_S
        self._pause = 0.1

    def wait(self) -> bool:
        """Sleep the next pause and say True, or False (no sleep) when it would end past the deadline."""
        if time.monotonic() + self._pause > self._deadline:
            return False
        time.sleep(self._pause)
        self._pause = min(self._pause * 2, 1.0)
        return True


def _require_all(answered: Mapping[Any, object], asked: Iterable[Any], what: str) -> None:
    missing = [a for a in asked if a not in answered]
    if missing:
        raise _error(int(ErrorCode.UNKNOWN_SERVER_ERROR),
                     f"{what}: the answer leaves out {', '.join(map(str, missing))}")


def _error(code: int, what: str, message: str | None = None) -> BrokerRequestError:
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return BrokerRequestError(f"{what}: {name}" + (f" ({message})" if message else ""), code, is_retriable(code))
