"""Where credential checks run: never on the threads that serve Fetch and Produce, bounded in number, and a few at
a time per client.

A password check (PLAIN, and the registry's HTTP basic auth) derives SCRAM keys from the password: SASLprep in
Python and PBKDF2. It runs in a login process of its own at niceness 10, as the validation process checks big
records (wire/validator.py): a thread would hold the GIL the event loop needs, and six 1 MB passwords once took an
authenticated consumer's fetch from 4 ms to 30 s through asyncio's default pool (issue 42). The other steps (store
reads, SCRAM's proofs, OAUTHBEARER's signatures: short, bounded messages) run on a small thread pool of their own.
Each client address has at most `per_client` checks under way; its others wait their turn, so one client cannot
take every check.

Derived keys are remembered (`DERIVED_KEYS_KEPT` of them, keyed by an HMAC of the password under a secret of this
process, the salt and the iteration count): the registry's clients send the same basic-auth password with every
request, and an attacker repeating a wrong one once cost the login process half a core and the broker's threads a
hop through the process pool each time (issue 42). A changed credential has a new salt, so nothing remembered
outlives it. `FailedLoginLimit` bounds the failed HTTP logins of one client address.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import math
import multiprocessing
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TypeVar

from icelog.meta.security import SecurityStore
from icelog.security.credentials import derive_keys, keys_match, plain_acceptable, plain_candidates

log = logging.getLogger(__name__)

LOGIN_THREADS = 2  # store reads, SCRAM steps, token signatures
LOGINS_PER_CLIENT = 2  # checks under way per client address
LOGIN_NICE = 10  # the login process's niceness: served clients get the CPU first, logins still get a share
DERIVED_KEYS_KEPT = 4096  # derivations remembered (a few hundred bytes each)
GOOD_LOGINS_KEPT = 1024  # (user, password) pairs that logged in, remembered to pass a limited address's turn
FAILED_LOGIN_BURST = 20  # failed HTTP logins a client address may have at once ...
FAILED_LOGINS_PER_S = 1.0  # ... and one more each second after that
FAILED_LOGIN_ADDRESSES = 10_000  # addresses whose failures are counted at once (the longest untouched go first)
_NOT_DERIVED = object()
T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def _login_process_start(parent: int) -> None:
    """In the login process: lower its priority, and end it when the broker is gone (a SIGKILLed broker leaves
    it waiting on a pipe it holds both ends of)."""
    os.nice(LOGIN_NICE)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass
class _Turns:
    semaphore: asyncio.Semaphore
    users: int = 0


class LoginChecks:
    """The broker's login work: `turn` (per client), `in_thread`, and `password` (the login process)."""

    def __init__(self, per_client: int = LOGINS_PER_CLIENT) -> None:
        self._threads = ThreadPoolExecutor(LOGIN_THREADS, thread_name_prefix="login")
        self._process: ProcessPoolExecutor | None = None
        self._per_client = per_client
        self._turns: dict[str, _Turns] = {}
        self._secret = secrets.token_bytes(32)  # keys the remembered passwords' HMACs: never leaves the process
        self._derived: OrderedDict[tuple[bytes, str, bytes, int], tuple[bytes, bytes] | None] = OrderedDict()
        self._good: OrderedDict[bytes, None] = OrderedDict()

    @contextlib.asynccontextmanager
    async def turn(self, client: str) -> AsyncIterator[None]:
        """Held while one check of `client` (an address) is under way; at most `per_client` at once."""
        turns = self._turns.get(client)
        if turns is None:
            turns = self._turns[client] = _Turns(asyncio.Semaphore(self._per_client))
        turns.users += 1
        try:
            async with turns.semaphore:
                yield
        finally:
            turns.users -= 1
            if not turns.users:
                del self._turns[client]

    async def in_thread(self, func: Callable[..., T], *args: object) -> T:
        """func(*args) on a login thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(func, *args))

    async def password(self, store: SecurityStore, user: str, password: str) -> bool:
        """Whether `password` is the user's (credentials.check_plain's answer), the keys derived in the login
        process unless this password was derived for the same salt before. False at once for a user name or
        password longer than any credential can have."""
        if not plain_acceptable(user, password):
            return False
        credentials = await self.in_thread(plain_candidates, store, user)
        tag = self._tag(password)
        keys: list[tuple[bytes, bytes]] | None = []
        for credential in credentials:
            key = (tag, credential.mechanism, credential.salt, credential.iterations)
            known = self._derived.get(key, _NOT_DERIVED)
            if known is _NOT_DERIVED:
                keys = await self._derive(tag, password, [(c.mechanism, c.salt, c.iterations) for c in credentials])
                break
            self._derived.move_to_end(key)
            if known is None:  # SASLprep refused the password: it matches nothing
                keys = None
                break
            assert keys is not None and isinstance(known, tuple)
            keys.append(known)
        matched = keys_match(credentials, keys)
        if matched:
            self._remember(self._good, self._pair_tag(user, password), None, GOOD_LOGINS_KEPT)
        else:
            self._good.pop(self._pair_tag(user, password), None)
        return matched

    def logged_in_before(self, user: str, password: str) -> bool:
        """Whether this user logged in with this password lately (and has not failed with it since): such a login
        is let through a limited address's turn (FailedLoginLimit), still checked in full."""
        return self._pair_tag(user, password) in self._good

    def _pair_tag(self, user: str, password: str) -> bytes:
        return self._tag(f"{len(user)}:{user}{password}")

    def _tag(self, text: str) -> bytes:
        return hmac.new(self._secret, text.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    async def _derive(self, tag: bytes, password: str,
                      params: list[tuple[str, bytes, int]]) -> list[tuple[bytes, bytes]] | None:
        try:
            keys = await asyncio.get_running_loop().run_in_executor(self._executor(), derive_keys, password, params)
        except BrokenProcessPool:
            self._process = None  # the next check starts a new one
            log.warning("the login process died; a new one starts with the next login")
            return None
        for i, (mechanism, salt, iterations) in enumerate(params):
            self._remember(self._derived, (tag, mechanism, salt, iterations),
                           None if keys is None else keys[i], DERIVED_KEYS_KEPT)
        return keys

    @staticmethod
    def _remember(kept: OrderedDict[K, V], key: K, value: V, most: int) -> None:
        kept[key] = value
        kept.move_to_end(key)
        while len(kept) > most:
            kept.popitem(last=False)

    def warm(self) -> None:
        """Start the login process now rather than at the first password check (a spawn takes a second)."""
        self._executor().submit(os.getpid)

    def _executor(self) -> ProcessPoolExecutor:
        if self._process is None:
            # spawn: forking a process that runs threads (the intake writer, the event loop's) is unsafe.
            self._process = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=_login_process_start, initargs=(os.getpid(),),
            )
        return self._process

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._process is not None:
            self._process.shutdown(wait=False, cancel_futures=True)
            self._process = None


