"""Nobody who has not logged in can stall the broker (issue 42).

One SASL_SSL broker (SCRAM users, ACLs, its registry over HTTPS with basic auth, and a PLAINTEXT listener) takes
each attack of the issue while an authenticated confluent-kafka producer and consumer keep round-tripping records
on it; each test asserts what the attacker and the innocent clients see (closed connections, error codes, round
trips that keep completing, never how long they take), that the broker's descriptors and memory come back near
where they were, and that its log holds no traceback and no flood.
"""

from __future__ import annotations

import base64
import functools
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import SaslHandshakeRequest

from tests.support.clients_util import WAIT_S, recv_exactly, request_frame
from tests.support.hostile import (
    RoundTrips,
    closed_by_peer,
    connect,
    plain_token,
    sasl_login,
    scram_first,
)
from tests.support.proc import cpu_seconds, fd_count, rss_bytes
from tests.support.security import Auth, SecureBroker, start_secure_broker

pytestmark = pytest.mark.slow

USERS = {"admin": "admin-pw", "alice": "alice-pw"}
SETUP_TIMEOUT_MS = 5000  # connection_setup_timeout_ms of these brokers: the silent-client test waits for it
ANNOUNCED = 100 * 1024 * 1024  # the size an attacker announces and never sends
SASL_AUTHENTICATION_FAILED = 58
CLOSED = -1  # the broker closed the connection without an answer


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    broker = start_secure_broker(
        tmp_path_factory.mktemp("prelogin"), ("SASL_SSL", "PLAINTEXT"), users=USERS,
        env={"ICELOG_SUPER_USERS": "User:admin", "ICELOG_CONNECTION_SETUP_TIMEOUT_MS": str(SETUP_TIMEOUT_MS)},
    )
    yield broker
    broker.broker.stop()


def sasl_conf(secure: SecureBroker, user: str = "admin") -> dict[str, str]:
    auth = Auth("SASL_SSL", ca=secure.pki.ca_pem, mechanism="SCRAM-SHA-512", user=user, password=USERS[user])
    return {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **auth.librdkafka()}


def create_admin_topic(secure: SecureBroker, name: str) -> None:
    """A topic created by the super user (ACLs are on: the PLAINTEXT client is ANONYMOUS and may not)."""
    admin = AdminClient(sasl_conf(secure))
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(WAIT_S)


@pytest.fixture(scope="module")
def round_trips(secure: SecureBroker) -> Iterator[RoundTrips]:
    """The innocent clients, logged in before any attack and round-tripping through all of them."""
    create_admin_topic(secure, "innocent")
    with RoundTrips(sasl_conf(secure), "innocent") as trips:
        yield trips
    assert not trips.errors, trips.errors[:5]


@dataclass
class Before:
    """The broker's descriptors, memory and log before an attack."""

    pid: int
    fds: int
    rss: int
    log_at: int


def before(secure: SecureBroker) -> Before:
    assert secure.broker.proc is not None
    pid = secure.broker.proc.pid
    return Before(pid, fd_count(pid), rss_bytes(pid), len(secure.broker.log()))


