"""The table layout's rules against a schema: which columns may partition or bucket a table, and bucket values.

Pure functions, shared by the archiver (before it creates a table), the broker's CreateTopics (when the
subject already has a schema) and produce-time enforcement (the bucket of each record's column value).
The bucket function is Iceberg's own, from pyiceberg (`BucketTransform`: Murmur3 of Iceberg's single-value
serialization), the one Spark's `system.bucket` and every Iceberg writer use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from icelog.table.config import (
    BUCKET_KEY,
    KEY_BYTES,
    PARTITION_BY,
    SYSTEM_COLUMNS,
    layout_column_problem,
)
from icelog.table.iceberg_types import Column

if TYPE_CHECKING:
    from pyiceberg.types import PrimitiveType

# Iceberg can bucket int, long, decimal, date, time, timestamp(tz), string, uuid, fixed and binary; of the
# types a Protobuf field maps to (iceberg_types.py), these.
BUCKETABLE = ("int", "long", "decimal(20,0)", "string", "binary", "timestamptz")
_CONTAINERS = ("struct", "list", "map")

BucketFunction = Callable[[object], int | None]  # a column value (None: no bucket) → its Iceberg bucket


def _pyiceberg_type(signature: str) -> PrimitiveType:
    from pyiceberg import types as t

    return {
        "int": t.IntegerType(),
        "long": t.LongType(),
        "decimal(20,0)": t.DecimalType(20, 0),
        "string": t.StringType(),
        "binary": t.BinaryType(),
        "timestamptz": t.TimestamptzType(),
    }[signature]


def check_spec_columns(columns: Sequence[Column], partition_by: Sequence[str], bucket_key: str | None) -> None:
    """Raise ValueError (saying why) unless every partition column and the bucket key can shape the table."""
    by_name = {c.name: c for c in columns}
    fields = sorted(n for n in by_name if n not in SYSTEM_COLUMNS)
    named = [(PARTITION_BY, name) for name in partition_by]
    if bucket_key is not None:
        named.append((BUCKET_KEY, bucket_key))
    for key, name in named:
        column = by_name.get(name)
        problem = layout_column_problem(name)
        if problem:  # refused at topic creation; a topic created before that check still meets it here
            raise ValueError(f"{key} {problem}")
        if column is None:
            raise ValueError(
                f"{key} names {name!r}, which is not a top-level column of the table "
                f"(the schema's fields: {', '.join(fields) or 'none, no schema registered'}; or {KEY_BYTES})"
            )
        if column.signature in _CONTAINERS:
            raise ValueError(f"{key} names {name!r}, a {column.signature}: only a scalar column can partition a table")
        if key == BUCKET_KEY and column.signature not in BUCKETABLE:
            raise ValueError(
                f"{key} names {name!r} of type {column.signature}, which Iceberg cannot bucket "
                f"(it buckets {', '.join(BUCKETABLE)})"
            )


def bucket_function(signature: str, buckets: int) -> BucketFunction:
    """Iceberg's bucket function of a column type: value (as the archive writes it) → bucket, None → None."""
    from pyiceberg.transforms import BucketTransform

    transform = BucketTransform(buckets).transform(_pyiceberg_type(signature))
    return transform


def bucket_of(signature: str, value: object, buckets: int) -> int | None:
    """The Iceberg bucket of one column value (int, Decimal, str, bytes, or µs since the epoch for timestamptz)."""
    result = bucket_function(signature, buckets)(value)
    return None if result is None else int(result)
