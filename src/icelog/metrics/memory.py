"""What the broker holds in memory, read at scrape time: its caches (entries, bytes, the bounds their settings
set) and glibc malloc's bytes in use and free (docs/operations.md#memory says what to provision).

`cache` is one of a fixed set of names, never a topic or a key: `intake_index` (the intake chunk rows partitions
keep: their newest chunks and pages of older ones), `batch_positions` (where each batch of a recently read chunk
starts), `readback_batches` (record batches built from archive tables), `readback_files` (data files of tables on
object storage copied to the broker's disk for read-back: disk, not memory), `readback_plans` (the tables' data files
as read-back planned them: as many as the tables have files), `producer_state` (idempotent producers per partition:
gone once idle past producer id expiration). Byte figures of the object caches are estimates: their entries times
what one costs in CPython (measured with tracemalloc), not a walk of the objects.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from icelog.allocator import malloc_stats
from icelog.config import Settings
from icelog.log.manager import LogManager
from icelog.readback.service import ReadBack

# CPython 3.11 costs, measured with tracemalloc: an IntakeChunk row in a list (its offsets, positions and
# timestamps distinct ints), a batch position (a 4-tuple of ints in a list), a planned data file (pyiceberg's
# FileScanTask and DataFile, its column statistics dropped once planned), a producer entry (its last five
# batches' sequences).
CHUNK_ROW_BYTES = 360
BATCH_POSITION_BYTES = 220
PLANNED_FILE_BYTES = 1500
PRODUCER_BYTES = 1000


class MemoryCollector(Collector):
    """`icelog_cache_*` and `icelog_malloc_*` of one broker."""

    def __init__(self, settings: Settings, logs: LogManager, readback: ReadBack) -> None:
        self.settings = settings
        self.logs = logs
        self.readback = readback

    def describe(self) -> list[Metric]:
        return []  # read at scrape time

    def collect(self) -> Iterator[Metric]:
        labels = ["cache"]
        entries = GaugeMetricFamily("icelog_cache_entries", "Entries a broker cache or in-memory index holds now.",
                                    labels=labels)
        size = GaugeMetricFamily("icelog_cache_bytes", "Bytes a broker cache holds now (object caches: estimated "
                                 "from their entries).", labels=labels)
        max_entries = GaugeMetricFamily("icelog_cache_max_entries", "The bound a setting puts on a cache's "
                                        "entries (over all partitions).", labels=labels)
        max_bytes = GaugeMetricFamily("icelog_cache_max_bytes", "The bound a setting puts on a cache's bytes.",
                                      labels=labels)
        intake = self.settings.intake
        parts = [part for topic in list(self.logs.topics.values()) for part in list(topic.partitions)]
        rows = sum(part.cached_chunk_rows for part in parts)
        chunks = positions = producers = 0
        for part in parts:
            cached, held = part.cached_batch_positions
            chunks, positions = chunks + cached, positions + held
            producers += len(part.producers.entries)
        # The hot tail holds up to index_cache_chunks rows, the LRU of older pages as many again.
        figures = [
            ("intake_index", rows, rows * CHUNK_ROW_BYTES, 2 * intake.index_cache_chunks * len(parts)),
            ("batch_positions", chunks, positions * BATCH_POSITION_BYTES,
             intake.batch_positions_cache_chunks * len(parts)),
            ("readback_batches", self.readback.cache.entries, self.readback.cache.size_bytes, None),
            ("readback_files", self.readback.copies.entries, self.readback.copies.size_bytes, None),
            ("readback_plans", self.readback.planned_files, self.readback.planned_files * PLANNED_FILE_BYTES, None),
            ("producer_state", producers, producers * PRODUCER_BYTES, None),
        ]
        for name, count, held_bytes, bound in figures:
            entries.add_metric([name], count)
            size.add_metric([name], held_bytes)
            if bound is not None:
                max_entries.add_metric([name], bound)
        max_bytes.add_metric(["readback_batches"], self.readback.cache.max_bytes)
        max_bytes.add_metric(["readback_files"], self.readback.copies.max_bytes)
        yield from (entries, size, max_entries, max_bytes)
        arrow = sys.modules.get("pyarrow")  # read-back's Parquet reads and columns (its own allocator, not malloc)
        if arrow is not None:
            yield GaugeMetricFamily("icelog_arrow_allocated_bytes", "Bytes pyarrow's memory pool has allocated "
                                    "(read-back's columns and Parquet reads).", value=arrow.total_allocated_bytes())
        heap = malloc_stats()
        if heap is not None:
            yield GaugeMetricFamily("icelog_malloc_in_use_bytes", "Bytes glibc's malloc has handed out (all arenas; "
                                    "Python objects, buffers, SQLite's caches).", value=heap.in_use)
            yield GaugeMetricFamily("icelog_malloc_free_bytes", "Bytes free inside malloc's heaps, resident until "
                                    "reused or given back (memory.malloc_free_max_bytes).", value=heap.free)
