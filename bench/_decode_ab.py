"""What the decode micro-benchmarks share (bench/proto_decode_bench.py, bench/json_decode_bench.py; not a benchmark
itself): a side decoder's decode_many with its compiled path and without it, in one process, alternated, the cyclic
garbage collector paused as the archive pauses it (archive/decode_schema.gc_paused)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import ModuleType

from icelog.archive.decode_schema import gc_paused


def compiled_ab(switch: ModuleType, decode: Callable[[], object], n: int, rounds: int, baseline: str,
                baseline_label: str) -> None:
    """Times `decode` (n records) with `switch.COMPILED` on and off, alternated `rounds` times after a warm-up that
    checks both give the same rows; prints each rate and the figures as JSON (`<baseline>_records_per_s`,
    `compiled_records_per_s`, `compiled_over_<baseline>`)."""
    built = switch.COMPILED

    def run(compiled: bool) -> tuple[float, object]:
        switch.COMPILED = compiled and built
        try:
            with gc_paused():
                start = time.perf_counter()
                out = decode()
                return time.perf_counter() - start, out
        finally:
            switch.COMPILED = built

    fast, slow = run(True)[1], run(False)[1]  # warm-up (message classes, codecs, the program), and the same rows
    assert fast.equals(slow), f"the compiled decoder's rows differ from {baseline_label}'s"  # type: ignore[attr-defined]
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for compiled in (False, True):
            seconds, _ = run(compiled)
            rates[compiled].append(n / seconds)
    width = max(len(baseline_label), len("compiled decoder"))
    for compiled, label in ((False, baseline_label), (True, "compiled decoder")):
        best = max(rates[compiled])
        print(f"{label:<{width}} " + "  ".join(f"{r:>10,.0f}" for r in rates[compiled])
              + f" records/s  (best {1e6 / best:.2f} µs/record)")
    speedup = max(rates[True]) / max(rates[False])
    print(f"speed-up (best / best): {speedup:.1f}x")
    print(json.dumps({"records": n, f"{baseline}_records_per_s": round(max(rates[False])),
                      "compiled_records_per_s": round(max(rates[True])),
                      f"compiled_over_{baseline}": round(speedup, 1)}))
