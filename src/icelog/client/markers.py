"""Transaction markers sent to other brokers of a cluster: a transaction coordinator's WriteTxnMarkers to the leader
of each partition it does not lead itself, as Kafka's TransactionMarkerChannelManager sends them.

One connection per broker, opened on first use and dropped when it breaks (the next send reconnects); requests to one
broker go one at a time, on a worker thread (the connection is blocking). What comes back is each partition's error
code; a broker that cannot be reached answers every partition with NETWORK_EXCEPTION, and the coordinator retries
(after a look at the cluster view, since the leader may have moved).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from kafka.protocol.producer.transaction import WriteTxnMarkersRequest, WriteTxnMarkersResponse

from icelog.client.connection import BrokerConnection, BrokerLoginError, BrokerUnreachableError
from icelog.client.properties import ClientConfigError, ClientProperties, parse
from icelog.cluster.view import ClusterView
from icelog.config import Settings
from icelog.errors import ConfigError, ErrorCode

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS_VERSION = 1  # what icelog serves, and Kafka 4 (v0 was dropped there)
Marker = WriteTxnMarkersRequest.WritableTxnMarker


class MarkerChannel:
    """WriteTxnMarkers to the brokers of a cluster, by node id; `address(node)` is the node's host:port on the
    inter-broker listener now (None: not a live broker)."""

    def __init__(self, address: Callable[[int], str | None], props: ClientProperties) -> None:
        self.address = address
        self.props = props
        self._links: dict[int, tuple[str, BrokerConnection]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def write(
        self, node: int, producer_id: int, producer_epoch: int, commit: bool, partitions: Sequence[tuple[str, int]],
        coordinator_epoch: int = 0,
    ) -> dict[tuple[str, int], int]:
        """One marker of the producer's transaction on each of `partitions`, written by broker `node`; each
        partition's error code (0: written)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = WriteTxnMarkersRequest(markers=[Marker(
            producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
            topics=[Marker.WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            coordinator_epoch=coordinator_epoch)])
        lock = self._locks.setdefault(node, asyncio.Lock())
        async with lock:
            try:
                response = await asyncio.to_thread(self._send, node, request)
            except (BrokerUnreachableError, BrokerLoginError, OSError, ConnectionError) as exc:
                log.warning("cannot send transaction markers to broker %d: %s (will retry)", node, exc)
                return {tp: int(ErrorCode.NETWORK_EXCEPTION) for tp in partitions}
        out = {tp: int(ErrorCode.UNKNOWN_SERVER_ERROR) for tp in partitions}  # a partition the answer leaves out
        for marker in response.markers:
            for topic in marker.topics:
                for result in topic.partitions:
                    if (topic.name, result.partition_index) in out:
                        out[(topic.name, result.partition_index)] = int(result.error_code)
        return out

    def _send(self, node: int, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
        address = self.address(node)
        if address is None:
            raise BrokerUnreachableError(f"broker {node} is not live in the cluster view")
        held = self._links.get(node)
        if held is not None and held[0] != address:  # the node came back elsewhere
            self._drop(node)
            held = None
        if held is None:
            held = self._links[node] = (address, BrokerConnection(address, self.props))
        try:
            return held[1].request(request, WRITE_TXN_MARKERS_VERSION, WriteTxnMarkersResponse)
        except BaseException:
            self._drop(node)
            raise

    def _drop(self, node: int) -> None:
        held = self._links.pop(node, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        for node in list(self._links):
            self._drop(node)


def inter_broker_channel(settings: Settings, view: Callable[[], ClusterView | None]) -> MarkerChannel:
    """The channel a cluster's broker sends markers on: to the other brokers' inter-broker listener (Kafka's
    inter.broker.listener.name), logged in with `inter_broker_client_properties` as Kafka's brokers log in with
    their listener's own JAAS credentials. ConfigError with the fix when that listener needs credentials none name."""
    spec = settings.inter_broker_listener
    try:
        props = parse({**settings.inter_broker_client_properties, "security.protocol": spec.protocol,
                       "client.id": f"icelog-broker-{settings.node_id}"})
    except ClientConfigError as exc:
        raise ConfigError(
            f"inter-broker listener {spec.name} ({spec.protocol}): {exc}; set inter_broker_client_properties "
            "(sasl.mechanism, sasl.username, sasl.password of a super user or a user with CLUSTER_ACTION), or "
            "name a PLAINTEXT listener on the brokers' private network in inter_broker_listener_name") from None

    def address(node: int) -> str | None:
        current = view()
        endpoint = current.endpoint(node, spec.name) if current is not None else None
        return None if endpoint is None else f"{endpoint[0]}:{endpoint[1]}"

    return MarkerChannel(address, props)
