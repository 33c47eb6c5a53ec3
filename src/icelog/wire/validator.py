"""The validation process: produced records too big to check on the event loop are checked here.

A process, not a thread: a thread decompressing gzip needs the GIL back after every step, and each time the
event loop must hand it over (and wait for the thread, niced, to be scheduled), which cost an innocent
producer 2.5x its ack p99 while bombs were refused (bench/hostile_bench.py); a process of its own costs it
nothing measurable. One worker at niceness 10, started on first use, so big requests are checked one after
another and the event loop keeps its core; records go over a pipe (at most a request's bytes), headers come
back.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from icelog.errors import ErrorCode, KafkaApiError
from icelog.records.batch import BatchHeader, parse_produced_batches
from icelog.records.walk import InflationLimitError

log = logging.getLogger(__name__)

# Niceness of the validation process: when the CPU is short, the event loop (every other client) goes first,
# and big batches still get a share.
VALIDATOR_NICE = 10

# (kind, payload): ("ok", headers) or ("error", (code, message, record_errors, inflation limit or -1, codec))
_Answer = tuple[str, object]


def _check(
    records: bytes, max_batch_bytes: int, compacted: bool, log_append_time: bool, limit: int,
    timestamp_window: tuple[int, int] | None,
) -> _Answer:
    """parse_produced_batches in the validation process; errors as plain values (KafkaApiError's constructor
    does not round-trip through pickle)."""
    try:
        return "ok", parse_produced_batches(
            records, max_batch_bytes, compacted, log_append_time, limit, timestamp_window
        )
    except InflationLimitError as exc:
        return "error", (int(exc.code), exc.message, [], exc.limit, exc.codec)
    except KafkaApiError as exc:
        return "error", (int(exc.code), exc.message, exc.record_errors, -1, -1)


class Validator:
    """The one validation process of a broker (`check`), started on first use, ended by `close`."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: forking a process that runs threads (the intake writer, the event loop's) is unsafe.
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice, initargs=(VALIDATOR_NICE,),
            )
        return self._pool

    async def check(
        self, records: bytes, max_batch_bytes: int, compacted: bool, log_append_time: bool, limit: int,
        timestamp_window: tuple[int, int] | None = None,
    ) -> list[BatchHeader]:
        """parse_produced_batches(…) run in the validation process; raises what it raises."""
        loop = asyncio.get_running_loop()
        try:
            kind, payload = await loop.run_in_executor(
                self._executor(), _check, records, max_batch_bytes, compacted, log_append_time, limit,
                timestamp_window,
            )
        except BrokenProcessPool:
            self._pool = None  # the next request starts a new one
            log.warning("the validation process died; a new one starts with the next big request")
            raise KafkaApiError(
                ErrorCode.UNKNOWN_SERVER_ERROR, "the broker's validation process died checking these records"
            ) from None
        if kind == "ok":
            assert isinstance(payload, list)
            return payload
        assert isinstance(payload, tuple)
        code, message, record_errors, inflation_limit, codec = payload
        if inflation_limit >= 0:
            raise InflationLimitError(codec, inflation_limit)
        raise KafkaApiError(ErrorCode(code), message, record_errors)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
