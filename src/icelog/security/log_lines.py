"""Log lines about what clients send: bounded, escaped, and counted rather than repeated, so no client can fill
the broker's log, forge lines in it, or hide a flood (one line per interval says how many there were)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from typing import Any

LOG_QUOTE_CHARS = 200  # at most this much of anything a client sent goes into a log line


def bounded(text: str, limit: int = LOG_QUOTE_CHARS) -> str:
    """`text` for a log line: at most `limit` characters, non-printable ones escaped, so a client cannot make
    the log grow by more than a bounded amount per line nor forge lines of its own."""
    head = text[:limit].encode("unicode_escape").decode("ascii")
    return head if len(text) <= limit else f"{head}... ({len(text)} chars)"


def describe(exc: BaseException) -> str:
    """An exception as one bounded line; str(), not repr(): a UnicodeDecodeError's repr quotes all its input."""
    return bounded(f"{type(exc).__name__}: {exc}")


class ThrottledLog:
    """A warning about something clients can cause at will (refused connections, oversized frames, bad HTTP
    requests): the first at once, then one line per `interval_s` at most with how many there were since, and
    the count of a flood's tail written when its interval ends."""

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._what = what
        self._interval_s = interval_s
        self._count = 0
        self._last = ""
        self._since = time.monotonic()
        self._next = 0.0  # when the next line may be written
        self._timer: asyncio.TimerHandle | None = None

    def event(self, detail: str) -> None:
        """One more; `detail` (bounded by the caller) describes the latest."""
        self._count += 1
        self._last = detail
        now = time.monotonic()
        if now >= self._next:
            self._flush()
        elif self._timer is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next event writes the count
                self._timer = asyncio.get_running_loop().call_later(self._next - now, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if not self._count:
            return
        now = time.monotonic()
        self._logger.warning("%s: %d in the last %.0f s; the last: %s", self._what, self._count,
                             max(1.0, now - self._since), self._last)
        self._count, self._since, self._next = 0, now, now + self._interval_s

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class HttpErrorLog(logging.LoggerAdapter[logging.Logger]):
    """The logger aiohttp's request handler writes to (AppRunner's `logger`): what it would log at WARNING or
    above, with a traceback (a malformed request, a 9 KB URL or header line), becomes a bounded line counted by
    a ThrottledLog; its debug lines pass through unchanged."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        super().__init__(logger, {})
        self._errors = ThrottledLog(logger, what)

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, stack_info: bool = False,
            stacklevel: int = 1, extra: Any = None, **kwargs: object) -> None:
        if level < logging.WARNING:
            super().log(level, msg, *args, exc_info=exc_info, stack_info=stack_info, stacklevel=stacklevel,
                        extra=extra)
            return
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        try:
            text = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            text = str(msg)
        self._errors.event(bounded(text) + (f" ({describe(exc)})" if exc is not None else ""))

    def close(self) -> None:
        self._errors.close()
