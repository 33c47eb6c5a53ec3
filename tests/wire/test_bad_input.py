"""Bad input over the wire: every case gets Kafka's answer (an error code, or a closed connection), and
afterwards the broker still serves other clients and the data it accepted before is intact.

Requests are built with kafka-python's protocol classes and sent on raw sockets, so a test controls every
byte; valid record batches come from kafka-python's record builder and are then corrupted.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pytest
from kafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from tests.support.broker import BrokerProcess
from tests.support.clients_util import CLIENTS, Rec, assert_codec_used, create_topic
from tests.support.hand_records import record as raw_record
from tests.support.hand_records import zz

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
INVALID_TIMESTAMP = 32
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

SEED_TOPIC = "bad-input-seed"
SEED_VALUES = [f"seed-{i}".encode() for i in range(40)]

Topic = CreateTopicsRequest.CreatableTopic
ProduceTopic = ProduceRequest.TopicProduceData
ProducePartition = ProduceTopic.PartitionProduceData
FetchTopic = FetchRequest.FetchTopic
FetchPartition = FetchTopic.FetchPartition


class Connection:
    """One client connection speaking raw Kafka frames."""

    def __init__(self, broker: BrokerProcess, timeout: float = 15.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=timeout)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: Any, client_id: str = "bad-input-test") -> int:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id=client_id)
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        return self.correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exactly(self, size: int) -> bytes | None:
        buffer = b""
        while len(buffer) < size:
            chunk = self.sock.recv(size - len(buffer))
            if not chunk:
                return None
            buffer += chunk
        return buffer

    def receive_frame(self) -> bytes:
        prefix = self._recv_exactly(4)
        assert prefix is not None, "the broker closed the connection instead of answering"
        body = self._recv_exactly(struct.unpack(">i", prefix)[0])
        assert body is not None, "the broker closed the connection inside a response"
        return body

    def receive(self, response_class: Any, version: int, correlation_id: int) -> Any:
        response = response_class.decode(self.receive_frame(), version=version, header=True)
        assert response.header.correlation_id == correlation_id
        return response

    def call(self, request: Any, response_class: Any) -> Any:
        version = request.API_VERSION
        return self.receive(response_class, version, self.send(request))

    def assert_closed_by_broker(self) -> None:
        """The broker closes the connection without sending anything (a timeout here fails the test)."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            return
        assert data == b"", f"expected the broker to close the connection, got {len(data)} bytes"


# -- request builders ------------------------------------------------------------------------------
def batch(values: list[bytes], compression: int = 0, timestamp: int | None = None) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 22)
    for value in values:
        builder.append(timestamp=timestamp, key=None, value=value)
    builder.close()
    return bytes(builder.buffer())


def produce_request(topic: str, partitions: dict[int, bytes | None], acks: int = -1, version: int = 9) -> Any:
    return ProduceRequest[version](
        transactional_id=None, acks=acks, timeout_ms=10_000,
        topic_data=[ProduceTopic(name=topic, partition_data=[
            ProducePartition(index=p, records=r) for p, r in partitions.items()
        ])],
    )


def produce(conn: Connection, topic: str, records: bytes | None, partition: int = 0) -> Any:
    """Produce one partition's records; return that partition's response."""
    response = conn.call(produce_request(topic, {partition: records}), ProduceResponse)
    return response.responses[0].partition_responses[0]


def fetch_partition(
    conn: Connection, topic: str, offset: int, partition: int = 0, max_wait_ms: int = 0
) -> Any:
    request = FetchRequest[12](
        max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        topics=[FetchTopic(topic=topic, partitions=[
            FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20)
        ])],
    )
    return conn.call(request, FetchResponse).responses[0].partitions[0]


def read_values(conn: Connection, topic: str, partition: int = 0) -> list[bytes]:
    """Every value from offset 0 to the high watermark, checking offsets are contiguous."""
    out: list[bytes] = []
    while True:
        data = fetch_partition(conn, topic, len(out), partition)
        assert data.error_code == NONE
        records = [r for b in MemoryRecords(bytes(data.records or b"")) for r in b if r.offset >= len(out)]
        for record in records:
            assert record.offset == len(out), "offsets must be contiguous"
            out.append(bytes(record.value))
        if len(out) >= data.high_watermark:
            return out
        assert records, f"no records at offset {len(out)} below the high watermark {data.high_watermark}"


