"""Broker benchmark: produce and consume throughput, ack latency, against the disk's fsync'd bandwidth.

Run: .venv/bin/python bench/broker_bench.py [--records 400000] [--partitions 6] [--replay-only] [--metrics-ab 5]
(--replay-only: the disk baseline and the replayed requests alone, e.g. to A/B two checkouts by PYTHONPATH.
--metrics-ab N: two brokers, metrics on and off, produce to each in turn N times; the on / off ratio of medians.)
Everything is measured in one run so the ratios hold on a shared, noisy machine: the disk's fsync'd rate (`dd`)
before and after the produce runs (a cloud disk's burst rate drifts), and each produce rate against their mean:
confluent-kafka from Python with a delivery callback per record, the same with delivery reports of errors only
(less Python per record: the client is CPU-bound on 2 cores), kcat, and replayed requests (the broker alone).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from tests.support.broker import BrokerProcess  # noqa: E402

RECORD_SIZE = 1024
CODEC_LZ4 = 3  # RecordBatch attributes: compression type lz4


def disk_baseline(directory: Path, megabytes: int = 512) -> float:
    """MB/s of `dd ... conv=fsync` (sequential write, fsync at the end) in the broker's data directory."""
    target = directory / "dd.bin"
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={megabytes}", "conv=fsync"],
        capture_output=True, text=True, check=True,
    ).stderr
    target.unlink()
    seconds = float(re.search(r"copied, ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    return megabytes * 1024 * 1024 / seconds / 1e6


def fsync_latency_baseline(directory: Path, commits: int = 1500, size: int = 50 * 1024) -> dict[str, float]:
    """p50/p99 of write+fdatasync of one group commit's worth of bytes every 5 ms: the floor under ack latency."""
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = os.urandom(size)
    timings = []
    try:
        for _ in range(commits):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            timings.append(time.perf_counter() - started)
            time.sleep(0.005)
    finally:
        os.close(fd)
        path.unlink()
    q = statistics.quantiles(timings, n=100)
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000}


def payloads(count: int) -> list[bytes]:
    """Half random, half repetitive 1 KiB values, so lz4 has realistic work (about 2:1)."""
    return [os.urandom(RECORD_SIZE // 2) + bytes([i % 256]) * (RECORD_SIZE // 2) for i in range(count)]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)


def produce_throughput(bootstrap: str, topic: str, records: int, reports: str = "all",
                       conf: dict[str, str] | None = None) -> dict[str, float]:
    """confluent-kafka from Python, acks=all, lz4. `reports`: "all" calls a Python delivery callback per record;
    "errors" (librdkafka's delivery.report.only.error, as a throughput producer runs) calls it only for a record
    that failed, so the client's CPU is librdkafka's rather than 400 k Python callbacks'."""
    producer = ck.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5,
        "queue.buffering.max.kbytes": 1024 * 1024, "queue.buffering.max.messages": 1_000_000,
        "delivery.report.only.error": reports == "errors", **(conf or {}),
    })
    values = payloads(1000)
    failures = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, values[i % 1000], on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
            if i % 100000 == 0:
                print(f"  produced {i}/{records}", file=sys.stderr, flush=True)
    producer.flush(120)
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} records failed")
    return {"seconds": seconds, "mb_per_s": records * RECORD_SIZE / seconds / 1e6, "records_per_s": records / seconds}