def eventually(check: Callable[[], bool], within_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def assert_recovered(secure: SecureBroker, was: Before, fd_margin: int = 10, log_lines: int = 20) -> str:
    """Descriptors back near `was`, memory within 100 MiB of it, and the log since: no traceback, few and short
    lines. Returns that part of the log."""
    assert eventually(lambda: fd_count(was.pid) <= was.fds + fd_margin), (
        f"{fd_count(was.pid) - was.fds} descriptors more than before the attack")
    grown = rss_bytes(was.pid) - was.rss
    assert grown < 100 * 1024 * 1024, f"the broker grew by {grown >> 20} MiB"
    added = secure.broker.log()[was.log_at:]
    assert "Traceback" not in added, added[-3000:]
    lines = added.splitlines()
    assert len(lines) <= log_lines, "\n".join(lines[:40])
    assert all(len(line) < 1000 for line in lines), max(lines, key=len)[:2000]
    return added


def logged(secure: SecureBroker, was: Before, text: str) -> bool:
    """Whether `text` reaches the log since `was` (a counted line is written within its interval, 10 s)."""
    return eventually(lambda: text in secure.broker.log()[was.log_at:], 20)


def keeps_round_tripping(trips: RoundTrips, attack_running: Callable[[], bool], rounds: int = 3) -> None:
    """`rounds` more round trips complete while the attack runs."""
    target = trips.completed + rounds
    assert trips.wait_for(target, 120), f"round trips stalled at {trips.completed}: {trips.errors[-3:]}"
    assert attack_running(), "the attack ended before the round trips were checked"


def test_announced_sizes_hold_nothing(secure: SecureBroker, round_trips: RoundTrips) -> None:
    """Two connections per listener announce a 100 MB request and send nothing more. Before the login the size is
    over sasl.server.max.receive.size: the SASL_SSL ones are closed at once. On PLAINTEXT they stay open, holding
    nothing of queued.max.request.bytes: round trips and a new client's ApiVersions are served meanwhile."""
    was = before(secure)
    plain = [connect(secure.ports["PLAINTEXT"]) for _ in range(2)]
    tls = [connect(secure.ports["SASL_SSL"], secure.pki.ca_pem) for _ in range(2)]
    over_cap = connect(secure.ports["SASL_SSL"], secure.pki.ca_pem)
    for sock in (*plain, *tls):
        sock.sendall(struct.pack(">i", ANNOUNCED))
    over_cap.sendall(struct.pack(">i", 524288 + 1))  # one byte over Kafka's default cap
    assert all(closed_by_peer(sock, WAIT_S) for sock in (*tls, over_cap)), "an oversized frame before login was read"
    keeps_round_tripping(round_trips, lambda: not any(closed_by_peer(s, 0.01) for s in plain))
    with socket.create_connection(("127.0.0.1", secure.ports["PLAINTEXT"]), timeout=WAIT_S) as fresh:
        fresh.sendall(request_frame(ApiVersionsRequest(), 0, 7))
        size = struct.unpack(">i", recv_exactly(fresh, 4))[0]
        assert struct.unpack(">i", recv_exactly(fresh, size)[:4])[0] == 7  # answered
    for sock in (*plain, *tls, over_cap):
        sock.close()
    assert_recovered(secure, was)
    assert logged(secure, was, "sasl.server.max.receive.size=524288")


def test_clients_that_do_not_log_in_are_closed(secure: SecureBroker, round_trips: RoundTrips) -> None:
    """A TCP connection that never starts TLS, a TLS one that says nothing, and one that stops after the SASL
    handshake are each closed once connection_setup_timeout_ms has passed; round trips go on meanwhile."""
    was = before(secure)
    silent_tcp = socket.create_connection(("127.0.0.1", secure.ports["SASL_SSL"]), timeout=WAIT_S)
    silent_tls = connect(secure.ports["SASL_SSL"], secure.pki.ca_pem)
    halfway = connect(secure.ports["SASL_SSL"], secure.pki.ca_pem)
    halfway.sendall(request_frame(ApiVersionsRequest(), 0, 1))
    size = struct.unpack(">i", recv_exactly(halfway, 4))[0]
    recv_exactly(halfway, size)
    halfway.sendall(request_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1, 2))
    size = struct.unpack(">i", recv_exactly(halfway, 4))[0]
    recv_exactly(halfway, size)
    sockets = (silent_tcp, silent_tls, halfway)
    keeps_round_tripping(round_trips, lambda: True, rounds=1)
    assert all(closed_by_peer(sock, SETUP_TIMEOUT_MS / 1000 + WAIT_S) for sock in sockets)
    for sock in sockets:
        sock.close()
    assert_recovered(secure, was)
    assert logged(secure, was, "did not log in within connection_setup_timeout_ms=5000")


