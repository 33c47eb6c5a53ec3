"""The quick benchmarks still run on main: each bench/ script at a small size (without Spark where it can go without;
the sink bench cannot), as a user runs it.

(A benchmark that no longer runs is a broken promise: bench/startup_bench.py failed for a session before anyone
ran it. The Spark benchmarks are exercised by their own code paths' tests and re-run before a figure is quoted.)
Figures are not checked here: speed is measured by the benchmarks, never asserted by tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script, args, key", [
    ("startup_bench.py", ["--small", "200", "--large", "2000"], "ratio_2000_over_200"),
    ("broker_bench.py", ["--replay-only", "--records", "20000"], "produce_replayed"),
    ("broker_bench.py", ["--metrics-ab", "1", "--records", "20000"], "metrics_on_over_off"),
    ("groups_bench.py", ["--records", "5000", "--txns", "5", "--rounds", "1"], "transactions"),
    ("groups_bench.py", ["--only-protocols", "--rounds", "1"], "join_to_consuming_3x12"),  # classic vs KIP-848
    # Kafka Streams' word count (one JVM per run), exactly-once then at-least-once, on 2,000 lines: ~30 s.
    ("streams_bench.py", ["--records", "2000", "--rounds", "1"], "eos_lines_per_s"),
    ("registry_bench.py", ["--lookups", "50", "--records", "2000", "--out", "none"], "produce_records_per_s"),
    # Half-second windows (the pauses around them as short): ~10 s beside the broker's start.
    ("hostile_bench.py", ["--seconds", "0.5", "--attacks", "bomb,sizes,plain,registry"], "p99_vs_baseline"),
    ("fuzz_broker.py", ["--seconds", "2"], "tracebacks"),  # (the same fuzz runs longer in tests/wire/test_fuzz.py)
    ("meta_bench.py", ["--rounds", "1", "--latency-seconds", "1", "--records", "2000"], "ack_p99_ratio"),
    ("archive_read_via_bench.py", ["--no-spark", "--records", "20000", "--out", "none"], "decode_kafka_over_files"),
    ("s3_intake_bench.py", ["--records", "5000", "--latency-seconds", "1"], "s3_produce_vs_local"),
    ("avro_decode_bench.py", ["--records", "2000", "--repeat", "1"], "compiled_over_fastavro"),
    ("proto_decode_bench.py", ["--records", "2000", "--rounds", "1"], "compiled_over_upb"),
    ("json_decode_bench.py", ["--records", "2000", "--rounds", "1"], "compiled_over_python"),
    # Spark (the bench's, an archiver child's and a sink child's): half a minute or so, mostly their starts; small
    # sizes (the passes' and the steady produce's) are enough to run every part. "freshness" comes last, after all
    # ran. spark_children: the Spark drivers get the Spark tests' short-start JVM options (tests/support/jvm.py),
    # whichever lane runs this first (57 s -> 32 s here).
    pytest.param("sink_bench.py", ["--records", "2000", "--rounds", "1", "--seconds", "1", "--rate-mb", "0.5", "--out",
                                   "none"], "freshness", marks=pytest.mark.spark_children),
    # One Spark pass archives the source; then `icelog replay` and a plain producer of the same records: ~15 s.
    pytest.param("replay_bench.py", ["--records", "2000", "--rounds", "1", "--out", "none"], "replay_over_plain",
                 marks=pytest.mark.spark_children),
    # A broker with its archiver (Spark) and a tail consumer and a table reader, sampled every 5 s for 15 s (the
    # last half's slope: two samples), the intake's retention 6 s.
    pytest.param("soak_bench.py", ["--minutes", "0.25", "--sample-seconds", "5", "--rate-mb", "0.5", "--consumers",
                                   "--retention-minutes", "0.1", "--out", "none"], "growth_last_half",
                 marks=pytest.mark.spark_children),
    # Apache Kafka 4.1.1 (two modes) and icelog, each started once: ~30 s, mostly three JVM tools per broker.
    ("vs_kafka_bench.py", ["--records", "5000", "--rounds", "1", "--e2e", "100"], "ratios"),
    # Three brokers and one over PostgreSQL and SeaweedFS: one kill -9 (the session timeout, 6 s) and a small produce.
    ("failover_bench.py", ["--kills", "1", "--records", "5000", "--rounds", "1"], "three_over_one"),
    ("security_bench.py", ["--records", "5000", "--rounds", "1", "--latency-seconds", "1", "--connections", "10"],
     "throughput_ratio"),
    # Two archive passes in the bench's own Spark session around live scans with a tenth of the rows in the tail.
    pytest.param("live_scan_bench.py", ["--records", "20000", "--rounds", "1", "--out", "none"], "live_over_table_only",
                 marks=pytest.mark.spark),
])
def test_bench_script_runs(script: str, args: list[str], key: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout.strip()
    result = json.loads(output[output.index("{"):])  # the results, printed as JSON last
    assert key in result, result

