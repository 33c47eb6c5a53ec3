"""queued.max.request.bytes: bytes of requests read or being handled, over all connections of a broker."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass


@dataclass
class _Waiter:
    size: int
    request: object
    started: bool  # the request already holds some of the budget
    granted: asyncio.Future[None]


class ByteBudget:
    """The budget a request's bytes are read into, taken piece by piece as they arrive.

    A reader takes budget for each piece of a request once the piece has arrived, so a client that announces a
    size and sends nothing holds none (two such clients once held 200 MiB for minutes and stalled every other,
    issue 42). A reader that would pass the bound waits, and stops reading its socket meanwhile (back-pressure);
    waiters are served in order. Readers each holding part of a request could then wait for each other forever,
    so when the budget is blocked and within its bound, one reader holding part of a request takes the pass and
    may go past the bound to finish it: memory stays within the bound plus one request.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[_Waiter] = deque()
        self._pass: object | None = None  # the request allowed past the bound until it is read whole

    def try_acquire(self, size: int, request: object) -> bool:
        """Take `size` bytes for `request` if that needs no wait."""
        if self._pass is request or (not self._waiters and self.used + size <= self.limit):
            self.used += size
            return True
        return False

    async def acquire(self, size: int, request: object, started: bool = False) -> None:
        """Take `size` bytes for `request` (`started`: it already holds some), waiting as long as it takes."""
        if self.try_acquire(size, request):
            return
        waiter = _Waiter(size, request, started, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._wake()
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(size)  # granted just as we were cancelled: give it back
            else:  # still queued, unless a wake already dropped it as cancelled
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                self._wake()
            raise

    def release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def read_whole(self, request: object) -> None:
        """`request` is read (or abandoned): it no longer needs the pass."""
        if self._pass is request:
            self._pass = None
            self._wake()

    def _grant(self, waiter: _Waiter) -> None:
        self.used += waiter.size
        waiter.granted.set_result(None)

    def _wake(self) -> None:
        while self._waiters:
            head = self._waiters[0]
            if head.granted.cancelled():  # its waiter was cancelled and has not yet removed it
                self._waiters.popleft()
            elif self.used + head.size <= self.limit or head.request is self._pass:
                self._grant(self._waiters.popleft())
            else:
                break
        if self._pass is not None or self.used > self.limit:  # a request past the bound is still being handled
            return
        for waiter in self._waiters:  # blocked: the first reader that holds part of a request finishes it
            if waiter.started and not waiter.granted.done():
                self._pass = waiter.request
                self._waiters.remove(waiter)
                self._grant(waiter)
                return
