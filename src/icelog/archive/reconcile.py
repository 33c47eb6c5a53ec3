"""Reading back what an archive table holds: the offsets recorded in its snapshot summaries.

Every archive commit writes, in its snapshot summary, the full map of next offsets per partition
(`icelog.archive.offsets`), not only the partitions it touched. So the current snapshot alone answers
"what does the table contain", and expiring older snapshots loses nothing. Snapshots committed by
others (compaction, deletes) carry no map: walk the current snapshot's ancestry to the newest one
that does; if none is left (expired), derive the map from the data (max(kafka.offset) + 1).
Snapshots that are not ancestors of the current one (staged, or written by a job that died before
its commit) are never looked at. (The table layout's columns are __bucket and __offset.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icelog.lake.iceberg_java import ancestry, load_table, table_properties
from icelog.table.config import LAYOUT_TABLE
from icelog.table.layout import LAYOUT_PROPERTY, LAYOUT_PROPERTY_VALUES, OFFSETS_PROPERTY, TOPIC_ID_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icelog.lake.iceberg_java import JavaTable

__all__ = ["COMMIT_USER", "COMMIT_USER_PROPERTY", "OFFSETS_PROPERTY", "TOPIC_ID_PROPERTY", "TableOffsets",
           "decode_offsets", "encode_offsets", "table_offsets"]

log = logging.getLogger(__name__)

COMMIT_USER_PROPERTY = "commit-user"
COMMIT_USER = "icelog-archiver"


@dataclass(frozen=True)
class TableOffsets:
    """The next offset per partition that a table contains, and where that came from."""

    offsets: dict[int, int]
    snapshot_id: int | None
    committed_ms: int
    source: str  # snapshot | ancestor | data | empty
    topic_id: str | None = None  # the topic id the recording snapshot was archived from


def encode_offsets(offsets: dict[int, int]) -> str:
    return json.dumps({str(p): o for p, o in sorted(offsets.items())}, separators=(",", ":"))


def decode_offsets(text: str) -> dict[int, int]:
    return {int(p): int(o) for p, o in json.loads(text).items()}


def table_offsets(
    spark: SparkSession, name: str, max_ancestors: int = 1000, table: JavaTable | None = None
) -> TableOffsets:
    """Offsets the table `name` contains, from the newest snapshot summary on its current lineage (of `table`, the
    table as just loaded, if given)."""
    table = load_table(spark, name) if table is None else table
    current_id: int | None = None
    for hops, snapshot in enumerate(ancestry(table, max_ancestors)):
        if current_id is None:
            current_id = int(snapshot.snapshotId())
        summary = snapshot.summary()
        text = summary.get(OFFSETS_PROPERTY)
        if text is not None:
            topic_id = summary.get(TOPIC_ID_PROPERTY)
            return TableOffsets(
                decode_offsets(str(text)),
                current_id,
                int(snapshot.timestampMillis()),
                "snapshot" if hops == 0 else "ancestor",
                None if topic_id is None else str(topic_id),
            )
    if current_id is None:
        return TableOffsets({}, None, -1, "empty")
    log.warning(
        "%s: no snapshot on the current lineage records %s; deriving offsets from the data",
        name,
        OFFSETS_PROPERTY,
    )
    # (An upsert table holds no row for a trailing tombstone: re-archiving it deletes nothing twice.)
    partition, offset = (
        ("__bucket", "__offset") if table_properties(table).get(LAYOUT_PROPERTY) == LAYOUT_PROPERTY_VALUES[LAYOUT_TABLE]
        else ("kafka.partition", "kafka.offset")
    )
    rows = spark.sql(f"SELECT {partition} AS p, max({offset}) + 1 AS o FROM {name} GROUP BY 1").collect()
    return TableOffsets({int(r.p): int(r.o) for r in rows}, current_id, -1, "data")