def test_long_credentials_cost_no_work(secure: SecureBroker, round_trips: RoundTrips) -> None:
    """Logins with credentials longer than any can be, from 6 connections at once, again and again: a PLAIN token
    or a SCRAM client-first of ~500 KB (under sasl.server.max.receive.size, over what the chosen mechanism's tokens
    take) closes the connection unread; a 1,025-character password (for a user that exists and one that does not),
    a 300-character SCRAM user name and a 3,000-byte SCRAM message are read and refused with
    SASL_AUTHENTICATION_FAILED, without the work their length once cost (saslprep and PBKDF2 over a 1 MB password
    were 6-7 s of CPU). Round trips go on meanwhile."""
    was = before(secure)
    cpu_before = cpu_seconds(was.pid)
    huge = "x" * 500_000
    attempts = [
        ("PLAIN", plain_token("admin", huge), CLOSED), ("SCRAM-SHA-512", scram_first(huge), CLOSED),
        ("PLAIN", plain_token("admin", "p" * 1025), SASL_AUTHENTICATION_FAILED),
        ("PLAIN", plain_token("nobody", "p" * 1025), SASL_AUTHENTICATION_FAILED),
        ("SCRAM-SHA-512", scram_first("u" * 300), SASL_AUTHENTICATION_FAILED),
        ("SCRAM-SHA-512", scram_first("admin") + b",x=" + b"y" * 3000, SASL_AUTHENTICATION_FAILED),
    ]
    answers: list[tuple[int, int]] = []  # (expected, got)
    running = threading.Event()

    def attack() -> None:
        for mechanism, token, expected in attempts:
            with connect(secure.ports["SASL_SSL"], secure.pki.ca_pem, timeout=60) as sock:
                try:
                    code, _ = sasl_login(sock, mechanism, token)
                except OSError:  # closed while we sent, or before answering
                    code = CLOSED
                answers.append((expected, code))

    running.set()
    errors: list[BaseException] = []
    pool = ThreadPoolExecutor(6)
    futures = [pool.submit(_repeat_until, attack, running, errors) for _ in range(6)]
    try:
        keeps_round_tripping(round_trips, running.is_set)
        assert eventually(lambda: len(answers) >= 60, 120), f"only {len(answers)} attempts were answered"
    finally:
        running.clear()
        for future in futures:
            future.result(120)
        pool.shutdown()
    assert not errors, errors[:3]
    assert all(expected == got for expected, got in answers), sorted(set(answers))
    used = cpu_seconds(was.pid) - cpu_before
    # 60+ logins of up to 500 KB each once cost seconds each; now the TLS handshakes are most of it
    assert used < 0.2 * len(answers) + 10, f"{used:.1f} s of broker CPU for {len(answers)} logins"
    assert_recovered(secure, was)
    assert logged(secure, was, "the chosen SASL mechanism's tokens take")  # counted, not one line each


def _repeat_until(attack: Callable[[], None], running: threading.Event, errors: list[BaseException]) -> None:
    while running.is_set():
        try:
            attack()
        except Exception as exc:
            errors.append(exc)
            return