def produce_throughput_kcat(bootstrap: str, topic: str, records: int, directory: Path) -> dict[str, float]:
    """The same load from `kcat -P` (librdkafka in C): the broker, not a Python produce loop, is measured.

    Values are 1 KiB lines, half random base64 and half repetitive (kcat splits its input on newlines).
    """
    source = directory / "values.txt"
    with source.open("wb") as out:
        for i in range(records):
            out.write(base64.b64encode(os.urandom(384)) + bytes([97 + i % 26]) * (RECORD_SIZE // 2) + b"\n")
    started = time.perf_counter()
    subprocess.run(
        ["kcat", "-P", "-b", bootstrap, "-t", topic, "-z", "lz4", "-X", "acks=all", "-X", "linger.ms=5",
         "-X", "queue.buffering.max.kbytes=1048576", "-X", "queue.buffering.max.messages=1000000", "-l", str(source)],
        check=True, capture_output=True,
    )
    seconds = time.perf_counter() - started
    source.unlink()
    return {"seconds": seconds, "mb_per_s": records * RECORD_SIZE / seconds / 1e6, "records_per_s": records / seconds}


def produce_throughput_replayed(
    bootstrap: str, topic: str, partitions: int, records: int, in_flight: int = 8
) -> dict[str, float]:
    """The broker alone: ~1 MB lz4 batches built once, then sent as pipelined ProduceRequests (acks=all).

    No client does less work per byte than replaying ready-made requests, so this is the broker's own
    ceiling on this machine (decode, validate and decompress, assign offsets, group commit, fsync).
    The batches are non-idempotent, so replaying the same bytes appends new records each time.
    """
    per_batch = 1000
    values = payloads(per_batch)
    builder = DefaultRecordBatchBuilder(2, CODEC_LZ4, 0, -1, -1, -1, 1 << 24)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    batch = bytes(builder.build())
    requests = []
    for partition in range(partitions):
        request = ProduceRequest(
            transactional_id=None, acks=-1, timeout_ms=30000,
            topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)])],
        )
        requests.append(request)
    count = max(1, records // per_batch)
    host, _, port = bootstrap.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    version = 8

    def frame(correlation: int) -> bytes:
        request = requests[correlation % partitions]
        request.API_VERSION = version
        request.with_header(correlation_id=correlation, client_id="bench-replay")
        return bytes(request.encode(version=version, header=True, framed=True))

    def read_exact(n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks += chunk
        return bytes(chunks)

    frames = [frame(i) for i in range(partitions)]  # encoded once; only the correlation id differs
    started = time.perf_counter()
    sent = acked = 0
    while acked < count:
        while sent < count and sent - acked < in_flight:
            data = bytearray(frames[sent % partitions])
            data[8:12] = sent.to_bytes(4, "big")  # size(4) api_key(2) api_version(2) correlation_id(4)
            sock.sendall(data)
            sent += 1
        size = int.from_bytes(read_exact(4), "big")
        response = ProduceResponse.decode(read_exact(size), version=version, header=True)
        error = response.responses[0].partition_responses[0].error_code
        if error:
            raise RuntimeError(f"replayed produce failed with error code {error}")
        acked += 1
        if acked % 100 == 0:
            print(f"  replayed {acked}/{count} batches", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    sock.close()
    total = count * per_batch
    return {"seconds": seconds, "mb_per_s": total * RECORD_SIZE / seconds / 1e6, "records_per_s": total / seconds}


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ack_latency(bootstrap: str, topic: str, mb_per_s: float, seconds: float,
                conf: dict[str, str] | None = None) -> dict[str, float]:
    """Produce at a steady rate; latency = delivery report time - produce() time. `conf`: extra client settings
    (a listener's security, as bench/security_bench.py passes)."""
    producer = ck.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4", "linger.ms": 5, **(conf or {}),
    })
    values = payloads(1000)
    rate = mb_per_s * 1e6 / RECORD_SIZE
    latencies: list[float] = []

    def on_delivery(err: object, _msg: object, sent: float) -> None:
        if err is None:
            latencies.append(time.perf_counter() - sent)

    started = time.perf_counter()
    sent = 0
    total = int(rate * seconds)
    while sent < total:
        due = started + sent / rate
        now = time.perf_counter()
        if now < due:
            producer.poll(min(due - now, 0.001))
            continue
        t = time.perf_counter()
        producer.produce(topic, values[sent % 1000], on_delivery=lambda e, m, t=t: on_delivery(e, m, t))
        sent += 1
        if sent % 100 == 0:
            producer.poll(0)
    producer.flush(60)
    # Latency includes librdkafka's 5 ms linger: that part is the client's choice, not the broker's.
    q = statistics.quantiles(latencies, n=100)
    return {"records": len(latencies), "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "linger_ms": 5}


def consume_throughput_kcat(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    """Read the whole topic with kcat (librdkafka in C): the broker, not a Python loop, is measured."""
    started = time.perf_counter()
    out = subprocess.run(
        ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%S\\n"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    seconds = time.perf_counter() - started
    if len(out) != records:
        raise RuntimeError(f"kcat read {len(out)} records, expected {records}")
    size = sum(int(n) for n in out)
    return {"seconds": seconds, "mb_per_s": size / seconds / 1e6, "records_per_s": records / seconds}


def consume_throughput(bootstrap: str, topic: str, partitions: int, records: int) -> dict[str, float]:
    consumer = ck.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 1024 * 1024,
    })
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
    received = 0
    size = 0
    started = time.perf_counter()
    while received < records:
        for msg in consumer.consume(10000, 1.0):
            if msg.error() is None:
                received += 1
                size += len(msg.value())
    seconds = time.perf_counter() - started
    consumer.close()
    return {"seconds": seconds, "mb_per_s": size / seconds / 1e6, "records_per_s": received / seconds}


def metrics_ab(records: int, partitions: int, rounds: int, directory: Path) -> dict[str, object]:
    """Produce throughput with metrics on against off: two brokers, runs alternated (order swapped each round) so
    both see the same machine; confluent-kafka (errors-only reports) and replayed requests (the broker alone)."""
    brokers = {}
    for name, listen in (("on", None), ("off", "off")):
        data = directory / f"metrics-{name}"
        data.mkdir()
        env = {"ICELOG_METRICS_LISTEN": listen} if listen else {}
        brokers[name] = BrokerProcess(data, env=env, extra_args=["--log-level", "warning"]).start()
    runs: dict[str, dict[str, list[float]]] = {name: {"confluent": [], "replayed": []} for name in brokers}
    try:
        for round_ in range(rounds):
            for name in (("on", "off") if round_ % 2 == 0 else ("off", "on")):
                broker = brokers[name]
                topic = f"ab-{round_}"
                create_topic(broker.bootstrap, topic, partitions)
                print(f"metrics {name}, round {round_ + 1}/{rounds}...", file=sys.stderr, flush=True)
                produced = produce_throughput(broker.bootstrap, topic, records, "errors")
                runs[name]["confluent"].append(produced["mb_per_s"])
                create_topic(broker.bootstrap, topic + "-replay", partitions)
                runs[name]["replayed"].append(
                    produce_throughput_replayed(broker.bootstrap, topic + "-replay", partitions, records)["mb_per_s"]
                )
    finally:
        for broker in brokers.values():
            broker.stop()
    out: dict[str, object] = {"rounds": rounds, "records": records}
    for kind in ("confluent", "replayed"):
        on, off = statistics.median(runs["on"][kind]), statistics.median(runs["off"][kind])
        out[f"{kind}_mb_per_s_on"] = [round(v, 1) for v in runs["on"][kind]]
        out[f"{kind}_mb_per_s_off"] = [round(v, 1) for v in runs["off"][kind]]
        out[f"{kind}_on_over_off"] = round(on / off, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--latency-seconds", type=float, default=15)
    parser.add_argument("--replay-only", action="store_true", help="only the disk baseline and replayed requests")
    parser.add_argument("--metrics-ab", type=int, metavar="ROUNDS",
                        help="only produce with metrics on and off, alternated ROUNDS times (the on / off ratio)")
    args = parser.parse_args()
    if args.metrics_ab:
        with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
            result = metrics_ab(args.records, args.partitions, args.metrics_ab, Path(tmp))
        result["machine"] = f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}"
        print(json.dumps({"metrics_on_over_off": result}, indent=2))
        return
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        broker = BrokerProcess(data, extra_args=["--log-level", "warning"]).start()
        try:
            print("disk baseline (dd conv=fsync)...", file=sys.stderr)
            disk = disk_baseline(data)
            if args.replay_only:
                create_topic(broker.bootstrap, "bench-replay", args.partitions)
                replayed = produce_throughput_replayed(broker.bootstrap, "bench-replay", args.partitions, args.records)
                print(json.dumps({"disk_fsync_mb_per_s": round(disk, 1),
                                  "produce_replayed": {k: round(v, 1) for k, v in replayed.items()},
                                  "produce_replayed_vs_disk": round(replayed["mb_per_s"] / disk, 2)}))
                return
            create_topic(broker.bootstrap, "bench", args.partitions)
            print("produce throughput...", file=sys.stderr)
            assert broker.proc is not None
            cpu = (own_cpu_seconds(), process_cpu_seconds(broker.proc.pid))
            produced = produce_throughput(broker.bootstrap, "bench", args.records)
            # Where the CPU goes on 2 shared cores: the Python client (produce() per record, lz4 in
            # librdkafka) against the broker (everything, all threads).
            produced["client_cpu_s"] = own_cpu_seconds() - cpu[0]
            produced["broker_cpu_s"] = process_cpu_seconds(broker.proc.pid) - cpu[1]
            create_topic(broker.bootstrap, "bench-errors-only", args.partitions)
            print("produce throughput, delivery reports of errors only...", file=sys.stderr)
            cpu = (own_cpu_seconds(), process_cpu_seconds(broker.proc.pid))
            produced_lean = produce_throughput(broker.bootstrap, "bench-errors-only", args.records, reports="errors")
            produced_lean["client_cpu_s"] = own_cpu_seconds() - cpu[0]
            produced_lean["broker_cpu_s"] = process_cpu_seconds(broker.proc.pid) - cpu[1]
            create_topic(broker.bootstrap, "bench-kcat", args.partitions)
            print("produce throughput, kcat...", file=sys.stderr)
            cpu = (own_cpu_seconds(), process_cpu_seconds(broker.proc.pid))
            produced_kcat = produce_throughput_kcat(broker.bootstrap, "bench-kcat", args.records, Path(tmp))
            produced_kcat["broker_cpu_s"] = process_cpu_seconds(broker.proc.pid) - cpu[1]
            create_topic(broker.bootstrap, "bench-replay", args.partitions)
            print("produce throughput, replayed batches (the broker alone)...", file=sys.stderr)
            cpu = (own_cpu_seconds(), process_cpu_seconds(broker.proc.pid))
            produced_replay = produce_throughput_replayed(
                broker.bootstrap, "bench-replay", args.partitions, args.records
            )
            produced_replay["client_cpu_s"] = own_cpu_seconds() - cpu[0]
            produced_replay["broker_cpu_s"] = process_cpu_seconds(broker.proc.pid) - cpu[1]
            # A cloud disk's rate drifts (burst credits): measured again after the produce runs, the ratios
            # are against the mean of the two.
            print("disk baseline again...", file=sys.stderr)
            disk_after = disk_baseline(data)
            disk_before, disk = disk, (disk + disk_after) / 2
            print("consume throughput...", file=sys.stderr)
            consumed_kcat = consume_throughput_kcat(broker.bootstrap, "bench", args.records)
            consumed = consume_throughput(broker.bootstrap, "bench", args.partitions, args.records)
            create_topic(broker.bootstrap, "latency", args.partitions)
            print("fsync latency baseline...", file=sys.stderr)
            fsync_floor = fsync_latency_baseline(data)
            print("ack latency at 10 MB/s...", file=sys.stderr)
            latency = ack_latency(broker.bootstrap, "latency", 10, args.latency_seconds)
        finally:
            broker.stop()
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "disk_fsync_mb_per_s": round(disk, 1),
        "disk_fsync_before_after": [round(disk_before, 1), round(disk_after, 1)],
        "produce": {k: round(v, 1) for k, v in produced.items()},
        "produce_vs_disk": round(produced["mb_per_s"] / disk, 2),
        "produce_errors_only": {k: round(v, 1) for k, v in produced_lean.items()},
        "produce_errors_only_vs_disk": round(produced_lean["mb_per_s"] / disk, 2),
        "produce_kcat": {k: round(v, 1) for k, v in produced_kcat.items()},
        "produce_kcat_vs_disk": round(produced_kcat["mb_per_s"] / disk, 2),
        "produce_replayed": {k: round(v, 1) for k, v in produced_replay.items()},
        "produce_replayed_vs_disk": round(produced_replay["mb_per_s"] / disk, 2),
        "consume_kcat": {k: round(v, 1) for k, v in consumed_kcat.items()},
        "consume_confluent_python": {k: round(v, 1) for k, v in consumed.items()},
        "ack_latency_10mb_s": {k: round(v, 2) for k, v in latency.items()},
        "fsync_50k_every_5ms": {k: round(v, 2) for k, v in fsync_floor.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
