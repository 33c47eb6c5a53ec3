"""Real Kafka clients behind one small interface, so tests can pair any producer with any consumer.

Each client (confluent-kafka/librdkafka, kafka-python, aiokafka, Debian's kcat) produces a list of `Rec`
and reads records back by assignment (never through a consumer group), returning `Rec` with the
partition, offset and timestamp the broker served. Tests compare those lists field by field.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ACKS = ("0", "1", "all")
KCAT = "/usr/bin/kcat"
WAIT_S = 30.0  # upper bound of a consume loop; a failing test then reports what did arrive
Start = int | Literal["earliest", "latest"]

# kcat -P splits stdin on these; sample data for kcat never contains them.
KCAT_KEY_DELIM = "|KEY|"
KCAT_RECORD_DELIM = "|REC|"
# Headers kcat attaches to every record of one `kcat -P` run (it cannot vary them per record):
# a duplicated key, an empty value and an '=' inside a value.
KCAT_HEADERS: tuple[tuple[str, bytes], ...] = (("dup", b"1"), ("dup", b""), ("x", b"y=z"))


@dataclass(frozen=True)
class Rec:
    """One record as produced (offset -1) or as consumed/expected (offset and timestamp from the broker)."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None  # None when produced: the client stamps the current time
    offset: int = -1
    log_append_time: bool = False  # the timestamp is the broker's (LogAppendTime), not the producer's


def now_ms() -> int:
    """Wall-clock milliseconds, the unit of Kafka timestamps."""
    return int(time.time() * 1000)


def sample_records(
    count: int, partitions: int = 1, *, kcat_producer: bool = False, seed: int = 0, base_ts: int | None = None
) -> list[Rec]:
    """Varied records: null/empty/binary keys and values, duplicate and empty headers, explicit timestamps.

    Every value carries a compressible filler so that librdkafka really compresses (it sends a batch
    uncompressed when compression does not make it smaller). With kcat_producer the records fit what
    `kcat -P` can express: no empty-but-not-null keys/values (-Z turns them into null), the same headers
    on every record and no timestamps. Header values never hold ',', '\\n' or NUL because kcat's %h
    output (used when kcat consumes) cannot show them unambiguously.
    """
    rnd = random.Random(seed * 7919 + count)
    base = now_ms() - 60_000 if base_ts is None else base_ts  # recent: retention.ms must not drop them
    filler = b"icelog-compressible-filler " * 12
    out: list[Rec] = []
    for i in range(count):
        key: bytes | None
        value: bytes | None
        if i % 5 == 1:
            key = None
        elif i % 5 == 3 and not kcat_producer:
            key = b""
        else:
            key = b"k%d\x00\xff\n" % i + rnd.randbytes(rnd.randint(0, 8))
        if i % 7 == 2 and key is not None:  # kafka-python refuses a record whose key and value are both null
            value = None
        elif i % 7 == 4 and not kcat_producer:
            value = b""
        else:
            value = rnd.randbytes(rnd.randint(1, 40)) + bytes(range(256)) + filler
        if kcat_producer:
            headers = KCAT_HEADERS
        else:
            headers = (
                (),
                (("dup", b"a"), ("dup", b""), ("dup", b"c")),
                (("ключ-ü", "значение".encode()), ("empty", b"")),
                (("bin", bytes(rnd.choice(b"abcxyz=;:\x01\x7f\xfe") for _ in range(12))),),
            )[i % 4]
        timestamp = None if kcat_producer else base + rnd.randint(0, 50_000)
        for blob in (key or b"", value or b""):
            assert KCAT_KEY_DELIM.encode() not in blob and KCAT_RECORD_DELIM.encode() not in blob
        out.append(Rec(i % partitions, key, value, headers, timestamp))
    return out


