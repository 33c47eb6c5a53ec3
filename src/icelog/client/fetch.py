"""Reading a partition's stored record batches by offset with Fetch requests, as the broker holds them.

Fetch v12: icelog answers with the stored batches, unchanged (wire/handlers/fetch.py), control batches and
aborted transactions' batches included; the reader decides what to keep. With read_committed, the answer
stops at the last stable offset and names the aborted transactions it overlaps (producer id, first offset),
which is what a consumer needs to drop their batches (`CommittedFilter`, as Kafka's Java consumer does).
ListOffsets v2+ with read_committed gives each partition's last stable offset.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse

from icelog.client.connection import BrokerConnection, BrokerRequestError, BrokerUnreachableError
from icelog.client.properties import ClientProperties
from icelog.errors import ErrorCode, is_retriable

FETCH_VERSION = 12
FETCH_MAX_BYTES = 16 * 1024 * 1024  # per request; a batch larger than this still comes whole (Kafka's rule)
LIST_OFFSETS_VERSION = 6
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
LATEST = -1  # ListOffsets' timestamp for the end of the log (the last stable offset with read_committed)


@dataclass(frozen=True)
class Fetched:
    """What one Fetch answered for one partition."""

    records: bytes  # whole stored batches
    aborted: tuple[tuple[int, int], ...]  # read_committed: (producer id, first offset) of aborted transactions


class PartitionReader:
    """Fetches of one broker, over one connection opened on first use (the first bootstrap address that answers)."""

    def __init__(self, bootstrap: Sequence[str], props: ClientProperties) -> None:
        self.bootstrap = list(bootstrap)
        self.props = props
        self._connection: BrokerConnection | None = None

    def connect(self) -> BrokerConnection:
        """The connection, opened (and logged in) on first use."""
        if self._connection is None:
            failures: list[str] = []
            for address in self.bootstrap:
                try:
                    self._connection = BrokerConnection(address, self.props)
                    break
                except BrokerUnreachableError as exc:
                    failures.append(str(exc))
            else:
                raise BrokerUnreachableError("; ".join(failures) or "no bootstrap servers given")
        return self._connection

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = FETCH_MAX_BYTES, committed: bool = False
    ) -> Fetched:
        """The whole batches from the one holding `offset`, about `max_bytes` of them (none at the end of the log;
        with `committed`, at the last stable offset)."""
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
        response = self._request(request, FETCH_VERSION, FetchResponse)
        what = f"Fetch of {topic}-{partition} at {offset} from {self.bootstrap[0]}"
        if response.error_code:
            raise _error(response.error_code, what)
        data = response.responses[0].partitions[0]
        if data.error_code:
            raise _error(data.error_code, what)
        aborted = tuple((a.producer_id, a.first_offset) for a in data.aborted_transactions or ())
        return Fetched(bytes(data.records or b""), aborted)

    def stable_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """Each partition's last stable offset (ListOffsets, read_committed): nothing at or past it is decided."""
        wanted = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
        request = ListOffsetsRequest(replica_id=-1, isolation_level=READ_COMMITTED, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                wanted(partition_index=p, current_leader_epoch=-1, timestamp=LATEST) for p in partitions])])
        response = self._request(request, LIST_OFFSETS_VERSION, ListOffsetsResponse)
        out: dict[int, int] = {}
        for answered in response.topics:
            for data in answered.partitions:
                if data.error_code:
                    raise _error(data.error_code, f"ListOffsets of {topic}-{data.partition_index} from "
                                                  f"{self.bootstrap[0]}")
                out[data.partition_index] = data.offset
        return out

    def _request(self, request: object, version: int, response_class: object) -> Any:
        connection = self.connect()
        try:
            return connection.request(request, version, response_class)
        except BrokerUnreachableError:
            self.close()
            raise

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class CommittedFilter:
    """Drops the batches of aborted transactions from a read_committed Fetch's answer, as Kafka's Java consumer
    does (CompletedFetch): an aborted transaction named by the answer (producer id, first offset) covers that
    producer's transactional batches from its first offset up to the producer's abort marker. One filter per
    Fetch answer: the next answer names again the transactions still open at its fetch offset."""

    def __init__(self, aborted: Sequence[tuple[int, int]]) -> None:
        self._upcoming = [(first, pid) for pid, first in aborted]
        heapq.heapify(self._upcoming)
        self._aborting: set[int] = set()

    def keeps(self, producer_id: int, last_offset: int, transactional: bool, control: bool) -> bool:
        """Whether a batch (in offset order) belongs to the committed log; control batches pass (markers)."""
        if producer_id < 0:
            return True
        while self._upcoming and self._upcoming[0][0] <= last_offset:
            self._aborting.add(heapq.heappop(self._upcoming)[1])
        if control:
            self._aborting.discard(producer_id)  # its marker ends the producer's transaction (commit or abort)
            return True
        return not (transactional and producer_id in self._aborting)


def _error(code: int, what: str) -> BrokerRequestError:
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return BrokerRequestError(f"{what}: {name}", code, is_retriable(code))
