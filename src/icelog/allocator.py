"""The broker's use of glibc's malloc: thresholds that keep request buffers off the page-fault path, a bound on its
arenas, and the free memory it holds given back to the system (malloc_trim) once past a bound.

Every Produce request allocates buffers of 0.5-4 MB (the frame, the records, the decompressed batch). glibc serves
blocks that large with a fresh mmap and gives them back with munmap, or trims the heap top after each free, so
every request faults in its pages again: ~50 page faults per MB produced, which cost the event loop ~15 % of its
throughput in `bench/broker_bench.py`. Fixed thresholds keep such blocks on the heap and the heap's freed top in
place for the next request.

The price is memory that malloc keeps after it is freed: up to the trim threshold at the top of each arena, and any
free page below a live block (a heap is only trimmed from its top). Each thread that allocates may get an arena of
its own (up to 8 per core), and read-back's batches, Fetch's reads and the store's rows are freed on other threads
than those that allocate the next ones, so free memory spread over the arenas and grew with the broker's age: 135 MB
free beside 92 MB in use after three minutes of bench/soak_bench.py with a table reader. Hence `memory.arena_max`
arenas (glibc's M_ARENA_MAX; most allocations hold the GIL anyway, so more arenas buy little), and `trim`, which
the broker calls every few seconds: it gives back every free page of every arena (malloc_trim(0)) once malloc holds
more than `memory.malloc_free_max_bytes` free, and costs the next requests their page faults once per trim, not per
request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 256 * 1024 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


_LIBC = _libc()


def keep_large_buffers(arena_max: int = 0) -> bool:
    """Apply the thresholds and, when `arena_max` > 0, the arena bound (before any thread allocates); False (and
    nothing changed) where the C library is not glibc."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:  # musl or another libc without mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if arena_max > 0:
        done = bool(mallopt(_M_ARENA_MAX, arena_max)) and done
    if not done:
        log.info("malloc settings not applied (mallopt refused them)")
    return done


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


@dataclass(frozen=True)
class MallocStats:
    """What glibc's malloc holds, over all its arenas (mallinfo2)."""

    in_use: int  # bytes of allocated blocks (in the heaps and mmapped)
    free: int  # bytes free inside the heaps: resident until reused or given back (malloc_trim)
    mmapped: int  # bytes of blocks served by their own mmap


def malloc_stats() -> MallocStats | None:
    """glibc's mallinfo2 (2.33+), or None where the C library has none."""
    mallinfo2 = getattr(_LIBC, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return MallocStats(info.uordblks + info.hblkhd, info.fordblks, info.hblkhd)


def trim(free_max_bytes: int) -> int | None:
    """Give malloc's free pages back to the system when it holds more than `free_max_bytes` free: the bytes it
    held free before (None: under the bound, or not glibc)."""
    stats = malloc_stats()
    malloc_trim = getattr(_LIBC, "malloc_trim", None)
    if stats is None or malloc_trim is None or stats.free <= free_max_bytes:
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return stats.free


def resident_bytes() -> int:
    """The process's resident memory (VmRSS), 0 where /proc cannot tell."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
