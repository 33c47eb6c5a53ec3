"""A debugging aid: `ICELOG_TRACEMALLOC=<seconds>` makes `icelog serve` log where its memory grows.

Every so many seconds, on a thread of its own, it logs (logger `icelog.memory`, INFO): the process's resident
memory beside what Python's allocations hold (tracemalloc) and what glibc's malloc holds and has free
(mallinfo2), then the source lines whose traced allocations grew most since the first look and since the last
one, and the object types whose counts grew most. Tracing slows the broker (each allocation records its
`ICELOG_TRACEMALLOC_FRAMES` frames, 1 by default): for finding a leak, not for production
([Operations](../../../docs/operations.md#memory)).
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import threading
import time
import tracemalloc

from icelog.allocator import malloc_stats, resident_bytes

log = logging.getLogger("icelog.memory")

ENV = "ICELOG_TRACEMALLOC"
FRAMES_ENV = "ICELOG_TRACEMALLOC_FRAMES"
TOP = 15


def start_from_env() -> bool:
    """Start tracing if the environment asks for it; True if it does."""
    interval = float(os.environ.get(ENV, "0") or 0)
    if interval <= 0:
        return False
    tracemalloc.start(int(os.environ.get(FRAMES_ENV, "1")))
    threading.Thread(target=_watch, args=(interval,), name="memory-trace", daemon=True).start()
    log.info("tracing allocations (tracemalloc), a report every %.0f s", interval)
    return True


def _types() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces([
        tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    ])


def _watch(interval: float) -> None:
    first = previous = _snapshot()
    first_types = _types()
    key = "traceback" if tracemalloc.get_traceback_limit() > 1 else "lineno"
    while True:
        time.sleep(interval)
        snapshot = _snapshot()
        traced, _peak = tracemalloc.get_traced_memory()
        heap = malloc_stats()
        log.info("memory: rss %.1f MB, traced by Python %.1f MB%s", resident_bytes() / 1e6, traced / 1e6,
                 "" if heap is None else f", malloc in use {heap.in_use / 1e6:.1f} MB, free in its heap "
                 f"{heap.free / 1e6:.1f} MB, mmapped {heap.mmapped / 1e6:.1f} MB")
        for title, base in (("since start", first), ("since last", previous)):
            lines = []
            for stat in snapshot.compare_to(base, key)[:TOP]:
                where = " <- ".join(f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}"
                                    for f in stat.traceback)
                lines.append(f"  {stat.size_diff / 1e6:+9.2f} MB {stat.count_diff:+8d} blocks  {where}")
            log.info("memory: top growth %s:\n%s", title, "\n".join(lines))
        types = _types()
        types.subtract(first_types)
        log.info("memory: object counts grown since start: %s",
                 ", ".join(f"{name} {count:+d}" for name, count in types.most_common(TOP)))
        previous = snapshot