def list_offset(conn: Connection, topic: str, timestamp: int, partition: int = 0) -> Any:
    partitions = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    wanted = partitions(partition_index=partition, timestamp=timestamp)
    request = ListOffsetsRequest[6](
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[wanted])]
    )
    return conn.call(request, ListOffsetsResponse).topics[0].partitions[0]


def create_topics(conn: Connection, topics: list[Any]) -> dict[str, Any]:
    response = conn.call(CreateTopicsRequest[5](topics=topics, timeout_ms=10_000, validate_only=False),
                         CreateTopicsResponse)
    return {t.name: t for t in response.topics}


def topic(name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> Any:
    return Topic(name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[
        Topic.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
    ])


def metadata_request(names: list[str] | None, version: int = 1, **fields: Any) -> Any:
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    request = MetadataRequest[version](topics=topics)
    if version >= 4:
        for name, value in fields.items():
            setattr(request, name, value)
    return request


def high_watermark(conn: Connection, topic_name: str, partition: int = 0) -> int:
    return int(list_offset(conn, topic_name, -1, partition).offset)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def encoded(request: Any, correlation_id: int = 99) -> bytes:
    """A request's header and body, without the size prefix."""
    request.with_header(correlation_id=correlation_id, client_id="bad-input-test")
    return bytes(request.encode(header=True, framed=False))


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seeded(broker: BrokerProcess) -> BrokerProcess:
    """The shared broker with SEED_TOPIC holding SEED_VALUES (in two batches, one compressed)."""
    with Connection(broker) as conn:
        result = create_topics(conn, [topic(SEED_TOPIC)])[SEED_TOPIC]
        assert result.error_code == NONE, result.error_message
        assert produce(conn, SEED_TOPIC, batch(SEED_VALUES[:20])).error_code == NONE
        assert produce(conn, SEED_TOPIC, batch(SEED_VALUES[20:], compression=3)).error_code == NONE
    return broker


@pytest.fixture
def conn(seeded: BrokerProcess) -> Iterator[Connection]:
    with Connection(seeded) as connection:
        yield connection


@pytest.fixture
def created(conn: Connection, topic_name: str) -> str:
    """A fresh two-partition topic for the test, holding three records in partition 0."""
    assert create_topics(conn, [topic(topic_name, 2)])[topic_name].error_code == NONE
    assert produce(conn, topic_name, batch([b"a", b"b", b"c"])).error_code == NONE
    return topic_name


def assert_broker_healthy(broker: BrokerProcess, topic_name: str | None = None,
                          expected: list[bytes] | None = None) -> None:
    """Another client connects, negotiates and reads back what was accepted before."""
    with Connection(broker) as other:
        versions = other.call(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
                              ApiVersionsResponse)
        assert versions.error_code == NONE
        metadata = other.call(metadata_request([SEED_TOPIC]), MetadataResponse)
        assert metadata.topics[0].error_code == NONE
        assert read_values(other, SEED_TOPIC) == SEED_VALUES
        if topic_name is not None:
            assert read_values(other, topic_name) == expected


# -- framing ---------------------------------------------------------------------------------------
def valid_metadata_frame(name: str = SEED_TOPIC) -> bytes:
    return encoded(metadata_request([name]))


MALFORMED_FRAMES: dict[str, Callable[[], bytes]] = {
    "negative-size": lambda: struct.pack(">i", -5) + b"x" * 16,
    "zero-size": lambda: struct.pack(">i", 0),
    "shorter-than-header": lambda: framed(b"\x00\x03\x00"),
    "truncated-string": lambda: framed(valid_metadata_frame("truncated-topic-name")[:-4]),
    "truncated-array": lambda: framed(valid_metadata_frame()[:-len(SEED_TOPIC) - 3]),
    "truncated-produce": lambda: framed(encoded(produce_request(SEED_TOPIC, {0: batch([b"x"] * 5)}))[:-30]),
    # Metadata v1 claiming 2**31-1 topics in 6 bytes.
    "huge-array-count": lambda: framed(struct.pack(">hhih", 3, 1, 7, 2) + b"ab" + struct.pack(">i", 2**31 - 1)
                                       + b"\x00\x01z"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_FRAMES))
def test_malformed_frame_closes_the_connection(seeded: BrokerProcess, conn: Connection, case: str) -> None:
    conn.send_raw(MALFORMED_FRAMES[case]())
    conn.assert_closed_by_broker()
    assert_broker_healthy(seeded)
    with Connection(seeded) as other:  # a cut-off name must not have been taken as a shorter one
        names = [t.name for t in other.call(metadata_request(None), MetadataResponse).topics]
        assert not [n for n in names if n.startswith("truncated-top")]


@pytest.mark.parametrize("sent", [2, 30])
def test_client_vanishing_mid_request(seeded: BrokerProcess, conn: Connection, sent: int) -> None:
    frame = framed(valid_metadata_frame())
    conn.send_raw(frame[:sent])
    conn.sock.shutdown(socket.SHUT_WR)
    conn.assert_closed_by_broker()
    assert_broker_healthy(seeded)


def test_requests_before_a_malformed_one_are_answered_first(seeded: BrokerProcess, conn: Connection) -> None:
    conn.send_raw(framed(valid_metadata_frame()) + framed(b"\x00\x03\x00"))
    response = conn.receive(MetadataResponse, 1, 99)
    assert response.topics[0].name == SEED_TOPIC and response.topics[0].error_code == NONE
    conn.assert_closed_by_broker()
    assert_broker_healthy(seeded)


@pytest.mark.parametrize("api_key", [1000, 32767, -1])
def test_unknown_api_key_closes_the_connection(seeded: BrokerProcess, conn: Connection, api_key: int) -> None:
    conn.send_raw(framed(struct.pack(">hhih", api_key, 0, 1, 1) + b"t" + b"\x00" * 8))
    conn.assert_closed_by_broker()
    assert_broker_healthy(seeded)


def test_unsupported_api_versions_version_gets_error_35_as_v0(
    seeded: BrokerProcess, conn: Connection
) -> None:
    # A future ApiVersions (flexible header v2 with a tagged-field block, then a body we cannot know).
    conn.send_raw(framed(struct.pack(">hhih", 18, 99, 42, 1) + b"t" + b"\x00" + b"\x05future\x02"))
    body = conn.receive_frame()
    response = ApiVersionsResponse.decode(body, version=0, header=True)

    assert response.header.correlation_id == 42
    assert response.error_code == UNSUPPORTED_VERSION
    # v0 exactly, with header v0: correlation id, error code, int32 array length, 6 bytes per entry and
    # nothing else (no compact arrays, throttle time or tagged fields a v3 body would carry).
    assert len(body) == 4 + 2 + 4 + 6 * len(response.api_keys)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[18][0] == 0 and ranges[18][1] >= 3, "clients retry with a version from our range"
    assert ranges[0][0] == 0 and ranges[1][0] == 0  # Produce and Fetch from 0 (see the broker notes)
    # The client retries on the same connection with a version from the range.
    retry = conn.call(ApiVersionsRequest[ranges[18][1]](), ApiVersionsResponse)
    assert retry.error_code == NONE
    assert {k.api_key: (k.min_version, k.max_version) for k in retry.api_keys} == ranges
    assert_broker_healthy(seeded)


@pytest.mark.parametrize(
    "api_key,version", [(0, 10), (1, 13), (3, 13), (2, 99)],
    ids=["produce-v10", "fetch-v13", "metadata-v13", "list-offsets-v99"],
)
def test_unsupported_version_of_another_api_closes_the_connection(
    seeded: BrokerProcess, conn: Connection, api_key: int, version: int
) -> None:
    conn.send_raw(framed(struct.pack(">hhih", api_key, version, 5, 1) + b"t" + b"\x00" * 32))
    conn.assert_closed_by_broker()
    assert_broker_healthy(seeded)


def test_request_over_socket_request_max_bytes(fresh_broker: BrokerProcess, topic_name: str) -> None:
    fresh_broker.env["ICELOG_SOCKET_REQUEST_MAX_BYTES"] = "8192"
    fresh_broker.start()
    with Connection(fresh_broker) as conn:
        assert create_topics(conn, [topic(topic_name)])[topic_name].error_code == NONE
        assert produce(conn, topic_name, batch([b"small"])).error_code == NONE
        conn.send(produce_request(topic_name, {0: batch([b"x" * 10_000])}))
        conn.assert_closed_by_broker()
    with Connection(fresh_broker) as conn:
        # Only a size prefix: the broker must refuse from the prefix, not wait for (or buffer) 1 GiB.
        conn.send_raw(struct.pack(">i", 1 << 30))
        conn.assert_closed_by_broker()
    with Connection(fresh_broker) as conn:
        assert produce(conn, topic_name, batch([b"also small"])).error_code == NONE
        assert read_values(conn, topic_name) == [b"small", b"also small"]
    assert "socket.request.max.bytes" in fresh_broker.log()


# -- produce -------------------------------------------------------------------------------------
def test_batch_over_max_message_bytes(seeded: BrokerProcess, conn: Connection, topic_name: str) -> None:
    results = create_topics(conn, [topic(topic_name, configs={"max.message.bytes": "2000"})])
    assert results[topic_name].error_code == NONE
    assert produce(conn, topic_name, batch([b"fits"])).error_code == NONE

    result = produce(conn, topic_name, batch([b"y" * 3000]))

    assert result.error_code == MESSAGE_TOO_LARGE
    assert result.base_offset == -1
    assert produce(conn, topic_name, batch([b"fits too"])).base_offset == 1
    assert_broker_healthy(seeded, topic_name, [b"fits", b"fits too"])


def _flip_crc_covered_byte(data: bytearray) -> None:
    data[-1] ^= 0x01  # the last record's last byte: inside the CRC-32C range


def _set_magic(magic: int) -> Callable[[bytearray], None]:
    def corrupt(data: bytearray) -> None:
        data[16] = magic  # outside the CRC: only the magic check can catch it

    return corrupt


def _set_length(delta: int) -> Callable[[bytearray], None]:
    def corrupt(data: bytearray) -> None:
        struct.pack_into(">i", data, 8, struct.unpack_from(">i", data, 8)[0] + delta)

    return corrupt


def _set_records_count(data: bytearray) -> None:
    # A batch that claims more records than its last offset delta covers, with a matching CRC: offsets
    # assigned from one field or the other would disagree.
    struct.pack_into(">i", data, 57, 7)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))


