"""Reading a partition's stored record batches by offset with Fetch requests, as the broker holds them.

Fetch v12 with read_uncommitted: icelog answers with the stored batches, unchanged (wire/handlers/fetch.py),
control batches and aborted transactions' batches included; the reader decides what to keep.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafka.protocol.consumer import FetchRequest, FetchResponse

from icelog.client.connection import BrokerConnection, BrokerRequestError, BrokerUnreachableError
from icelog.client.properties import ClientProperties
from icelog.errors import ErrorCode, is_retriable

FETCH_VERSION = 12
FETCH_MAX_BYTES = 16 * 1024 * 1024  # per request; a batch larger than this still comes whole (Kafka's rule)
READ_UNCOMMITTED = 0


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

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = FETCH_MAX_BYTES) -> bytes:
        """The whole batches from the one holding `offset`, about `max_bytes` of them (b"" at the end of the log)."""
        request = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=READ_UNCOMMITTED,
            session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=max_bytes,
                )
            ])],
            forgotten_topics_data=[], rack_id="",
        )
        connection = self.connect()
        try:
            response = connection.request(request, FETCH_VERSION, FetchResponse)
        except BrokerUnreachableError:
            self.close()
            raise
        if response.error_code:
            raise _error(response.error_code, f"Fetch of {topic}-{partition} at {offset} from {connection.address}")
        data = response.responses[0].partitions[0]
        if data.error_code:
            raise _error(data.error_code, f"Fetch of {topic}-{partition} at {offset} from {connection.address}")
        return bytes(data.records or b"")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _error(code: int, what: str) -> BrokerRequestError:
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return BrokerRequestError(f"{what}: {name}", code, is_retriable(code))
