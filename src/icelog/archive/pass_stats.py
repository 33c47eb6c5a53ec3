"""Per-table archive pass counters, shared with the broker's metrics through a file in the data directory.

The archiver runs in a child process of the broker (or as `icelog archive`), so what a pass took cannot be
counted in the broker's memory. Each topic pass the archiver finishes adds to `archive-stats.json` (written
whole and renamed into place: a reader never sees half a file); the broker reads it when Prometheus scrapes.
The counts are cumulative over the data directory's life, so they survive archiver restarts as counters should.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

STATS_FILE = "archive-stats.json"


@dataclass
class TablePassStats:
    """What the archiver did to one table, in all: commits (and the seconds they took), records, failures."""

    commits: int = 0
    commit_seconds: float = 0.0
    records: int = 0
    failures: int = 0


def read_pass_stats(data_dir: str | Path) -> dict[str, TablePassStats]:
    """Every table's counters ({} before the first pass, or if the file cannot be read)."""
    try:
        raw = json.loads((Path(data_dir) / STATS_FILE).read_text())
        return {table: TablePassStats(**values) for table, values in raw.items()}
    except (OSError, ValueError, TypeError):
        return {}


class PassStats:
    """The archiver's side: adds each topic pass to the file (worker threads of one process call it)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / STATS_FILE
        self._tables = read_pass_stats(data_dir)
        self._lock = threading.Lock()

    def record(self, table: str, seconds: float, records: int, committed: bool, failed: bool) -> None:
        """Count one topic pass (nothing for a pass that found nothing to do)."""
        if not committed and not failed:
            return
        with self._lock:
            stats = self._tables.setdefault(table, TablePassStats())
            if committed:
                stats.commits += 1
                stats.commit_seconds += seconds
                stats.records += records
            if failed:
                stats.failures += 1
            body = json.dumps({name: asdict(s) for name, s in self._tables.items()})
            temporary = self.path.with_name(f"{STATS_FILE}.{os.getpid()}.tmp")
            try:
                temporary.write_text(body)
                os.replace(temporary, self.path)
            except OSError as exc:  # counters are not worth failing a pass for
                log.warning("could not write %s: %s", self.path, exc)
                with contextlib.suppress(OSError):
                    temporary.unlink()