# case -> (corruption, Kafka's answer): CORRUPT_MESSAGE for bytes Kafka calls corrupt (CRC, an unknown magic,
# a length below a header's), INVALID_RECORD where its ProduceRequest/LogValidator checks find no whole v2
# batch or a count that is not the last offset delta + 1.
BATCH_CORRUPTIONS: dict[str, tuple[Callable[[bytearray], None], int]] = {
    "bad-crc": (_flip_crc_covered_byte, CORRUPT_MESSAGE),
    "magic-0": (_set_magic(0), INVALID_RECORD),
    "magic-1": (_set_magic(1), INVALID_RECORD),
    "magic-3": (_set_magic(3), CORRUPT_MESSAGE),
    "length-past-end": (_set_length(+50), INVALID_RECORD),
    "length-too-small": (_set_length(-60), CORRUPT_MESSAGE),
    "records-count-mismatch": (_set_records_count, INVALID_RECORD),
}


@pytest.mark.parametrize("case", sorted(BATCH_CORRUPTIONS))
@pytest.mark.parametrize("compression", [0, 3], ids=["plain", "lz4"])
def test_corrupt_batch_is_rejected_and_nothing_is_stored(
    seeded: BrokerProcess, conn: Connection, created: str, case: str, compression: int
) -> None:
    data = bytearray(batch([b"bad-1", b"bad-2", b"bad-3"], compression=compression))
    corrupt, expected = BATCH_CORRUPTIONS[case]
    corrupt(data)

    result = produce(conn, created, bytes(data))

    assert result.error_code == expected, result
    assert high_watermark(conn, created) == 3
    assert produce(conn, created, batch([b"d"])).base_offset == 3
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c", b"d"])


