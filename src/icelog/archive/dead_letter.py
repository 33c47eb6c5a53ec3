"""The dead-letter table `<table>__dlq`: stored batches the archive cannot decode, kept byte for byte.

Produce validates batches, so a batch that cannot be decoded should never reach the archiver; one that
does (written before validation existed, or a bug) must not stop its partition forever. When an archive
write fails in a Spark worker (a WorkerError that is not retriable), the driver looks for such batches
(decode.find_dead_letters); each one is appended to the dead-letter table, then the archive is written again
without it, its offsets counted as archived. Order makes it exactly once: the dead-letter rows are committed
first and are idempotent by (partition, base_offset), so a crash between the two commits only repeats a write
that adds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icelog.archive.decode import DeadLetter
from icelog.table.layout import quote_identifier

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DLQ_SUFFIX = "__dlq"
DLQ_COLUMNS = (
    "`partition` INT, base_offset BIGINT, last_offset BIGINT, "
    "batch BINARY, error STRING, dead_lettered_at TIMESTAMP"
)


def dlq_table_name(catalog: str, namespace: str, table: str) -> str:
    """The dead-letter table of an archive table, next to it in the same namespace."""
    return quote_identifier(catalog, namespace, table + DLQ_SUFFIX)


def write_dead_letters(spark: SparkSession, table_name: str, letters: Iterable[DeadLetter]) -> int:
    """Append the letters not yet in the table (by partition and base offset); return how many were new."""
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {table_name} ({DLQ_COLUMNS}) USING iceberg "
        "PARTITIONED BY (`partition`) TBLPROPERTIES ('format-version'='2')"
    )
    letters = list(letters)
    present: set[tuple[int, int]] = set()
    for partition in {letter.partition for letter in letters}:
        bases = ",".join(str(letter.base_offset) for letter in letters if letter.partition == partition)
        rows = spark.sql(
            f"SELECT base_offset FROM {table_name} WHERE `partition` = {partition} AND base_offset IN ({bases})"
        ).collect()
        present.update((partition, int(row.base_offset)) for row in rows)
    new = [letter for letter in letters if (letter.partition, letter.base_offset) not in present]
    if not new:
        return 0
    now = datetime.now(UTC).replace(tzinfo=None)  # the session time zone is UTC
    frame = spark.createDataFrame(
        [(d.partition, d.base_offset, d.last_offset, bytearray(d.batch), d.error, now) for d in new],
        DLQ_COLUMNS,
    )
    frame.coalesce(1).writeTo(table_name).append()
    for letter in new:
        log.error(
            "partition %d offsets %d-%d cannot be decoded; kept in %s: %s",
            letter.partition, letter.base_offset, letter.last_offset, table_name, letter.error,
        )
    return len(new)


def dead_letter_counts(spark: SparkSession, table_name: str) -> dict[int, int]:
    """Dead letters per partition in a dead-letter table (empty if it does not exist)."""
    if not spark.catalog.tableExists(table_name):
        return {}
    rows = spark.sql(f"SELECT `partition` AS p, count(*) AS n FROM {table_name} GROUP BY 1").collect()
    return {int(r.p): int(r.n) for r in rows}

