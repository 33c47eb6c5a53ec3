"""Test hook: kill the process (broker or archive job) like a power cut's kill -9 at a named point of a durable write.

`ICELOG_TEST_FAULT=<point>[,<point>...]` makes `fault_point(point)` end the process at once (exit 137,
no clean-up), so tests can check what survives a crash at the worst moment. Points (where they sit):
  producer-ids-stored  a producer-id block is stored, InitProducerId not yet answered
  offsets-stored       committed offsets are stored, OffsetCommit / EndTxn not yet answered
  txn-prepared         PrepareCommit/PrepareAbort is stored, no marker written yet
  txn-completed        CompleteCommit/CompleteAbort is stored, EndTxn not yet answered
  schema-stored        a registry write is stored, the HTTP request not yet answered
  trim-committed       an intake trim is stored, the files it released not yet deleted
  intake-object-put    an intake object is stored in the bucket, its chunks not yet committed (log/s3.py)
The archive job's points (archive/archiver.py, archive/upsert.py):
  after-write                data files and a staged, never-published snapshot exist
  after-commit               the table has the archive, the metadata store does not know yet
  after-commit-before-index  an upsert table's snapshot is committed, its primary-key index not updated
  after-dead-letters         undecodable batches are in the dead-letter table, the archive not yet committed
The replay's points (replay/producer.py):
  replay-in-transaction      a transaction's records are all in the destination, not committed
  replay-committed           a transaction (records and progress marker) is committed
Not a kill, a failure:
  intake-enospc       intake writes fail with ENOSPC while <data_dir>/intake-enospc exists (log/intake.py)
  txn-markers-lost    the transaction coordinator completes transactions without writing their markers, so their
                      partitions keep them open: a hanging transaction (coordinator/transactions.py)
Not a kill, a hold:
  maintenance-stall   a maintenance round holds one Spark task slot until <data_dir>/maintenance-stall.release
                      (archive/maintenance_schedule.py, checked with `armed`)
  replay-held         a replay holds halfway through its second transaction (records in flight, the first one
                      committed) until $TMPDIR/icelog-replay-held.release (replay/producer.py), for a kill -9 there
  trim-held           a retention pass holds after storing an intake trim until <data_dir>/trim-held.release
                      (log/manager.py, with `hold_point`)
  group-shard-held    a broker of a cluster taking a group coordinator shard holds before reading its groups until
                      $TMPDIR/icelog-group-shard-held.release (coordinator/group_shards.py), so a test can ask the
                      new coordinator while it loads
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

FAULT_ENV = "ICELOG_TEST_FAULT"

log = logging.getLogger(__name__)

_points = frozenset(p.strip() for p in os.environ.get(FAULT_ENV, "").split(",") if p.strip())


def armed(name: str) -> bool:
    """Whether ICELOG_TEST_FAULT names this point (for code that must prepare the crash, e.g. stage first)."""
    return name in _points


def fault_point(name: str) -> None:
    """Die here (exit 137, nothing flushed or closed) when ICELOG_TEST_FAULT names this point."""
    if name in _points:
        log.error("fault injection: killing the process at %s", name)
        os._exit(137)


def hold_point(name: str, release: Path, timeout_s: float = 120.0) -> None:
    """Wait here until `release` exists (at most `timeout_s`) when ICELOG_TEST_FAULT names this point."""
    if name not in _points:
        return
    log.error("fault injection: holding at %s until %s exists", name, release)
    deadline = time.monotonic() + timeout_s
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
