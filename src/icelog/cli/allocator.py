"""Keep the broker's request buffers out of the kernel's page-fault path (glibc malloc settings).

Every Produce request allocates buffers of 0.5-4 MB (the frame, the records, the decompressed batch).
glibc serves blocks that large with a fresh mmap and gives them back with munmap, or trims the heap top
after each free, so every request faults in its pages again: ~50 page faults per MB produced, which cost
the event loop ~15 % of its throughput in `bench/broker_bench.py`. Fixed thresholds keep such blocks on
the heap and the heap's freed top in place for the next request (memory the broker used once stays
resident, up to the trim threshold).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_large_buffers() -> bool:
    """Apply the thresholds; False (and nothing changed) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not done:
        log.info("malloc thresholds not applied (mallopt refused them)")
    return done