def expected_records(produced: Sequence[Rec], start_offsets: dict[int, int] | None = None) -> list[Rec]:
    """The produced records with the offsets a broker must give them (in order per partition)."""
    next_offset = dict(start_offsets or {})
    out = []
    for rec in produced:
        offset = next_offset.get(rec.partition, 0)
        next_offset[rec.partition] = offset + 1
        out.append(replace(rec, offset=offset))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def comparable(records: Sequence[Rec], *, timestamps: bool = True) -> list[tuple[Any, ...]]:
    """Project records onto what a consumer must reproduce exactly (pytest then diffs the lists)."""
    return [
        (r.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp if timestamps else None)
        for r in sorted(records, key=lambda r: (r.partition, r.offset))
    ]


# -- broker-side checks through the raw protocol --------------------------------------------------


def _request(bootstrap: str, request: Any, response_cls: Any, version: int) -> Any:
    """Send one request (a kafka-python protocol object) on a fresh connection and decode the answer."""
    host, _, port = bootstrap.rpartition(":")
    request.with_header(correlation_id=1, client_id="icelog-tests")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        size = struct.unpack(">i", recv_exactly(sock, 4))[0]
        payload = recv_exactly(sock, size)
    return response_cls.decode(payload, version=version, header=True)


def request_frame(request: Any, version: int, correlation: int, client_id: str = "icelog-tests") -> bytes:
    """A kafka-python request object framed at `version` (size prefix and header), for raw-socket tests."""
    request.API_VERSION = version
    request.with_header(correlation_id=correlation, client_id=client_id)
    return bytes(request.encode(version=version, header=True, framed=True))


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Read exactly `size` bytes or fail."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def stored_batches(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """(base offset, attributes) of every record batch the broker serves for a partition, via raw Fetch v4.

    Used to prove a codec really was used end to end (a client may silently fall back to none).
    """
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    topic_cls = FetchRequest.FetchTopic
    out: list[tuple[int, int]] = []
    offset = 0
    while True:
        request = FetchRequest(
            version=4,
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 24,
            isolation_level=0,
            topics=[
                topic_cls(
                    topic=topic,
                    partitions=[
                        topic_cls.FetchPartition(
                            partition=partition, fetch_offset=offset, partition_max_bytes=1 << 24
                        )
                    ],
                )
            ],
        )
        data = _request(bootstrap, request, FetchResponse, 4).responses[0].partitions[0]
        assert data.error_code == 0, f"Fetch {topic}-{partition}@{offset}: error {data.error_code}"
        records = bytes(data.records or b"")
        pos = 0
        while pos + 61 <= len(records):
            base, length = struct.unpack_from(">qi", records, pos)
            attributes, last_delta = struct.unpack_from(">hi", records, pos + 21)
            if pos + 12 + length > len(records):
                break  # a partial batch at the end of the response
            out.append((base, attributes))
            offset = base + last_delta + 1
            pos += 12 + length
        if offset >= data.high_watermark or pos == 0:
            return out


def assert_codec_used(bootstrap: str, topic: str, partitions: Sequence[int], codec: str) -> None:
    """Every stored batch uses `codec` or none, and at least one batch really is compressed with it."""
    codecs = {attrs & 0x07 for p in partitions for _, attrs in stored_batches(bootstrap, topic, p)}
    assert codecs, f"no batches stored for {topic}"
    if codec == "none":
        assert codecs == {0}
    else:
        assert CODEC_IDS[codec] in codecs and codecs <= {0, CODEC_IDS[codec]}, codecs


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> None:
    """Create a topic through librdkafka's admin client (fails the test on any error)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs or {})], operation_timeout=10)
    futures[name].result(WAIT_S)


# -- confluent-kafka (librdkafka) ---------------------------------------------------------------------