def _basic(user: str, password: str) -> dict[str, str]:
    """An Authorization header in UTF-8, as Confluent's clients send it (requests' `auth=` encodes Latin-1)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_registry_login_flood(secure: SecureBroker, round_trips: RoundTrips) -> None:
    """20 threads send registry requests with wrong passwords (6 KB, or 1,000 non-ASCII characters: the longest
    a check derives keys for): each gets 401 (40101) after Kafka's 100 ms failure delay until the address has
    failed 20 times, then 429 (42901) with Retry-After, unchecked, after that wait, and one check a second gets
    through; the checks run off the threads that serve Fetch, so round trips go on. A user who logged in from
    the address before the flood is served during it; one who had not is served once Retry-After has passed;
    the wrong passwords are in no log line."""
    was = before(secure)
    url = f"https://127.0.0.1:{secure.broker.registry_port}/subjects"
    ca = str(secure.pki.ca_pem)
    assert requests.get(url, auth=("alice", USERS["alice"]), verify=ca, timeout=60).status_code == 200
    wrongs = ["w" * 6000, "\u00e9" * 1000]
    answers: list[tuple[int, int, str | None, float]] = []
    running = threading.Event()
    running.set()
    errors: list[BaseException] = []

    def attack(wrong: str) -> None:
        with requests.Session() as session:
            started = time.monotonic()
            reply = session.get(url, headers=_basic("alice", wrong), verify=ca, timeout=60)
            answers.append((reply.status_code, reply.json()["error_code"], reply.headers.get("Retry-After"),
                            time.monotonic() - started))

    flood_started = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(_repeat_until, functools.partial(attack, wrongs[i % 2]), running, errors)
                   for i in range(20)]
        try:
            keeps_round_tripping(round_trips, running.is_set)
            assert eventually(lambda: sum(a[0] == 429 for a in answers) >= 60, 120), f"{len(answers)} answers"
            during = requests.get(url, auth=("alice", USERS["alice"]), verify=ca, timeout=60)
            assert during.status_code == 200, during.text
        finally:
            running.clear()
            for future in futures:
                future.result(120)
    flood_s = time.monotonic() - flood_started
    assert not errors, errors[:3]
    assert {(status, code) for status, code, _, _ in answers} == {(401, 40101), (429, 42901)}
    assert min(took for _, _, _, took in answers) >= 0.1  # connection.failed.authentication.delay.ms
    checked = sum(status == 401 for status, _, _, _ in answers)
    assert checked <= 20 + flood_s + 5, f"{checked} checks in {flood_s:.0f} s"  # the burst, then about one a second
    assert all(int(retry) >= 1 for status, _, retry, _ in answers if status == 429 and retry is not None)
    assert all(retry is not None for status, _, retry, _ in answers if status == 429)
    ok = _after_retry(url, ("admin", USERS["admin"]), ca)
    assert ok.status_code == 200, ok.text
    added = assert_recovered(secure, was, fd_margin=25)
    for wrong in wrongs:
        assert wrong[:100] not in added and _basic("alice", wrong)["Authorization"][6:46] not in added


def _after_retry(url: str, auth: tuple[str, str], ca: str) -> requests.Response:
    """A request that waits out 429s as Retry-After says (Confluent's clients retry 429), at most 5 times."""
    for _ in range(5):
        reply = requests.get(url, auth=auth, verify=ca, timeout=60)
        if reply.status_code != 429:
            return reply
        time.sleep(int(reply.headers["Retry-After"]))
    return reply


@pytest.mark.parametrize("server", ["registry", "metrics"])
def test_oversized_http_requests_log_one_line(secure: SecureBroker, server: str) -> None:
    """9 KB URLs and header lines, 40 of each: 400 for each, and at most a line or two in the log (counted), no
    traceback."""
    was = before(secure)
    port = secure.broker.registry_port if server == "registry" else secure.broker.metrics_port
    base = f"https://127.0.0.1:{port}"
    for _ in range(40):
        long_url = requests.get(base + "/" + "u" * 9000, verify=str(secure.pki.ca_pem), timeout=60)
        long_header = requests.get(base + "/healthz", headers={"X-Filler": "h" * 9000},
                                   verify=str(secure.pki.ca_pem), timeout=60)
        assert (long_url.status_code, long_header.status_code) == (400, 400)
    assert_recovered(secure, was, log_lines=3, fd_margin=25)
    assert logged(secure, was, "bad HTTP requests")


# Confluent's codes for every malformed id, version and subject, whoever asks (issue 42: the secured registry
# once handed an id that overflows SQLite's integers to the store first and answered 500).
MALFORMED: list[tuple[str, str, int]] = [
    ("GET", "/schemas/ids/99999999999999999999999", 40403),
    ("GET", "/schemas/ids/99999999999999999999999/versions", 40403),
    ("GET", "/schemas/ids/99999999999999999999999/subjects", 40403),
    ("GET", "/schemas/ids/99999999999999999999999/schema", 40403),
    ("GET", "/schemas/ids/-1", 40403),
    ("GET", "/schemas/ids/0", 40403),
    ("GET", "/schemas/ids/1e3", 40403),
    ("GET", "/schemas/ids/%C2%B2", 40403),
    ("GET", "/subjects/orders-value/versions/99999999999999999999", 42202),
    ("GET", "/subjects/orders-value/versions/-2", 42202),
    ("GET", "/subjects/orders-value/versions/%C2%B2/schema", 42202),
    ("DELETE", "/subjects/orders-value/versions/abc", 42202),
    ("GET", "/subjects/%ED%A0%80/versions", 40401),
    ("GET", "/subjects/a%00b/versions/1", 40401),
    ("GET", "/subjects/" + "s" * 4000 + "/versions/latest", 40401),
    ("GET", "/config/%ED%A0%80", 40408),
]


@pytest.mark.parametrize("who", ["admin", "alice", "nobody"])
def test_registry_answers_4xx_to_malformed_paths(secure: SecureBroker, who: str) -> None:
    """The super user gets Confluent's 404 / 422 codes; alice (no ACL on these subjects) gets 40403 for ids (as
    for any id) and 403 for subjects; without credentials, 401. Never a 500, never a traceback."""
    was = before(secure)
    base = f"https://127.0.0.1:{secure.broker.registry_port}"
    auth = None if who == "nobody" else (who, USERS[who])
    for method, path, code in MALFORMED:
        reply = requests.request(method, base + path, auth=auth, verify=str(secure.pki.ca_pem), timeout=60)
        expected = code if who == "admin" or path.startswith("/schemas/ids/") else 40301
        if who == "nobody":
            expected = 40101
        assert (reply.status_code, reply.json()["error_code"]) == (expected // 100, expected), (path, reply.text)
    assert_recovered(secure, was, log_lines=2, fd_margin=25)


def _low_descriptor_limit() -> None:  # in the broker's child process, before icelog starts
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1536))


