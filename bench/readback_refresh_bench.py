"""The broker's background read-back refresh (`ReadBack.refresh_all`), timed in process: what it costs the broker.

Run: PYTHONPATH=$PWD/src .venv/bin/python bench/readback_refresh_bench.py [--partitions 16] [--appends 50]

An archive-layout table of `--partitions` Kafka partitions is written with pyiceberg (no Spark: one data file per
partition per append, each commit recording its offsets as the archiver's do; pyiceberg 0.12 with pyarrow 26
records no column bounds, so files are found by their identity partition), with `--appends` commits already in
it; one read-back source per partition, as the broker has. Then, one second apart as in the broker:
  - idle: refresh_all while no table changed;
  - append: one more commit (a file per partition), then refresh_all.
Printed per case: wall time and the CPU time of the whole process (the GIL the broker's event loop waits for) of
refresh_all, median and max over `--rounds`. The same script runs against any checkout (PYTHONPATH) to compare.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

from icelog.config import load_settings  # noqa: E402
from icelog.lake.catalog import prepare_sqlite_catalog, sqlite_catalog_path
from icelog.readback.service import ReadBack
from icelog.table.config import LAYOUT_RECORD
from icelog.table.layout import LAYOUT_PROPERTY, LAYOUT_PROPERTY_VALUES, OFFSETS_PROPERTY, TOPIC_ID_PROPERTY

ROWS = 200  # per data file


def archive_schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    raw = StructType(NestedField(20, "__raw__", BinaryType(), required=False))
    raw2 = StructType(NestedField(21, "__raw__", BinaryType(), required=False))
    header = StructType(NestedField(22, "key", StringType(), required=False),
                        NestedField(23, "value", BinaryType(), required=False))
    kafka = StructType(
        NestedField(30, "partition", IntegerType(), required=False),
        NestedField(31, "offset", LongType(), required=False),
        NestedField(32, "event_timestamp", TimestamptzType(), required=False),
        NestedField(33, "ingest_timestamp", TimestamptzType(), required=False),
        NestedField(34, "batch_start", LongType(), required=False),
    )
    return Schema(
        NestedField(1, "key", raw, required=False),
        NestedField(2, "value", raw2, required=False),
        NestedField(3, "headers", ListType(24, header, element_required=False), required=False),
        NestedField(4, "kafka", kafka, required=False),
    )


def rows(partitions: int, start: int) -> pa.Table:
    """ROWS records per partition, offsets start.. (one producer batch each)."""
    now = int(time.time() * 1e6)
    n = partitions * ROWS
    part = [p for p in range(partitions) for _ in range(ROWS)]
    offsets = [start + i for _ in range(partitions) for i in range(ROWS)]
    ts = pa.array([now] * n, pa.timestamp("us", tz="UTC"))
    kafka = pa.StructArray.from_arrays(
        [pa.array(part, pa.int32()), pa.array(offsets, pa.int64()), ts, ts, pa.array([start] * n, pa.int64())],
        ["partition", "offset", "event_timestamp", "ingest_timestamp", "batch_start"],
    )
    raw = pa.StructArray.from_arrays([pa.array([b"v" * 100] * n, pa.binary())], ["__raw__"])
    nokey = pa.StructArray.from_arrays([pa.array([None] * n, pa.binary())], ["__raw__"])
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.table({"key": nokey, "value": raw, "headers": pa.array([[]] * n, header), "kafka": kafka})


def commit(table: Any, partitions: int, start: int, topic_id: str) -> None:
    offsets = json.dumps({str(p): start + ROWS for p in range(partitions)})
    arrow = rows(partitions, start).cast(table.schema().as_arrow())
    table.append(arrow, snapshot_properties={OFFSETS_PROPERTY: offsets, TOPIC_ID_PROPERTY: topic_id})


def timed(readback: ReadBack) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    readback.refresh_all()
    return time.perf_counter() - wall, time.process_time() - cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [w * 1000 for w, _ in samples], [c * 1000 for _, c in samples]
    return {"wall_ms_median": round(statistics.median(walls), 1), "wall_ms_max": round(max(walls), 1),
            "cpu_ms_median": round(statistics.median(cpus), 1), "cpu_ms_max": round(max(cpus), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--appends", type=int, default=50, help="commits in the table before timing")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    work = Path(tempfile.mkdtemp(prefix="icelog-refresh-bench-"))
    try:
        settings = load_settings(data_dir=str(work))
        path = sqlite_catalog_path(settings)
        assert path is not None
        prepare_sqlite_catalog(path)
        catalog = SqlCatalog(settings.archive.catalog_name, uri=f"sqlite:///{path}", warehouse=settings.warehouse)
        catalog.create_namespace("icelog")
        spec = PartitionSpec(PartitionField(source_id=30, field_id=1000, transform=IdentityTransform(),
                                            name="kafka_partition"))
        topic_id = str(uuid.uuid4())
        table = catalog.create_table(("icelog", "bench"), archive_schema(), partition_spec=spec,
                                     properties={LAYOUT_PROPERTY: LAYOUT_PROPERTY_VALUES[LAYOUT_RECORD]})
        started = time.perf_counter()
        for i in range(args.appends):
            commit(table, args.partitions, i * ROWS, topic_id)
        print(f"{args.appends} commits of {args.partitions} files in {time.perf_counter() - started:.1f}s", flush=True)

        readback = ReadBack(settings, None, 64 * 1024 * 1024)  # type: ignore[arg-type]  # raw rows: no schemas
        sources = [readback.source(uuid.UUID(topic_id), "bench", {}, p, False) for p in range(args.partitions)]
        assert all(s is not None for s in sources)
        first = timed(readback)
        idle, append = [], []
        start = args.appends * ROWS
        for _ in range(args.rounds):
            time.sleep(1.0)
            idle.append(timed(readback))
            commit(table, args.partitions, start, topic_id)
            start += ROWS
            time.sleep(1.0)
            append.append(timed(readback))
        table = catalog.load_table(("icelog", "bench"))
        planned = {s._plan.snapshot_id for s in sources if s is not None}
        assert planned == {table.current_snapshot().snapshot_id}, planned  # every source planned the last commit
        files = (args.appends + args.rounds) * args.partitions
        results: dict[str, Any] = {"partitions": args.partitions, "files": files,
                                   "first_plan": summary([first]), "idle": summary(idle), "append": summary(append)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results("readback_refresh_bench.json", results)


if __name__ == "__main__":
    main()