@pytest.mark.parametrize(("records", "expected"), [(None, INVALID_RECORD), (b"", INVALID_RECORD),
                                                   (b"\x00" * 30, CORRUPT_MESSAGE)], ids=["null", "empty", "short"])
def test_missing_or_short_records_are_refused(
    seeded: BrokerProcess, conn: Connection, created: str, records: bytes | None, expected: int
) -> None:
    # No batch: Kafka's "at least one record batch per partition" (INVALID_RECORD); a batch length of 0
    # is below a header's (CORRUPT_MESSAGE).
    assert produce(conn, created, records).error_code == expected
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_legacy_message_set_is_rejected(seeded: BrokerProcess, conn: Connection, created: str) -> None:
    builder = MemoryRecordsBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=None, key=None, value=b"legacy")
    builder.close()
    assert produce(conn, created, bytes(builder.buffer())).error_code == INVALID_RECORD  # as Kafka for Produce v3+
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_bad_second_batch_rejects_the_whole_partition_write(
    seeded: BrokerProcess, conn: Connection, created: str
) -> None:
    bad = bytearray(batch([b"bad"]))
    _flip_crc_covered_byte(bad)
    assert produce(conn, created, batch([b"good"]) + bytes(bad)).error_code == CORRUPT_MESSAGE
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_bad_partition_does_not_affect_others_in_the_request(
    seeded: BrokerProcess, conn: Connection, created: str
) -> None:
    bad = bytearray(batch([b"bad"]))
    _flip_crc_covered_byte(bad)
    response = conn.call(produce_request(created, {0: bytes(bad), 1: batch([b"p1"])}), ProduceResponse)
    results = {p.index: p for p in response.responses[0].partition_responses}
    assert results[0].error_code == CORRUPT_MESSAGE
    assert (results[1].error_code, results[1].base_offset) == (NONE, 0)
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])
    with Connection(seeded) as other:
        assert read_values(other, created, 1) == [b"p1"]


