"""Where credential checks run: never on the threads that serve Fetch and Produce, bounded in number, and a few at
a time per client.

A password check (PLAIN, and the registry's HTTP basic auth) derives SCRAM keys from the password: SASLprep in
Python and PBKDF2. It runs in a login process of its own at niceness 10, as the validation process checks big
records (wire/validator.py): a thread would hold the GIL the event loop needs, and six 1 MB passwords once took an
authenticated consumer's fetch from 4 ms to 30 s through asyncio's default pool (issue 42). The other steps (store
reads, SCRAM's proofs, OAUTHBEARER's signatures: short, bounded messages) run on a small thread pool of their own.
Each client address has at most `per_client` checks under way; its others wait their turn, so one client cannot
take every check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import threading
import time
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
T = TypeVar("T")


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
        process. False at once for a user name or password longer than any credential can have."""
        if not plain_acceptable(user, password):
            return False
        credentials = await self.in_thread(plain_candidates, store, user)
        params = [(c.mechanism, c.salt, c.iterations) for c in credentials]
        try:
            keys = await asyncio.get_running_loop().run_in_executor(self._executor(), derive_keys, password, params)
        except BrokenProcessPool:
            self._process = None  # the next check starts a new one
            log.warning("the login process died; a new one starts with the next login")
            return False
        return keys_match(credentials, keys)

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
