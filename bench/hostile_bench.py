"""An innocent producer's ack latency while other clients attack the broker (issues 29 and 42).

One broker with a SASL_SSL listener (SCRAM users, ACLs), a PLAINTEXT one and its registry over HTTPS with basic
auth; an innocent confluent-kafka producer, logged in with SCRAM-SHA-512 on SASL_SSL (acks=all, one record at a
time), runs throughout and its ack latencies are split by phase, each `--seconds` long:
  baseline   nothing else: a window of it right before each attack's window
  bomb       one connection keeps five Produce requests in flight, each three gzip batches that decompress
             past 100 MB (refused with MESSAGE_TOO_LARGE)
  polls      rounds of 1,000 connections that each send a long-polling Fetch (max_wait 60 s) and disconnect
  flood      2,000 connections opened and held open (PLAINTEXT)
  hog        no attack: a process of its own decompresses gzip in a loop at niceness 10 (the validation
             thread's), which is what refusing bombs costs the machine at the least; on a 2-core machine this
             is the floor any attack that keeps a core busy (the attacker's own included) can reach
  -- before the login (issue 42) --
  sizes      two connections per listener announce a 100 MB request and send nothing more (the SASL_SSL ones,
             closed at once, are opened again every 50 ms)
  silent     2,000 connections to the SASL_SSL port that never start TLS (opened again as they are closed)
  plain      6 connections logging in with PLAIN again and again: half with a 500 KB password (closed unread:
             longer than a PLAIN token can be), half with a wrong 1,000-character non-ASCII one (the longest a check
             derives keys for)
  scram      6 connections sending SCRAM-SHA-512 client-firsts with a 500 KB user name again and again (closed
             unread)
  registry   20 threads asking the registry with a wrong password: half 6 KB, half 1,000 non-ASCII characters
             (past 20 failures the address gets 429 after a wait, unchecked: FailedLoginLimit)
Reported: p50 / p99 per phase (pooled over rounds) and each attack's p99 over the p99 of the quiet window just
before it, the median over `--rounds` rounds (neighbouring windows, so the shared machine's drift cancels); the CPU
seconds the broker used during each phase (its own threads, and apart its login and validation processes) and the
attacker over its whole run (`--attacker-nice` lowers the attackers' priority: on a 2-core machine their own TLS
and sending compete with the broker and the innocent client, which an attacker elsewhere would not).
Target (issues 29 and 42): every attack's ratio <= 2.

    .venv/bin/python bench/hostile_bench.py [--seconds 10] [--rounds 3] [--attacks bomb,polls,...] [--attacker-nice 10]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing
import os
import platform
import resource
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from icelog.wire.validator import VALIDATOR_NICE  # noqa: E402
from tests.support.clients_util import create_topic  # noqa: E402
from tests.support.hostile import (  # noqa: E402
    LIBRDKAFKA_LIMIT,
    InnocentProducer,
    closed_by_peer,
    connect,
    gzip_batch,
    long_poll_frame,
    plain_token,
    produce_frame,
    read_produce_response,
    sasl_login,
    scram_first,
)
from tests.support.proc import cpu_seconds  # noqa: E402
from tests.support.security import Auth, start_secure_broker  # noqa: E402

POLLERS = 1_000
FLOOD = 2_000
LOGINS = 6  # connections logging in at once in the plain and scram phases
REGISTRY_THREADS = 20
USER, PASSWORD = "innocent", "innocent-pw"
ANNOUNCED = 100 * 1024 * 1024  # the size the sizes phase announces and never sends
LONG = "x" * 500_000  # a credential the broker reads (under sasl.server.max.receive.size) but need not check
WRONG_WORDS = "\u00e9" * 1_000  # a wrong password as long as a check derives keys for (non-ASCII: SASLprep runs)


@dataclass(frozen=True)
class Target:
    """Where the attackers go (picklable: each attack runs in a process of its own)."""

    plaintext: int
    sasl_ssl: int
    registry: int
    ca: str
    topic: str = "attacked"


def bomb(target: Target, stop: EventType) -> int:
    """Pipelined bombs until `stop`; the number refused."""
    batch = gzip_batch(LIBRDKAFKA_LIMIT + 1)
    refused = 0
    correlation = 0
    with socket.create_connection(("127.0.0.1", target.plaintext), timeout=120) as sock:
        in_flight = 0
        while not stop.is_set() or in_flight:
            while in_flight < 5 and not stop.is_set():
                correlation += 1
                sock.sendall(produce_frame(target.topic, {0: batch, 1: batch, 2: batch}, correlation))
                in_flight += 1
            answer = read_produce_response(sock)
            in_flight -= 1
            refused += sum(p.error_code == 10 for p in answer.responses[0].partition_responses)
    return refused


def abandoned_polls(target: Target, stop: EventType) -> int:
    """Rounds of POLLERS connections that send a long poll and leave; the number of polls sent."""
    frame = long_poll_frame(target.topic, 60_000, partitions=3)
    sent = 0
    while not stop.is_set():
        socks = []
        for _ in range(POLLERS):
            sock = socket.create_connection(("127.0.0.1", target.plaintext), timeout=30)
            sock.sendall(frame)
            socks.append(sock)
        time.sleep(0.5)  # the polls are parked in the broker
        for sock in socks:
            sock.close()
        sent += len(socks)
    return sent


def _hold(port: int, stop: EventType, count: int) -> int:
    """`count` connections opened (one by one, as fast as accepted) and held until `stop`; those the broker
    closes (the SASL_SSL port's, after connection_setup_timeout_ms) are opened again. The connections opened."""
    socks: list[socket.socket] = []
    opened = 0
    try:
        while not stop.is_set():
            while len(socks) < count and not stop.is_set():
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
                opened += 1
            stop.wait(0.5)
            still = [sock for sock in socks if not closed_by_peer(sock, 0)]
            for sock in set(socks) - set(still):
                sock.close()
            socks = still
        return opened
    finally:
        for sock in socks:
            sock.close()


def flood(target: Target, stop: EventType) -> int:
    """FLOOD connections to the PLAINTEXT port, held until `stop`."""
    return _hold(target.plaintext, stop, FLOOD)


def silent(target: Target, stop: EventType) -> int:
    """FLOOD connections to the SASL_SSL port that never start TLS, kept up until `stop`."""
    return _hold(target.sasl_ssl, stop, FLOOD)


def sizes(target: Target, stop: EventType) -> int:
    """Two connections per listener announce ANNOUNCED bytes and send nothing more; the SASL_SSL ones are opened
    again as the broker closes them. The announcements made."""
    held = [socket.create_connection(("127.0.0.1", target.plaintext), timeout=30) for _ in range(2)]
    announced = 0
    for sock in held:
        sock.sendall(struct.pack(">i", ANNOUNCED))
        announced += 1
    while not stop.is_set():
        for _ in range(2):
            with connect(target.sasl_ssl, Path(target.ca)) as sock:
                sock.sendall(struct.pack(">i", ANNOUNCED))
                announced += 1
                closed_by_peer(sock, 30)
        stop.wait(0.05)
    for sock in held:
        sock.close()
    return announced


def _logins(target: Target, stop: EventType, tokens: list[tuple[str, bytes]]) -> int:
    """LOGINS threads logging in on SASL_SSL with each of `tokens` in turn until `stop`; the logins refused."""
    refused = 0

    def attacker(offset: int) -> None:
        nonlocal refused
        turn = offset
        while not stop.is_set():
            mechanism, token = tokens[turn % len(tokens)]
            turn += 1
            with connect(target.sasl_ssl, Path(target.ca), timeout=60) as sock:
                try:
                    code, _ = sasl_login(sock, mechanism, token)
                except OSError:  # closed unread: longer than the mechanism's tokens can be
                    code = 58
            refused += code == 58  # SASL_AUTHENTICATION_FAILED

    threads = [threading.Thread(target=attacker, args=(i,)) for i in range(LOGINS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return refused


def plain(target: Target, stop: EventType) -> int:
    return _logins(target, stop, [("PLAIN", plain_token(USER, LONG)), ("PLAIN", plain_token(USER, WRONG_WORDS))])


def scram(target: Target, stop: EventType) -> int:
    return _logins(target, stop, [("SCRAM-SHA-512", scram_first(LONG))])


def registry(target: Target, stop: EventType) -> int:
    """REGISTRY_THREADS threads asking the registry for its subjects with a wrong password until `stop`; the
    refusals they got (401, or 429 once the address has failed too often)."""
    url = f"https://127.0.0.1:{target.registry}/subjects"
    refused = 0

    def asker(wrong: str) -> None:
        nonlocal refused
        # UTF-8, as Confluent's clients send it (requests' own basic auth encodes Latin-1, which the registry
        # refuses unchecked)
        header = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{wrong}".encode()).decode()}
        with requests.Session() as session:
            while not stop.is_set():
                reply = session.get(url, headers=header, verify=target.ca, timeout=60)
                refused += reply.status_code in (401, 429)

    threads = [threading.Thread(target=asker, args=("w" * 6000 if i % 2 else WRONG_WORDS,))
               for i in range(REGISTRY_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return refused


def _attack(name: str, target: Target, stop: EventType, result: Synchronized[int], nice: int) -> None:
    """The attack `name` in a process of its own, so the attacker's Python does not share the innocent's GIL;
    its count goes to `result`. `nice`: the attacker's niceness (its CPU would be another machine's)."""
    os.nice(nice)
    result.value = ATTACKS[name](target, stop)


def hog(_target: Target, stop: EventType) -> int:
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


ATTACKS: dict[str, Callable[[Target, EventType], int]] = {
    "bomb": bomb, "polls": abandoned_polls, "flood": flood, "hog": hog,
    "sizes": sizes, "silent": silent, "plain": plain, "scram": scram, "registry": registry,
}


def children_cpu() -> float:
    """CPU seconds of this process's finished children (the attackers once joined; the broker still runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def helpers_cpu(broker: int) -> float:
    """CPU seconds of the broker's child processes still running (its login and validation processes, which
    `cpu_seconds` of the broker leaves out)."""
    total = 0.0
    for task in Path(f"/proc/{broker}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):  # gone since
                total += cpu_seconds(int(child))
    return total


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    """p50 / p99 of a phase's acks; None when fewer than two came (the innocent was stalled)."""
    if len(latencies) < 2:
        return {"acks": len(latencies), "p50_ms": None, "p99_ms": None}
    q = statistics.quantiles(latencies, n=100)
    return {"acks": len(latencies), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2)}


def median_ratio(ratios: list[float | None]) -> float | None:
    """The median over rounds; None if any round's innocent was stalled (fewer than two acks)."""
    return None if None in ratios or not ratios else round(statistics.median(r for r in ratios if r is not None), 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10,
                        help="each window's length; the pauses around a window (an attack's lead-in, 1 s, and the "
                        "settling after it, 2 s) are no longer than this")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="which phases, comma-separated")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of (quiet window, attack window) per attack; the ratio is the rounds' median")
    parser.add_argument("--attacker-nice", type=int, default=0,
                        help="niceness of the attacking processes: on a small machine their own CPU (TLS, sending "
                        "500 KB frames) competes with the broker's and the innocent's, as it would not from elsewhere")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16_384)), hard))  # the broker inherits it
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        # ACLs off: the attacks of issue 29 use the PLAINTEXT listener (ANONYMOUS), and logins come before ACLs
        secure = start_secure_broker(Path(tmp), ("SASL_SSL", "PLAINTEXT"), users={USER: PASSWORD},
                                     env={"ICELOG_AUTHORIZER_ENABLED": "false"})
        broker = secure.broker
        try:
            create_topic(secure.bootstrap("PLAINTEXT"), "attacked", 3)
            create_topic(secure.bootstrap("PLAINTEXT"), "innocent", 1)
            target = Target(secure.ports["PLAINTEXT"], secure.ports["SASL_SSL"], broker.registry_port,
                            str(secure.pki.ca_pem))
            auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism="SCRAM-SHA-512", user=USER, password=PASSWORD)
            pooled: dict[str, list[float]] = {}  # the innocent's latencies per phase, over every round
            pairs: dict[str, list[float | None]] = {}  # per attack: its p99 over the quiet window before it
            work: dict[str, int] = {}
            cpu: dict[str, dict[str, float]] = {}  # CPU seconds of the broker (the measured part) and the attacker
            assert broker.proc is not None
            broker_pid = broker.proc.pid
            attackers_cpu = children_cpu()
            # A check run's short windows (tests/system/test_benches.py) get pauses as short: at most the window.
            lead_in, settle = min(1.0, args.seconds), min(2.0, args.seconds)
            with InnocentProducer(secure.bootstrap("SASL_SSL"), "innocent", auth.librdkafka()) as innocent:

                def window(phase: str) -> list[float]:
                    """The innocent's ack latencies over one window of `phase` (an attack, or nothing)."""
                    stop = multiprocessing.Event()
                    result = multiprocessing.Value("q", -1)
                    attacker = None
                    if phase in ATTACKS:
                        attacker = multiprocessing.Process(target=_attack,
                                                           args=(phase, target, stop, result, args.attacker_nice))
                        attacker.start()
                        time.sleep(lead_in)  # the attack under way before measuring
                    start = time.monotonic()
                    broker_cpu, helpers = cpu_seconds(broker_pid), helpers_cpu(broker_pid)
                    time.sleep(args.seconds)
                    latencies = innocent.latencies_ms(start, time.monotonic())
                    spent = cpu.setdefault(phase, {"broker": 0.0, "login_and_validation": 0.0})
                    spent["broker"] = round(spent["broker"] + cpu_seconds(broker_pid) - broker_cpu, 2)
                    spent["login_and_validation"] = round(
                        spent["login_and_validation"] + helpers_cpu(broker_pid) - helpers, 2)
                    stop.set()
                    if attacker is not None:
                        nonlocal attackers_cpu
                        attacker.join(120)
                        work[phase] = work.get(phase, 0) + int(result.value)
                        spent["attacker"] = round(spent.get("attacker", 0) + children_cpu() - attackers_cpu, 2)
                        attackers_cpu = children_cpu()
                    time.sleep(settle)  # let the broker settle between windows
                    return latencies

                # Each attack's window right after a quiet window of its own: the ratio compares neighbours, so
                # the machine's drift over the run (other work, thermal, the store) cancels out; over --rounds
                # rounds, the median ratio.
                for round_ in range(args.rounds):
                    for attack in args.attacks.split(","):
                        print(f"round {round_ + 1}: baseline, then {attack}...", file=sys.stderr)
                        quiet, attacked = window("baseline"), window(attack)
                        pooled.setdefault("baseline", []).extend(quiet)
                        pooled.setdefault(attack, []).extend(attacked)
                        base, hit = percentiles(quiet)["p99_ms"], percentiles(attacked)["p99_ms"]
                        pairs.setdefault(attack, []).append(None if base is None or hit is None else hit / base)
            innocent_errors = [str(error) for error in innocent.errors]
            tracebacks = broker.log().count("Traceback")
        finally:
            broker.stop()
    phases = {phase: percentiles(latencies) for phase, latencies in pooled.items()}
    print(json.dumps({
        "machine": f"{platform.node()} {platform.machine()}",
        "load_average": os.getloadavg(),
        "attacker_nice": args.attacker_nice,
        "phases": phases,
        "attack_work": work,
        "cpu_seconds": cpu,
        "broker_log_tracebacks": tracebacks,
        "rounds": args.rounds,
        "p99_vs_baseline": {k: median_ratio(v) for k, v in pairs.items()},
        "p99_vs_baseline_each_round": {k: [None if r is None else round(r, 2) for r in v] for k, v in pairs.items()},
        "innocent_errors": innocent_errors[:5],
    }, indent=2))
    if innocent_errors:  # the figures are printed, but a failed delivery fails the run
        sys.exit(f"the innocent producer's deliveries failed: {innocent_errors[:3]}")


if __name__ == "__main__":
    main()
