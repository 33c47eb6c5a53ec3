"""The Spark daemon's preloaded modules (lake/spark_daemon.py) exist: a renamed module would silently stop being
preloaded, and every new worker would pay its import in its first task again."""

from __future__ import annotations

import subprocess
import sys


def test_every_preloaded_module_imports_in_a_fresh_interpreter() -> None:
    check = (
        "import sys\n"
        "from icelog.lake.spark_daemon import PRELOADED, preload\n"
        "preload()\n"
        "missing = [name for name in PRELOADED if name not in sys.modules]\n"
        "assert not missing, missing\n"
        "assert 'pyspark.sql' not in sys.modules  # the daemon does not load what workers do not need\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