# -- the records inside a batch ---------------------------------------------------------------------
# Batches whose header and CRC are right but whose records are not what the header says: Kafka's broker
# walks the records of every produced batch (decompressing it) and so must we, or a consumer and the
# archiver meet a batch they cannot read (a poison pill). Records are written by hand here, independently
# of the broker's code.
def raw_batch(records: bytes, count: int, attributes: int = 0, base_ts: int = 1_700_000_000_000,
              max_ts: int | None = None, producer_id: int = -1) -> bytes:
    """A v2 batch around `records` (already compressed if `attributes` say so) with a correct CRC."""
    max_ts = base_ts if max_ts is None else max_ts
    sequence = 0 if producer_id >= 0 else -1
    after_crc = struct.pack(">hiqqqhii", attributes, count - 1, base_ts, max_ts, producer_id, 0 if producer_id >= 0
                            else -1, sequence, count) + records
    header = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), 0, 2, crc32c.crc32c(after_crc))
    return header + after_crc


def three(**changes: Any) -> bytes:
    """Records 0-2 of a good batch; `changes` (r0=..., r1=..., r2=...) replace some with other raw records."""
    return b"".join(changes.get(f"r{i}", raw_record(i, f"bad-{i}".encode())) for i in range(3))


CODEC_ENCODERS = {1: gzip_encode, 2: snappy_encode, 3: lz4_encode, 4: zstd_encode}
CODEC_IDS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# case -> (batch, Kafka's answer): records that do not parse are INVALID_RECORD (DefaultRecord's
# InvalidRecordException), as is a control batch from a producer; a payload that does not decompress or an
# unknown codec is CORRUPT_MESSAGE (Kafka answers UNKNOWN_SERVER_ERROR, an internal error, there). Neither
# names a record.
RECORD_CORRUPTIONS: dict[str, tuple[Callable[[], bytes], int]] = {
    "record-length-past-its-fields": (lambda: raw_batch(three(r1=raw_record(1, b"bad-1", length_delta=2)), 3),
                                      INVALID_RECORD),
    "record-length-short-of-its-fields": (lambda: raw_batch(three(r2=raw_record(2, b"bad-2", length_delta=-1)), 3),
                                          INVALID_RECORD),
    "truncated-varint": (lambda: raw_batch(three(r2=zz(3) + b"\x00\x00\x80"), 3), INVALID_RECORD),
    "varint-longer-than-5-bytes": (
        lambda: raw_batch(three(r0=zz(12) + b"\x00\x00" + b"\x80" * 5 + b"\x00" + zz(-1) + zz(1) + b"v" + zz(0)), 3),
        INVALID_RECORD),
    "count-above-records-present": (lambda: raw_batch(three()[: -len(raw_record(2, b"bad-2"))], 3), INVALID_RECORD),
    "count-below-records-present": (lambda: raw_batch(three() + raw_record(3, b"bad-3"), 3), INVALID_RECORD),
    "offset-deltas-0-2-1": (lambda: raw_batch(three(r1=raw_record(2, b"x"), r2=raw_record(1, b"y")), 3),
                            INVALID_RECORD),
    "header-value-past-record": (
        lambda: raw_batch(three(r1=raw_record(1, headers=[(b"k", b"val")]).replace(zz(3) + b"val", zz(9) + b"val")), 3),
        INVALID_RECORD),
    "null-header-key": (
        lambda: raw_batch(three(r1=raw_record(1, headers=[(b"k", b"v")]).replace(zz(1) + b"k", zz(-1) + b"k")), 3),
        INVALID_RECORD),
    "control-batch-from-producer": (lambda: raw_batch(three(), 3, attributes=0x30, producer_id=1000), INVALID_RECORD),
    "compression-codec-5": (lambda: raw_batch(three(), 3, attributes=5), CORRUPT_MESSAGE),
    "bad-records-inside-lz4": (lambda: raw_batch(lz4_encode(three(r1=raw_record(5))), 3, attributes=3),
                               INVALID_RECORD),
    **{f"truncated-{CODEC_IDS[c]}-payload": ((lambda c=c: raw_batch(CODEC_ENCODERS[c](three())[:-6], 3,
                                                                     attributes=c)), CORRUPT_MESSAGE)
       for c in CODEC_ENCODERS},
    **{f"garbage-{CODEC_IDS[c]}-payload": ((lambda c=c: raw_batch(b"\xff" * 40, 3, attributes=c)), CORRUPT_MESSAGE)
       for c in CODEC_ENCODERS},
    # Payloads that decompress but that consumers cannot read (Kafka's "one frame per batch"): librdkafka reads
    # only the first gzip member or lz4 frame (then _BAD_MSG, or fewer records than the batch says), Kafka's lz4
    # reader refuses a skippable frame. Records 0-2 are split across the two members/frames.
    "two-gzip-members": (lambda: raw_batch(gzip_encode(three()[:9]) + gzip_encode(three()[9:]), 3, attributes=1),
                         CORRUPT_MESSAGE),
    "bytes-after-the-gzip-member": (lambda: raw_batch(gzip_encode(three()) + b"\x00" * 8, 3, attributes=1),
                                    CORRUPT_MESSAGE),
    "two-lz4-frames": (lambda: raw_batch(lz4_encode(three()[:9]) + lz4_encode(three()[9:]), 3, attributes=3),
                       CORRUPT_MESSAGE),
    "skippable-lz4-frame-first": (
        lambda: raw_batch(struct.pack("<II", 0x184D2A50, 4) + b"skip" + lz4_encode(three()), 3, attributes=3),
        CORRUPT_MESSAGE),
}


