"""Live reads of a topic: its Iceberg table at the current snapshot plus the committed records after it.

`scan` answers a `pyarrow.RecordBatchReader` (DuckDB's `from_arrow`, pandas, polars), `dataframe` a Spark DataFrame
of the same cut; `icelog sql --live` reads every topic table a query names that way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icelog.live.cut import LiveCut, LiveReadError, plan_cut
from icelog.live.reader import DEFAULT_DATA_DIR, read_cut, scan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LiveCut", "LiveReadError", "dataframe", "plan_cut", "read_cut", "scan"]


def dataframe(
    spark: SparkSession, topic: str, *, data_dir: str = DEFAULT_DATA_DIR, config: str | None = None
) -> DataFrame:
    """The same cut as `scan`, as a Spark DataFrame of `spark` (which has the archive catalog configured)."""
    from icelog.live.frames import dataframe as frame

    return frame(spark, topic, data_dir=data_dir, config=config)
