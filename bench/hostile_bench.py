"""An innocent producer's ack latency while other clients attack the broker (issue 29).

One broker; an innocent confluent-kafka producer (acks=all, one record at a time) runs throughout and its ack
latencies are split by phase, each `--seconds` long:
  baseline   nothing else
  bomb       one connection keeps five Produce requests in flight, each three gzip batches that decompress
             past 100 MB (refused with MESSAGE_TOO_LARGE)
  polls      rounds of 1,000 connections that each send a long-polling Fetch (max_wait 60 s) and disconnect
  flood      2,000 connections opened and held open
  hog        no attack: a process of its own decompresses gzip in a loop at niceness 10 (the validation
             thread's), which is what refusing bombs costs the machine at the least; on a 2-core machine this
             is the floor any attack that keeps a core busy (the attacker's own included) can reach
  baseline2  nothing else again (the machine's drift over the run)
Reported: p50 / p99 per phase and each phase's p99 over the baseline's (the mean of both baselines).
Target (issue 29): every attack's ratio <= 2.

    .venv/bin/python bench/hostile_bench.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import socket
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from icelog.wire.validator import VALIDATOR_NICE  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.clients_util import create_topic  # noqa: E402
from tests.support.hostile import (  # noqa: E402
    LIBRDKAFKA_LIMIT,
    InnocentProducer,
    gzip_batch,
    long_poll_frame,
    produce_frame,
    read_produce_response,
)

POLLERS = 1_000
FLOOD = 2_000


def bomb(port: int, topic: str, stop: EventType) -> int:
    """Pipelined bombs until `stop`; the number refused."""
    batch = gzip_batch(LIBRDKAFKA_LIMIT + 1)
    refused = 0
    correlation = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        in_flight = 0
        while not stop.is_set() or in_flight:
            while in_flight < 5 and not stop.is_set():
                correlation += 1
                sock.sendall(produce_frame(topic, {0: batch, 1: batch, 2: batch}, correlation))
                in_flight += 1
            answer = read_produce_response(sock)
            in_flight -= 1
            refused += sum(p.error_code == 10 for p in answer.responses[0].partition_responses)
    return refused


def abandoned_polls(port: int, topic: str, stop: EventType) -> int:
    """Rounds of POLLERS connections that send a long poll and leave; the number of polls sent."""
    frame = long_poll_frame(topic, 60_000, partitions=3)
    sent = 0
    while not stop.is_set():
        socks = []
        for _ in range(POLLERS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(frame)
            socks.append(sock)
        time.sleep(0.5)  # the polls are parked in the broker
        for sock in socks:
            sock.close()
        sent += len(socks)
    return sent


def flood(port: int, _topic: str, stop: EventType) -> int:
    """FLOOD connections opened (one by one, as fast as accepted) and held until `stop`."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < FLOOD and not stop.is_set():
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        stop.wait()
        return len(socks)
    finally:
        for sock in socks:
            sock.close()


def _attack(name: str, port: int, stop: EventType, result: Synchronized[int]) -> None:
    """The attack `name` in a process of its own, so the attacker's Python does not share the innocent's GIL;
    its count goes to `result`."""
    result.value = ATTACKS[name](port, "attacked", stop)


def hog(_port: int, _topic: str, stop: EventType) -> int:
    """Gzip decompression of a 100 MB bomb in a loop, counted and dropped, at the validation thread's niceness;
    the passes made."""
    os.nice(VALIDATOR_NICE)
    payload = zlib.compress(b"\x00" * LIBRDKAFKA_LIMIT, wbits=31)
    passes = 0
    while not stop.is_set():
        member = zlib.decompressobj(31)
        data = payload
        while (chunk := member.decompress(data, 1 << 20)) or member.unconsumed_tail:
            data = member.unconsumed_tail
            del chunk
        passes += 1
    return passes


ATTACKS: dict[str, Callable[[int, str, EventType], int]] = {
    "bomb": bomb, "polls": abandoned_polls, "flood": flood, "hog": hog,
}


def percentiles(latencies: list[float]) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100)
    return {"acks": len(latencies), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--attacks", default="bomb,polls,flood,hog", help="which phases, comma-separated")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16_384)), hard))  # the broker inherits it
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        broker = BrokerProcess(Path(tmp) / "data", extra_args=["--log-level", "warning"]).start()
        try:
            create_topic(broker.bootstrap, "attacked", 3)
            create_topic(broker.bootstrap, "innocent", 1)
            phases: dict[str, dict[str, float]] = {}
            work: dict[str, int] = {}
            with InnocentProducer(broker.bootstrap, "innocent") as innocent:
                for phase in ("baseline", *args.attacks.split(","), "baseline2"):
                    print(f"{phase}...", file=sys.stderr)
                    stop = multiprocessing.Event()
                    result = multiprocessing.Value("q", -1)
                    attacker = None
                    if phase in ATTACKS:
                        attacker = multiprocessing.Process(target=_attack, args=(phase, broker.port, stop, result))
                        attacker.start()
                        time.sleep(1)  # the attack under way before measuring
                    start = time.monotonic()
                    time.sleep(args.seconds)
                    phases[phase] = percentiles(innocent.latencies_ms(start, time.monotonic()))
                    stop.set()
                    if attacker is not None:
                        attacker.join(120)
                        work[phase] = int(result.value)
                    time.sleep(2)  # let the broker settle between phases
            assert not innocent.errors, innocent.errors
        finally:
            broker.stop()
    base = (phases["baseline"]["p99_ms"] + phases["baseline2"]["p99_ms"]) / 2
    print(json.dumps({
        "machine": f"{platform.node()} {platform.machine()}",
        "phases": phases,
        "attack_work": {"bomb_partitions_refused": work.get("bomb"), "polls_abandoned": work.get("polls"),
                        "connections_held": work.get("flood"), "hog_passes": work.get("hog")},
        "p99_vs_baseline": {k: round(phases[k]["p99_ms"] / base, 2) for k in ATTACKS if k in phases},
    }, indent=2))


if __name__ == "__main__":
    main()
