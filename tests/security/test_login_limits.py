"""What a password check costs when it is repeated, and how many failed logins an address may have (issue 42:
20 registry clients repeating a wrong password kept the login process half a core busy and the broker's threads
hopping through the process pool, and slowed an innocent producer's acks 3x)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from icelog.meta.security import ScramCredential
from icelog.security import logins as logins_module
from icelog.security.credentials import SCRAM_MECHANISMS, derive_keys, make_credential
from icelog.security.logins import FailedLoginLimit, LoginChecks


class Users:
    """A SecurityStore with just what a PLAIN check reads."""

    def __init__(self) -> None:
        self.credentials: dict[str, list[ScramCredential]] = {}

    def set(self, user: str, password: str) -> None:
        self.credentials[user] = [make_credential(user, m, password) for m in SCRAM_MECHANISMS]

    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        return list(self.credentials.get(user or "", []))


@pytest.fixture
def derivations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The passwords whose keys were derived, in order (derived on a thread here, not in the login process)."""
    derived: list[str] = []

    def counting(password: str, params: list[tuple[str, bytes, int]]) -> list[tuple[bytes, bytes]] | None:
        derived.append(password)
        return derive_keys(password, params)

    pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(logins_module, "derive_keys", counting)
    monkeypatch.setattr(LoginChecks, "_executor", lambda self: pool)
    yield derived
    pool.shutdown()


def check(checks: LoginChecks, users: Users, user: str, password: str) -> bool:
    return asyncio.run(checks.password(users, user, password))


def test_a_repeated_password_is_derived_once(derivations: list[str]) -> None:
    users, checks = Users(), LoginChecks()
    users.set("alice", "alice-pw")
    try:
        assert [check(checks, users, "alice", "wrong") for _ in range(5)] == [False] * 5
        assert [check(checks, users, "alice", "alice-pw") for _ in range(5)] == [True] * 5
        assert [check(checks, users, "nobody", "wrong") for _ in range(3)] == [False] * 3  # decoys: same salt
        assert [check(checks, users, "alice", "\u0007bell") for _ in range(3)] == [False] * 3  # SASLprep refuses
        assert derivations == ["wrong", "alice-pw", "wrong", "\u0007bell"]
    finally:
        checks.close()


def test_a_changed_password_is_checked_anew(derivations: list[str]) -> None:
    """A new credential has a new salt: what was derived for the old one no longer answers."""
    users, checks = Users(), LoginChecks()
    users.set("alice", "old-pw")
    try:
        assert check(checks, users, "alice", "old-pw") and checks.logged_in_before("alice", "old-pw")
        users.set("alice", "new-pw")
        assert not check(checks, users, "alice", "old-pw")
        assert not checks.logged_in_before("alice", "old-pw")
        assert check(checks, users, "alice", "new-pw")
        assert not checks.logged_in_before("bob", "new-pw")
        assert derivations == ["old-pw", "old-pw", "new-pw"]
        del users.credentials["alice"]
        assert not check(checks, users, "alice", "new-pw")  # a deleted user: decoys, whatever was remembered
    finally:
        checks.close()


def test_remembered_derivations_are_bounded(derivations: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logins_module, "DERIVED_KEYS_KEPT", 4)
    users, checks = Users(), LoginChecks()
    users.set("alice", "alice-pw")
    try:
        for password in ("a", "b", "c", "a"):  # two keys each (both mechanisms): "a" was forgotten
            check(checks, users, "alice", password)
        assert derivations == ["a", "b", "c", "a"]
        assert len(checks._derived) == 4
    finally:
        checks.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_per_address_are_a_token_bucket() -> None:
    clock = Clock()
    limit = FailedLoginLimit(burst=3, per_second=0.5, clock=clock)
    assert [limit.take("10.0.0.1") for _ in range(3)] == [0, 0, 0]
    assert limit.take("10.0.0.1") == pytest.approx(2.0)  # one token every 2 s
    assert limit.take("10.0.0.2") == 0  # another address has its own
    clock.now += 1.5
    assert limit.take("10.0.0.1") == pytest.approx(0.5)
    clock.now += 0.5
    assert limit.take("10.0.0.1") == 0
    assert limit.take("10.0.0.1") == pytest.approx(2.0)
    assert FailedLoginLimit.header(0.2) == "1" and FailedLoginLimit.header(2.0) == "2"