def test_hand_made_batch_is_accepted(seeded: BrokerProcess, conn: Connection, created: str) -> None:
    """The builders below make batches the broker takes: each corruption case changes only what it says."""
    for codec in (0, *CODEC_ENCODERS):
        records = three() if codec == 0 else CODEC_ENCODERS[codec](three())
        assert produce(conn, created, raw_batch(records, 3, attributes=codec)).error_code == NONE, codec
    assert read_values(conn, created)[3:] == [b"bad-0", b"bad-1", b"bad-2"] * 5


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_batches_of_every_codec_round_trip(seeded: BrokerProcess, topic_name: str, codec: str) -> None:
    """What a real producer writes (one gzip member, one lz4 frame, ...) passes the one-frame checks above."""
    client = CLIENTS["confluent"]
    create_topic(seeded.bootstrap, topic_name, partitions=1)
    values = [f"{codec}-{i}".encode() * 20 for i in range(50)]
    client.produce(seeded.bootstrap, topic_name, [Rec(partition=0, key=None, value=v) for v in values], codec=codec)
    assert [r.value for r in client.consume(seeded.bootstrap, topic_name, [0], "earliest", len(values))] == values
    assert_codec_used(seeded.bootstrap, topic_name, [0], codec)


@pytest.mark.parametrize("case", sorted(RECORD_CORRUPTIONS))
def test_corrupt_records_are_rejected_and_nothing_is_stored(
    seeded: BrokerProcess, conn: Connection, created: str, case: str
) -> None:
    make, expected = RECORD_CORRUPTIONS[case]

    result = produce(conn, created, make())

    assert result.error_code == expected, result
    assert result.error_message, "the answer says what is wrong"
    assert not result.record_errors
    assert result.base_offset == -1
    assert high_watermark(conn, created) == 3
    assert produce(conn, created, batch([b"d"])).base_offset == 3
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c", b"d"])