def test_descriptor_flood_is_refused_and_counted(tmp_path: Path) -> None:
    """A broker whose descriptor limit is 1,536 (raised from a soft 1,024 at start-up) takes 1,300 idle TCP
    connections to its SASL_SSL port: those past its default max.connections are closed at once and counted in
    one log line per interval; /healthz, the registry and logged-in clients are served throughout; every
    descriptor is given back once the attacker leaves."""
    secure = start_secure_broker(
        tmp_path, ("SASL_SSL", "PLAINTEXT"), users=USERS, preexec_fn=_low_descriptor_limit,
        env={"ICELOG_SUPER_USERS": "User:admin", "ICELOG_CONNECTION_SETUP_TIMEOUT_MS": "60000"},
    )
    try:
        create_admin_topic(secure, "innocent")
        with RoundTrips(sasl_conf(secure), "innocent") as trips:
            was = before(secure)
            assert "descriptor limit 1536" in secure.broker.log()
            flood: list[socket.socket] = []
            try:
                for _ in range(1300):
                    flood.append(socket.create_connection(("127.0.0.1", secure.ports["SASL_SSL"]), timeout=WAIT_S))
                assert eventually(lambda: sum(closed_by_peer(s, 0) for s in flood[-50:]) >= 40), (
                    "connections past max.connections were not closed")
                assert fd_count(was.pid) < 1536 - 100, "the flood took the descriptors kept for the broker"
                health = requests.get(f"https://127.0.0.1:{secure.broker.metrics_port}/healthz",
                                      verify=str(secure.pki.ca_pem), timeout=WAIT_S)
                assert health.status_code == 200
                registry = requests.get(f"https://127.0.0.1:{secure.broker.registry_port}/subjects",
                                        auth=("admin", USERS["admin"]), verify=str(secure.pki.ca_pem), timeout=WAIT_S)
                assert registry.status_code == 200
                keeps_round_tripping(trips, lambda: True)
            finally:
                for sock in flood:
                    sock.close()
            added = assert_recovered(secure, was, log_lines=4)
        refusals = [line for line in added.splitlines() if "refused Kafka connections" in line]
        assert 1 <= len(refusals) <= 3 and "max.connections=" in refusals[0]
    finally:
        secure.broker.stop()