def test_a_login_that_succeeds_gives_its_token_back() -> None:
    clock = Clock()
    limit = FailedLoginLimit(burst=2, per_second=1, clock=clock)
    for _ in range(10):  # a client that logs in right every time is never limited
        assert limit.take("10.0.0.1") == 0
        limit.give_back("10.0.0.1")
    assert not limit._buckets  # a full bucket is not kept
    limit.failed("10.0.0.1")
    limit.failed("10.0.0.1")
    limit.failed("10.0.0.1")  # never below empty: one second brings a token back
    clock.now += 1
    assert limit.take("10.0.0.1") == 0


def test_the_addresses_counted_are_bounded() -> None:
    clock = Clock()
    limit = FailedLoginLimit(burst=1, per_second=0.001, addresses=100, clock=clock)
    for i in range(1000):
        limit.take(f"10.0.{i // 256}.{i % 256}")
    assert len(limit._buckets) == 100
    assert limit.take("10.0.3.231") > 0  # the most recent are kept
    assert limit.take("10.0.0.0") == 0  # the longest untouched forgot its failures


# The registry's side (schema/registry/access.py), over HTTP without TLS: a wrong password is refused with 401 until
# the address has failed `burst` times, then with 429 and Retry-After, unchecked; a user who logged in before passes.


async def _registry_answers(users: Users, checks: LoginChecks, asks: list[tuple[str, str]],
                            clock: Clock) -> list[tuple[int, int | None, str | None]]:
    from aiohttp import BasicAuth, web
    from aiohttp.test_utils import TestClient, TestServer

    from icelog.schema.registry.access import RegistryAccess

    limit = FailedLoginLimit(burst=2, per_second=0.5, clock=clock)
    access = RegistryAccess(users, [], None, lambda _id: [], checks, failure_delay_ms=1, failures=limit)

    async def subjects(_request: web.Request) -> web.Response:
        return web.json_response([])

    app = web.Application(middlewares=[access.middleware])
    app.router.add_get("/subjects", subjects)
    answers = []
    async with TestClient(TestServer(app)) as client:
        for user, password in asks:
            reply = await client.get("/subjects", auth=BasicAuth(user, password))
            body = await reply.json()
            answers.append((reply.status, body.get("error_code") if isinstance(body, dict) else None,
                            reply.headers.get("Retry-After")))
    access.close()
    return answers


def test_registry_refuses_unchecked_past_the_limit(derivations: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:  # every sleep (the 429's wait among them) recorded, not waited
        waited.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr("icelog.schema.registry.access.asyncio.sleep", sleep)
    users, checks, clock = Users(), LoginChecks(), Clock()
    users.set("alice", "alice-pw")
    users.set("bob", "bob-pw")
    try:
        answers = asyncio.run(_registry_answers(users, checks, [
            ("alice", "alice-pw"),  # logs in: her token is given back
            ("mallory", "guess-1"), ("mallory", "guess-2"),  # the burst of 2
            ("mallory", "guess-3"),  # limited: 429, not checked
            ("alice", "alice-pw"),  # logged in before: served
            ("bob", "bob-pw"),  # never logged in: limited too
        ], clock))
    finally:
        checks.close()
    assert answers == [(200, None, None), (401, 40101, None), (401, 40101, None), (429, 42901, "2"),
                       (200, None, None), (429, 42901, "2")]
    assert "guess-3" not in derivations and "bob-pw" not in derivations
    assert max(waited) == pytest.approx(2.0)  # the 429 is answered when the address may try again


def test_the_limit_follows_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from icelog.config import Settings
    from icelog.schema.registry.server import registry_server

    monkeypatch.setenv("ICELOG_REGISTRY_FAILED_LOGINS_BURST", "3")
    monkeypatch.setenv("ICELOG_REGISTRY_FAILED_LOGINS_PER_SECOND", "0.25")
    settings = Settings(listeners="SASL_PLAINTEXT://127.0.0.1:9093")
    checks = LoginChecks()
    try:
        server = registry_server(settings, None, Users(), None, checks, 16)  # type: ignore[arg-type]
        assert server.access is not None
        limit = server.access._failures
        assert [limit.take("10.0.0.1") for _ in range(3)] == [0, 0, 0]
        assert 0 < limit.take("10.0.0.1") <= 4  # one try every 4 s
    finally:
        checks.close()