def test_bad_timestamp_is_invalid_timestamp_with_the_record_index(
    seeded: BrokerProcess, conn: Connection, created: str
) -> None:
    # A negative timestamp other than -1 (none). A record later than the header's max timestamp is not
    # bad: Kafka stores the records' max (tests/wire/test_lenient_batches.py).
    base = 1_700_000_000_000
    bad = three(r2=raw_record(2, b"bad-2", ts_delta=-base - 6))

    result = produce(conn, created, raw_batch(bad, 3, base_ts=base))

    assert result.error_code == INVALID_TIMESTAMP, result
    assert [(e.batch_index, "timestamp" in e.batch_index_error_message) for e in result.record_errors] == [(2, True)]
    assert high_watermark(conn, created) == 3
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_header_key_that_is_not_utf8_is_invalid_record(seeded: BrokerProcess, conn: Connection, created: str) -> None:
    # Kafka's Java broker would take it, but every Python client (and the archiver) fails to decode the key.
    bad = three(r1=raw_record(1, headers=[(b"\xc3\x28", b"v")]))

    result = produce(conn, created, raw_batch(bad, 3))

    assert result.error_code == INVALID_RECORD, result
    assert [e.batch_index for e in result.record_errors] == [1]
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_invalid_acks(seeded: BrokerProcess, conn: Connection, created: str) -> None:
    response = conn.call(produce_request(created, {0: batch([b"x"])}, acks=2), ProduceResponse)
    assert response.responses[0].partition_responses[0].error_code == INVALID_REQUIRED_ACKS
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


# -- unknown topics and partitions ---------------------------------------------------------------
def test_produce_to_unknown_topic_or_partition(seeded: BrokerProcess, conn: Connection, created: str) -> None:
    assert produce(conn, "no-such-topic-anywhere", batch([b"x"])).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert produce(conn, created, batch([b"x"]), partition=2).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert produce(conn, created, batch([b"x"]), partition=-1).error_code == UNKNOWN_TOPIC_OR_PARTITION
    # Produce never creates topics (only Metadata may).
    request = metadata_request(["no-such-topic-anywhere"], version=4, allow_auto_topic_creation=False)
    metadata = conn.call(request, MetadataResponse)
    assert metadata.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_fetch_and_list_offsets_of_unknown_topic_or_partition(
    seeded: BrokerProcess, conn: Connection, created: str
) -> None:
    assert fetch_partition(conn, "no-such-topic-anywhere", 0).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert fetch_partition(conn, created, 0, partition=5).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert list_offset(conn, "no-such-topic-anywhere", -1).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert list_offset(conn, created, -2, partition=9).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


# -- topic names -----------------------------------------------------------------------------------
INVALID_NAMES = ["has space", "slash/name", "..", ".", "x" * 250, "ünïcode", "star*"]


def test_create_topics_with_invalid_names(seeded: BrokerProcess, conn: Connection, topic_name: str) -> None:
    results = create_topics(conn, [topic(name) for name in INVALID_NAMES] + [topic(topic_name)])

    for name in INVALID_NAMES:
        assert results[name].error_code == INVALID_TOPIC_EXCEPTION, name
    assert results[topic_name].error_code == NONE, "valid topics in the same request are created"
    names = {t.name for t in conn.call(metadata_request(None), MetadataResponse).topics}
    assert topic_name in names and not names & set(INVALID_NAMES)
    assert_broker_healthy(seeded)