class ConfluentClient:
    """confluent-kafka: librdkafka, the client most non-Java applications use."""

    name = "confluent"
    sets_timestamps = True
    empty_bytes = True
    per_record_headers = True

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", acks: str = "all"
    ) -> list[int]:
        """Produce in order; return the offsets from the delivery reports (-1 for acks=0)."""
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "acks": acks,
                "linger.ms": 20,
                # Idempotence needs acks=all; with it the broker's sequence tracking is exercised too.
                "enable.idempotence": acks == "all",
            }
        )
        reports: list[Any] = [None] * len(records)

        def on_delivery(index: int) -> Callable[[Any, Any], None]:
            def report(err: Any, msg: Any) -> None:
                # offset() is None when the broker sent no response (acks=0)
                reports[index] = err if err is not None else msg.offset()

            return report

        for i, rec in enumerate(records):
            kwargs: dict[str, Any] = {"timestamp": rec.timestamp} if rec.timestamp is not None else {}
            producer.produce(
                topic,
                value=rec.value,
                key=rec.key,
                partition=rec.partition,
                headers=list(rec.headers),
                on_delivery=on_delivery(i),
                **kwargs,
            )
            producer.poll(0)
        assert producer.flush(WAIT_S) == 0, "librdkafka could not deliver every record"
        errors = [r for r in reports if r is not None and not isinstance(r, int)]
        assert not errors, errors
        return [r if r is not None and r >= 0 else -1 for r in reports]

    def _consumer(self, bootstrap: str) -> Any:
        from confluent_kafka import Consumer

        # librdkafka insists on a group.id even for assign(); nothing is ever committed to it.
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tests-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 100,
                "enable.partition.eof": True,
            }
        )

    def consume(
        self,
        bootstrap: str,
        topic: str,
        partitions: Sequence[int],
        start: Start,
        count: int,
        then: Callable[[], None] | None = None,
    ) -> list[Rec]:
        """Assign `partitions` at `start`; once positioned, call `then`; read `count` records."""
        from confluent_kafka import (
            OFFSET_BEGINNING,
            OFFSET_END,
            TIMESTAMP_LOG_APPEND_TIME,
            KafkaError,
            TopicPartition,
        )

        consumer = self._consumer(bootstrap)
        offset = OFFSET_BEGINNING if start == "earliest" else OFFSET_END if start == "latest" else start
        tps = [TopicPartition(topic, p, offset) for p in partitions]
        out: list[Rec] = []
        try:
            consumer.assign(tps)
            deadline = time.monotonic() + WAIT_S
            if then is not None:
                # A partition-EOF event means librdkafka resolved its start offset and fetched to the end.
                at_end: set[int] = set()
                while at_end != set(partitions):
                    assert time.monotonic() < deadline, "consumer never reached the end of its partitions"
                    msg = consumer.poll(0.1)
                    if msg is not None:
                        assert msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF, (
                            msg
                        )
                        at_end.add(msg.partition())
                then()
            while len(out) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None or (
                    msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF
                ):
                    continue
                assert msg.error() is None, msg.error()
                ts_type, ts = msg.timestamp()
                out.append(
                    Rec(
                        msg.partition(),
                        msg.key(),
                        msg.value(),
                        tuple(msg.headers() or ()),
                        ts,
                        msg.offset(),
                        ts_type == TIMESTAMP_LOG_APPEND_TIME,
                    )
                )
        finally:
            consumer.close()
        return out

    def offsets_for_times(
        self, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
    ) -> list[int | None]:
        """ListOffsets by timestamp, one query per timestamp (None when no record is that late)."""
        from confluent_kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        out: list[int | None] = []
        try:
            for timestamp in timestamps:
                (tp,) = consumer.offsets_for_times(
                    [TopicPartition(topic, partition, timestamp)], timeout=WAIT_S
                )
                assert tp.error is None, tp.error
                out.append(tp.offset if tp.offset >= 0 else None)
        finally:
            consumer.close()
        return out

    def watermarks(self, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
        """(earliest, latest) through ListOffsets."""
        from confluent_kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT_S)
        finally:
            consumer.close()
        return low, high


# -- kafka-python 3 ---------------------------------------------------------------------------------


