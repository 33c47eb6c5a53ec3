"""The archiver's CPU priority: `archive.nice` is added to the niceness it starts with (the broker's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Each case in a child forked after one import: (niceness the process starts at, niceness, relative) → the result.
SCRIPT = """
import json, os, sys
from icelog.archive.service import lower_priority
results = []
for start, niceness, relative in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        os.setpriority(os.PRIO_PROCESS, 0, start)  # as a broker started under `nice -n N` passes on
        lower_priority(niceness, relative=relative)
        lower_priority(niceness, relative=relative)  # (a second Spark start adds nothing more)
        os._exit(os.getpriority(os.PRIO_PROCESS, 0))
    results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(results))
"""


def test_archive_nice_is_added_to_the_niceness_the_archiver_inherits() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # (the tests may themselves run under `nice`)
    cases = [
        (max(own, 5), 10, True),  # a broker at niceness 5: its archiver 10 below it
        (max(own, 12), 10, True),  # never past 19
        (own, 0, True),  # 0: as the broker
        (own, 19, False),  # maintenance_nice stays absolute
        (max(own, 15), 12, False),  # and never raises the priority
    ]
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [min(19, max(own, 5) + 10), 19, own, 19, max(own, 15)]
