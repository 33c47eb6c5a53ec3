"""Test hook: kill the broker like a power cut's kill -9 at a named point of a durable write.

`ICELOG_TEST_FAULT=<point>[,<point>...]` makes `fault_point(point)` end the process at once (exit 137,
no clean-up), so tests can check what survives a crash at the worst moment. Points (where they sit):
  producer-ids-stored  a producer-id block is stored, InitProducerId not yet answered
  offsets-stored       committed offsets are stored, OffsetCommit / EndTxn not yet answered
  txn-prepared         PrepareCommit/PrepareAbort is stored, no marker written yet
  txn-completed        CompleteCommit/CompleteAbort is stored, EndTxn not yet answered
  schema-stored        a registry write is stored, the HTTP request not yet answered
  trim-committed       an intake trim is stored, the files it released not yet deleted
The archiver has its own hook (ICELOG_ARCHIVE_FAULT, pipeline/archiver.py).
"""

from __future__ import annotations

import logging
import os

FAULT_ENV = "ICELOG_TEST_FAULT"

log = logging.getLogger(__name__)

_points = frozenset(p.strip() for p in os.environ.get(FAULT_ENV, "").split(",") if p.strip())


def fault_point(name: str) -> None:
    """Die here (exit 137, nothing flushed or closed) when ICELOG_TEST_FAULT names this point."""
    if name in _points:
        log.error("fault injection: killing the broker at %s", name)
        os._exit(137)
