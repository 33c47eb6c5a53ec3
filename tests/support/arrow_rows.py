"""Comparing two side decoders' struct arrays row for row (the compiled decoders' tests against the Python path)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def plain(data_type: pa.DataType) -> pa.DataType:
    """The type with times as their integers (a corrupted payload's instant may be past what datetime holds); map
    types are kept (their entries compare as lists of pairs)."""
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, plain(f.type)) for f in data_type])
    if pa.types.is_list(data_type):
        return pa.list_(plain(data_type.value_type))
    if pa.types.is_timestamp(data_type):
        return pa.int64()
    if pa.types.is_date32(data_type):
        return pa.int32()
    return data_type


def assert_same_rows(many: pa.Array, alone: pa.Array, struct_type: pa.StructType) -> list[Any]:
    """`many`'s rows, asserted equal to `alone`'s (NaN equal to NaN: compared by repr); both of `struct_type`."""
    assert many.type == alone.type == struct_type
    rows = many.cast(plain(struct_type)).to_pylist()
    assert repr(rows) == repr(alone.cast(plain(struct_type)).to_pylist())
    return rows