@dataclass
class _Bucket:
    tokens: float
    at: float


class FailedLoginLimit:
    """Failed logins per client address, as a token bucket: `burst` at once, then `per_second`. A check takes a
    token before it starts (so checks that run at once cannot overdraw it) and a login that succeeds gives it
    back; while an address has none left, `take` says how long until it has one (the registry answers 429
    without checking)."""

    def __init__(self, burst: int = FAILED_LOGIN_BURST, per_second: float = FAILED_LOGINS_PER_S,
                 addresses: int = FAILED_LOGIN_ADDRESSES, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._rate = per_second
        self._most = addresses
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _tokens(self, bucket: _Bucket | None, now: float) -> float:
        return self._burst if bucket is None else min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)

    def take(self, client: str) -> float:
        """0 if `client` may have a login checked now (a token taken), else the seconds until it may."""
        now = self._clock()
        tokens = self._tokens(self._buckets.get(client), now)
        if tokens < 1:
            return (1 - tokens) / self._rate
        self._set(client, tokens - 1, now)
        return 0.0

    def failed(self, client: str) -> None:
        """A failed login of `client` that took no token (one let through as logged in before)."""
        now = self._clock()
        self._set(client, max(0.0, self._tokens(self._buckets.get(client), now) - 1), now)

    def give_back(self, client: str) -> None:
        """The token of a login that succeeded."""
        now = self._clock()
        tokens = self._tokens(self._buckets.get(client), now) + 1
        if tokens >= self._burst:
            self._buckets.pop(client, None)
        else:
            self._set(client, tokens, now)

    def _set(self, client: str, tokens: float, now: float) -> None:
        self._buckets.pop(client, None)
        self._buckets[client] = _Bucket(tokens, now)  # the most recent last
        if len(self._buckets) > self._most:  # the address longest untouched forgets its failures
            self._buckets.popitem(last=False)

    @staticmethod
    def header(seconds: float) -> str:
        """A Retry-After value (whole seconds, at least 1) for `seconds`."""
        return str(max(1, math.ceil(seconds)))