class KafkaPythonClient:
    """kafka-python 3.x, pure Python."""

    name = "kafka-python"
    sets_timestamps = True
    empty_bytes = True
    per_record_headers = True

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", acks: str = "all"
    ) -> list[int]:
        """Produce in order; return the offsets of the record metadata (-1 for acks=0)."""
        from kafka import KafkaProducer

        # kafka-python 3 is idempotent by default (InitProducerId + sequences); idempotence requires
        # acks=all, so the acks=0/1 cases turn it off.
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks=int(acks) if acks != "all" else "all",
            compression_type=None if codec == "none" else codec,
            linger_ms=20,
            enable_idempotence=acks == "all",
        )
        try:
            futures = [
                producer.send(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                    headers=list(r.headers),
                )
                for r in records
            ]
            producer.flush(WAIT_S)
            offsets = [f.get(WAIT_S).offset for f in futures]
        finally:
            producer.close(WAIT_S)
        return [o if o >= 0 else -1 for o in offsets]

    def _consumer(self, bootstrap: str) -> Any:
        from kafka import KafkaConsumer

        return KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
        )

    def consume(
        self,
        bootstrap: str,
        topic: str,
        partitions: Sequence[int],
        start: Start,
        count: int,
        then: Callable[[], None] | None = None,
    ) -> list[Rec]:
        """Assign `partitions` at `start`; once positioned, call `then`; read `count` records."""
        from kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        tps = [TopicPartition(topic, p) for p in partitions]
        out: list[Rec] = []
        try:
            consumer.assign(tps)
            if start == "earliest":
                consumer.seek_to_beginning(*tps)
            elif start == "latest":
                consumer.seek_to_end(*tps)
            else:
                for tp in tps:
                    consumer.seek(tp, start)
            for tp in tps:
                consumer.position(tp)  # blocks until the start offset is resolved with the broker
            if then is not None:
                then()
            deadline = time.monotonic() + WAIT_S
            while len(out) < count and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=200).values():
                    out.extend(
                        Rec(
                            m.partition,
                            m.key,
                            m.value,
                            tuple(m.headers),
                            m.timestamp,
                            m.offset,
                            m.timestamp_type == 1,
                        )
                        for m in batch
                    )
        finally:
            consumer.close()
        return out

    def offsets_for_times(
        self, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
    ) -> list[int | None]:
        """ListOffsets by timestamp, one query per timestamp (None when no record is that late)."""
        from kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        tp = TopicPartition(topic, partition)
        try:
            found = [consumer.offsets_for_times({tp: ts})[tp] for ts in timestamps]
        finally:
            consumer.close()
        return [None if f is None else f.offset for f in found]

    def watermarks(self, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
        """(earliest, latest) through ListOffsets."""
        from kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        tp = TopicPartition(topic, partition)
        try:
            return consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
        finally:
            consumer.close()


# -- aiokafka ------------------------------------------------------------------------------------------


class AiokafkaClient:
    """aiokafka 0.14 (asyncio; no flexible protocol versions at all)."""

    name = "aiokafka"
    sets_timestamps = True
    empty_bytes = True
    per_record_headers = True

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", acks: str = "all"
    ) -> list[int]:
        """Produce in order; return the offsets of the record metadata (-1 for acks=0)."""
        return asyncio.run(self._produce(bootstrap, topic, records, codec, acks))

    async def _produce(
        self, bootstrap: str, topic: str, records: Sequence[Rec], codec: str, acks: str
    ) -> list[int]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks=int(acks) if acks != "all" else "all",
            compression_type=None if codec == "none" else codec,
            linger_ms=20,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                    headers=list(r.headers),
                )
                for r in records
            ]
            await producer.flush()
            metadata = [await f for f in futures]
        finally:
            await producer.stop()
        return [m.offset if m is not None and m.offset >= 0 else -1 for m in metadata]  # None: acks=0

    def consume(
        self,
        bootstrap: str,
        topic: str,
        partitions: Sequence[int],
        start: Start,
        count: int,
        then: Callable[[], None] | None = None,
    ) -> list[Rec]:
        """Assign `partitions` at `start`; once positioned, call `then`; read `count` records."""
        return asyncio.run(self._consume(bootstrap, topic, partitions, start, count, then))

    async def _consume(
        self,
        bootstrap: str,
        topic: str,
        partitions: Sequence[int],
        start: Start,
        count: int,
        then: Callable[[], None] | None,
    ) -> list[Rec]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100
        )
        await consumer.start()
        tps = [TopicPartition(topic, p) for p in partitions]
        out: list[Rec] = []
        try:
            consumer.assign(tps)
            if start == "earliest":
                await consumer.seek_to_beginning(*tps)
            elif start == "latest":
                await consumer.seek_to_end(*tps)
            else:
                for tp in tps:
                    consumer.seek(tp, start)
            for tp in tps:
                await consumer.position(tp)  # waits until the start offset is resolved with the broker
            if then is not None:
                await asyncio.to_thread(then)
            deadline = time.monotonic() + WAIT_S
            while len(out) < count and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend(
                        Rec(
                            m.partition,
                            m.key,
                            m.value,
                            tuple(m.headers),
                            m.timestamp,
                            m.offset,
                            m.timestamp_type == 1,
                        )
                        for m in batch
                    )
        finally:
            await consumer.stop()
        return out

    def offsets_for_times(
        self, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
    ) -> list[int | None]:
        """ListOffsets by timestamp, one query per timestamp (None when no record is that late)."""
        return asyncio.run(self._offsets_for_times(bootstrap, topic, partition, timestamps))

    async def _offsets_for_times(
        self, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
    ) -> list[int | None]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        tp = TopicPartition(topic, partition)
        try:
            found = [(await consumer.offsets_for_times({tp: ts}))[tp] for ts in timestamps]
        finally:
            await consumer.stop()
        return [None if f is None else f.offset for f in found]

    def watermarks(self, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
        """(earliest, latest) through ListOffsets."""
        return asyncio.run(self._watermarks(bootstrap, topic, partition))

    async def _watermarks(self, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        tp = TopicPartition(topic, partition)
        try:
            low = (await consumer.beginning_offsets([tp]))[tp]
            high = (await consumer.end_offsets([tp]))[tp]
        finally:
            await consumer.stop()
        return low, high


# -- kcat ----------------------------------------------------------------------------------------------


def kcat(
    *args: str, stdin: bytes | None = None, timeout: float = WAIT_S
) -> subprocess.CompletedProcess[bytes]:
    """Run Debian's kcat (librdkafka 2.0 built in); fail the test with its stderr when it fails."""
    proc = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}"
    return proc


class KcatClient:
    """kcat: the command-line producer/consumer, driven through stdin/stdout."""

    name = "kcat"
    sets_timestamps = False
    empty_bytes = False  # -Z is needed for null keys/values, and it turns empty ones into null too
    per_record_headers = False  # -H applies to every record of a run
    # -f output: a header line with lengths, then the raw key and value bytes, then the headers (%h).
    FORMAT = "@%p %o %T %K %S\\n%k%s\\n%h\\n"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", acks: str = "all"
    ) -> list[int]:
        """`kcat -P` once per partition; kcat reports no offsets, so they are all -1."""
        for partition in sorted({r.partition for r in records}):
            mine = [r for r in records if r.partition == partition]
            assert all(r.headers == KCAT_HEADERS and r.timestamp is None for r in mine), (
                "not expressible in kcat"
            )
            stdin = b"".join(
                (r.key or b"") + KCAT_KEY_DELIM.encode() + (r.value or b"") + KCAT_RECORD_DELIM.encode()
                for r in mine
            )
            headers = [arg for name, value in KCAT_HEADERS for arg in ("-H", f"{name}={value.decode()}")]
            kcat(
                "-P",
                "-b",
                bootstrap,
                "-t",
                topic,
                "-p",
                str(partition),
                "-z",
                codec,
                "-X",
                f"acks={acks}",
                "-K",
                KCAT_KEY_DELIM,
                "-D",
                KCAT_RECORD_DELIM,
                "-Z",
                *headers,
                stdin=stdin,
            )
        return [-1] * len(records)

    def consume(
        self,
        bootstrap: str,
        topic: str,
        partitions: Sequence[int],
        start: Start,
        count: int,
        then: Callable[[], None] | None = None,
    ) -> list[Rec]:
        """`kcat -C -e` per partition until `count` records arrived (kcat never says it is positioned)."""
        assert then is None, "kcat gives no sign of having resolved 'latest'; use tail() instead"
        offset = {"earliest": "beginning", "latest": "end"}.get(str(start), str(start))
        deadline = time.monotonic() + WAIT_S
        while True:
            # -e exits at the end of each partition; records acknowledged with acks=0 may still be on their
            # way to durability, so read again until all have arrived.
            out = [r for p in partitions for r in self._read(bootstrap, topic, p, offset, exit_at_end=True)]
            if len(out) >= count or time.monotonic() > deadline:
                return out
            time.sleep(0.1)

    def _read(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        offset: str,
        *,
        exit_at_end: bool,
        count: int | None = None,
    ) -> list[Rec]:
        """One kcat -C run, parsed."""
        args = [
            "-C",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-p",
            str(partition),
            "-o",
            offset,
            "-f",
            self.FORMAT,
            "-q",
        ]
        if exit_at_end:
            args.append("-e")
        if count is not None:
            args += ["-c", str(count)]
        return parse_kcat_output(kcat(*args).stdout)

    def tail(self, bootstrap: str, topic: str, partition: int, last: int) -> list[Rec]:
        """The last `last` records: kcat's relative offset -N, resolved from the latest offset."""
        return self._read(bootstrap, topic, partition, f"-{last}", exit_at_end=True)

    def offsets_for_times(
        self, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
    ) -> list[int | None]:
        """`kcat -Q -t topic:partition:timestamp` per timestamp (kcat keeps one query per partition)."""
        out: list[int | None] = []
        for timestamp in timestamps:
            line = (
                kcat("-Q", "-b", bootstrap, "-t", f"{topic}:{partition}:{timestamp}").stdout.decode().strip()
            )
            offset = int(line.rsplit(" ", 1)[1])
            out.append(offset if offset >= 0 else None)
        return out

    def watermarks(self, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
        """(earliest, latest): `kcat -Q` with the logical timestamps -2 and -1."""
        low = kcat("-Q", "-b", bootstrap, "-t", f"{topic}:{partition}:-2").stdout.decode().strip()
        high = kcat("-Q", "-b", bootstrap, "-t", f"{topic}:{partition}:-1").stdout.decode().strip()
        return int(low.rsplit(" ", 1)[1]), int(high.rsplit(" ", 1)[1])


def parse_kcat_output(data: bytes) -> list[Rec]:
    """Parse `KcatClient.FORMAT` output; the lengths make binary keys and values unambiguous."""
    out: list[Rec] = []
    pos = 0
    while pos < len(data):
        assert data[pos : pos + 1] == b"@", f"unexpected kcat output at byte {pos}: {data[pos : pos + 40]!r}"
        end = data.index(b"\n", pos)
        partition, offset, ts, key_len, value_len = (int(f) for f in data[pos + 1 : end].split(b" "))
        pos = end + 1
        key = data[pos : pos + key_len] if key_len >= 0 else None
        pos += max(key_len, 0)
        value = data[pos : pos + value_len] if value_len >= 0 else None
        pos += max(value_len, 0)
        assert data[pos : pos + 1] == b"\n"
        end = data.index(b"\n", pos + 1)
        line = data[pos + 1 : end]
        pos = end + 1
        headers = (
            tuple((name.decode(), value) for name, _, value in (h.partition(b"=") for h in line.split(b",")))
            if line
            else ()
        )
        out.append(Rec(partition, key, value, headers, ts, offset))
    return out


CLIENTS: dict[str, Any] = {
    c.name: c for c in (ConfluentClient(), KafkaPythonClient(), AiokafkaClient(), KcatClient())
}
