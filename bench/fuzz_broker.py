"""The protocol fuzz of tests/wire/test_fuzz.py for as long as asked, against a broker of its own.

    .venv/bin/python bench/fuzz_broker.py --seconds 600 [--seed 1]

Prints what was sent and the broker's state afterwards (alive, descriptors and memory before / after, log
lines by level, tracebacks); exits 1 if the broker died or logged a traceback. The data directory and the
broker's log are kept under bench/results/fuzz-<seed>/ when something went wrong.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.clients_util import create_topic  # noqa: E402
from tests.support.fuzz import FUZZ_TOPIC, fuzz  # noqa: E402

LEVEL = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(dir=Path(__file__).parent))
    broker = BrokerProcess(tmp / "data", env={"ICELOG_CONNECTIONS_MAX_IDLE_MS": "5000"}).start()
    assert broker.proc is not None
    pid = broker.proc.pid
    try:
        create_topic(broker.bootstrap, FUZZ_TOPIC, partitions=2)
        before = {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_mib": _rss_mib(pid)}
        stats = fuzz("127.0.0.1", broker.port, args.seed, args.seconds)
        alive = broker.proc.poll() is None
        after = {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_mib": _rss_mib(pid)} if alive else {}
    finally:
        broker.stop()
    text = Path(broker.log_path).read_text(errors="replace")
    levels = collections.Counter(m.group(1) for line in text.splitlines() if (m := LEVEL.match(line)))
    tracebacks = text.count("Traceback")
    print(json.dumps({
        "seed": args.seed, "seconds": args.seconds, "sent": stats.sent, "reconnects": stats.reconnects,
        "alive": alive, "before": before, "after": after, "log_lines": dict(levels), "tracebacks": tracebacks,
        "longest_log_line": max((len(line) for line in text.splitlines()), default=0),
    }, indent=2))
    if alive and not tracebacks:
        shutil.rmtree(tmp)
        return
    kept = Path(__file__).parent / "results" / f"fuzz-{args.seed}"
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(str(tmp), kept)
    print(f"kept the data directory and the broker log in {kept}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
