"""Security benchmark: what TLS + SASL costs a producer, and what a new connection's login costs.

Run: .venv/bin/python bench/security_bench.py [--records 200000] [--rounds 2] [--connections 200]

One broker serves PLAINTEXT and SASL_SSL (SCRAM-SHA-512) at once, with ACLs on (allow_everyone_if_no_acl_found,
so both listeners pass through the authorizer). In one run, alternated so drift on this shared machine hits both
alike: confluent-kafka's produce throughput (acks=all, lz4, 1 KiB records) and its ack latency at a steady rate, on
each listener; then `--connections` sequential new connections on each: TCP + ApiVersions on PLAINTEXT against
TLS handshake + SaslHandshake + SCRAM-SHA-512 exchange on SASL_SSL (the client's key derivation included, as every
client pays it). Targets (issue 30): throughput SASL_SSL / PLAINTEXT >= 0.8, ack p99 <= 1.3x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import scramp
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, bench
from bench.broker_bench import ack_latency, produce_throughput  # noqa: E402
from tests.support.clients_util import recv_exactly, request_frame  # noqa: E402
from tests.support.security import Auth, start_secure_broker  # noqa: E402

USER, PASSWORD = "bench", "bench-password"


def _answer(sock: socket.socket | ssl.SSLSocket) -> bytes:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]  # type: ignore[arg-type]
    return recv_exactly(sock, size)  # type: ignore[arg-type]


def _auth_bytes(payload: bytes) -> bytes:
    """SaslAuthenticate v1's response body after the correlation id: error, message, auth bytes."""
    error, = struct.unpack_from(">h", payload, 4)
    if error:
        raise RuntimeError(f"SASL authentication failed with error {error}")
    message_len, = struct.unpack_from(">h", payload, 6)
    position = 8 + max(message_len, 0)
    size, = struct.unpack_from(">i", payload, position)
    return payload[position + 4:position + 4 + size]


def plain_connect(port: int) -> float:
    """Seconds from connect() to an answered ApiVersions on PLAINTEXT."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_frame(ApiVersionsRequest(), 0, 1))
        _answer(sock)
    return time.perf_counter() - started


def scram_connect(port: int, context: ssl.SSLContext) -> float:
    """Seconds from connect() to a completed SCRAM-SHA-512 login over TLS (as a client does before its first
    request: handshake, SaslHandshake, client-first, client-final, server signature checked)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), 1, 1))
        _answer(sock)
        client = scramp.ScramClient(["SCRAM-SHA-512"], USER, PASSWORD)
        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=client.get_client_first().encode()), 1, 2))
        client.set_server_first(_auth_bytes(_answer(sock)).decode())
        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=client.get_client_final().encode()), 1, 3))
        client.set_server_final(_auth_bytes(_answer(sock)).decode())
    return time.perf_counter() - started


def percentiles(seconds: list[float]) -> dict[str, float]:
    q = statistics.quantiles(seconds, n=100)
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2, help="alternated produce runs per listener")
    parser.add_argument("--latency-seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="icelog-security-bench-") as tmp:
        secure = start_secure_broker(
            Path(tmp), ("SASL_SSL", "PLAINTEXT"), users={USER: PASSWORD},
            env={"ICELOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true", "ICELOG_INTAKE__FSYNC": "true"},
        )
        try:
            auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism="SCRAM-SHA-512", user=USER, password=PASSWORD)
            confs = {
                "PLAINTEXT": {"bootstrap.servers": secure.bootstrap("PLAINTEXT")},
                "SASL_SSL": {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **auth.librdkafka()},
            }
            admin = AdminClient(confs["PLAINTEXT"])
            for name in ("bench-plain", "bench-sasl"):
                admin.create_topics([NewTopic(name, 6, 1)])[name].result(30)
            topics = {"PLAINTEXT": "bench-plain", "SASL_SSL": "bench-sasl"}
            throughput: dict[str, list[float]] = {p: [] for p in confs}
            p99: dict[str, list[float]] = {p: [] for p in confs}
            for round_ in range(args.rounds):
                order = ("PLAINTEXT", "SASL_SSL") if round_ % 2 == 0 else ("SASL_SSL", "PLAINTEXT")
                for protocol in order:
                    print(f"round {round_ + 1}: produce on {protocol}", file=sys.stderr, flush=True)
                    result = produce_throughput("", topics[protocol], args.records, conf=confs[protocol])
                    throughput[protocol].append(result["mb_per_s"])
                for protocol in order:
                    latency = ack_latency("", topics[protocol], 5.0, args.latency_seconds, conf=confs[protocol])
                    p99[protocol].append(latency["p99_ms"])
            context = ssl.create_default_context(cafile=str(secure.pki.ca_pem))
            setups: dict[str, list[float]] = {"PLAINTEXT": [], "SASL_SSL": []}
            for i in range(args.connections):  # alternated, one of each at a time
                setups["PLAINTEXT"].append(plain_connect(secure.ports["PLAINTEXT"]))
                setups["SASL_SSL"].append(scram_connect(secure.ports["SASL_SSL"], context))
                if i % 50 == 0:
                    print(f"  connections {i}/{args.connections}", file=sys.stderr, flush=True)
        finally:
            secure.broker.stop()
    median = {p: statistics.median(v) for p, v in throughput.items()}
    med_p99 = {p: statistics.median(v) for p, v in p99.items()}
    result = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "records": args.records, "rounds": args.rounds,
        "produce_mb_per_s": throughput, "ack_p99_ms": p99,
        "throughput_ratio": median["SASL_SSL"] / median["PLAINTEXT"],
        "ack_p99_ratio": med_p99["SASL_SSL"] / med_p99["PLAINTEXT"],
        "connection_setup": {p: percentiles(v) for p, v in setups.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