@pytest.mark.parametrize("version", [1, 9])
def test_metadata_auto_create_with_invalid_name(
    seeded: BrokerProcess, conn: Connection, version: int
) -> None:
    # v1-3 always allow auto-creation; v4+ ask for it explicitly.
    request = metadata_request(INVALID_NAMES, version=version, allow_auto_topic_creation=True)
    response = conn.call(request, MetadataResponse)

    errors = {t.name: t.error_code for t in response.topics}
    assert errors == dict.fromkeys(INVALID_NAMES, INVALID_TOPIC_EXCEPTION)
    names = {t.name for t in conn.call(metadata_request(None), MetadataResponse).topics}
    assert not names & set(INVALID_NAMES)
    assert_broker_healthy(seeded)


# -- fetch offsets ---------------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [4, 1000, -1, -5])
def test_fetch_offset_out_of_range(
    seeded: BrokerProcess, conn: Connection, created: str, offset: int
) -> None:
    result = fetch_partition(conn, created, offset)
    assert result.error_code == OFFSET_OUT_OF_RANGE
    assert (result.high_watermark, result.log_start_offset) == (3, 0), "clients reset from these"
    assert not result.records
    assert_broker_healthy(seeded, created, [b"a", b"b", b"c"])


def test_fetch_at_high_watermark_is_not_out_of_range(
    seeded: BrokerProcess, conn: Connection, created: str
) -> None:
    result = fetch_partition(conn, created, 3, max_wait_ms=10)
    assert (result.error_code, result.high_watermark) == (NONE, 3)
    assert not result.records


def test_huge_partition_counts_are_refused(broker: BrokerProcess, topic_name: str) -> None:
    """A CreateTopics/CreatePartitions asking for millions of partitions gets INVALID_PARTITIONS at once."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(KafkaException) as created:
        admin.create_topics([NewTopic(topic_name, 100_000, 1)])[topic_name].result(10)
    assert created.value.args[0].code() == 37  # INVALID_PARTITIONS
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    with pytest.raises(KafkaException) as grown:
        admin.create_partitions([NewPartitions(topic_name, 100_000)])[topic_name].result(10)
    assert grown.value.args[0].code() == 37
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 1


def test_a_compacted_topic_refuses_records_without_a_key(
    seeded: BrokerProcess, conn: Connection, topic_name: str
) -> None:
    """As Kafka: a keyless record on cleanup.policy=compact fails its whole batch with INVALID_RECORD and the
    record's index; nothing of it is stored; keyed records (tombstones too) are taken. confluent-kafka sees it."""
    from confluent_kafka import KafkaError, Producer

    assert create_topics(conn, [topic(topic_name, 1, {"cleanup.policy": "compact"})])[topic_name].error_code == NONE
    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": seeded.bootstrap, "linger.ms": 50,
                         "compression.type": "lz4"})
    producer.produce(topic_name, key=b"k1", value=b"v1", on_delivery=lambda err, _m: outcomes.append(err))
    producer.flush(30)
    producer.produce(topic_name, key=b"k2", value=b"v2", on_delivery=lambda err, _m: outcomes.append(err))
    producer.produce(topic_name, key=None, value=b"nokey", on_delivery=lambda err, _m: outcomes.append(err))
    producer.flush(30)
    producer.produce(topic_name, key=b"k1", value=None, on_delivery=lambda err, _m: outcomes.append(err))
    assert producer.flush(30) == 0
    assert outcomes[0] is None and outcomes[3] is None
    assert [e.code() for e in outcomes[1:3]] == [KafkaError.INVALID_RECORD] * 2  # one batch: both refused

    keyless = batch([b"a"])  # kafka-python's builder: no key
    response = produce(conn, topic_name, keyless)
    assert response.error_code == 87 and [e.batch_index for e in response.record_errors] == [0]
    assert "without a key" in response.error_message
    assert high_watermark(conn, topic_name) == 2  # k1=v1 and k1's tombstone
