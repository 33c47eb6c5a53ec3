"""A minimal raw Kafka protocol client for tests that must send exact bytes (replayed batches, bad epochs)."""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING, Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

if TYPE_CHECKING:
    from tests.support.broker import BrokerProcess


class RawClient:
    """One connection; request() sends a kafka-python request object and decodes the response."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def request(self, request: Any, version: int, response_class: Any) -> Any:
        self.correlation += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation, client_id="raw-test")
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", self._read(4))[0]
        return response_class.decode(self._read(size), version=version, header=True)

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            out += chunk
        return out

    def produce(self, topic: str, partition: int, records: bytes, version: int = 8) -> tuple[int, int]:
        """(error_code, base_offset) of a Produce with acks=-1."""
        req = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=10000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=topic,
                    partition_data=[
                        ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=records)
                    ],
                )
            ],
        )
        resp = self.request(req, version, ProduceResponse)
        part = resp.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    def close(self) -> None:
        self.sock.close()


def build_batch(
    values: list[bytes],
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """A RecordBatch v2 with the given producer fields."""
    builder = DefaultRecordBatchBuilder(2, 0, int(transactional), producer_id, epoch, base_sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def ask(broker: BrokerProcess, key: int, version: int, **fields: object) -> object:
    """One request of API `key` at `version` built from `fields` (icelog's codec), on a connection of its own to
    `broker`; the decoded response."""
    from icelog.wire import codec

    client = RawClient(broker.bootstrap)
    try:
        return client.request(codec.REQUEST_CLASSES[key](**fields), version, codec.RESPONSE_CLASSES[key])
    finally:
        client.close()


def served_versions(key: int) -> list[int]:
    """Every version of API `key` icelog advertises."""
    from icelog.wire.versions import SUPPORTED_VERSIONS

    low, high = SUPPORTED_VERSIONS[key]
    return list(range(low, high + 1))
