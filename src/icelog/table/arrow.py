"""Names for Arrow arrays whose type only the running program knows, for annotations (no pyarrow import here).

pyarrow-stubs types an array by its values (`pa.Array[pa.Int64Scalar]`, or `pa.Int64Array`); a column decoded or
read by a schema holds whatever type that schema gives it. Where the type is known, annotate with it instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import pyarrow as pa

ArrowArray: TypeAlias = "pa.Array[Any]"  # an Arrow array of any type
ArrowChunkedArray: TypeAlias = "pa.ChunkedArray[Any]"  # a table's column of any type


def struct_array(array: ArrowArray) -> pa.StructArray:
    """An array of structs as the StructArray it is at run time (pyarrow-stubs type `pa.array(rows, struct_type)`
    and a table's struct column by their values, without StructArray's `field`)."""
    import pyarrow as pa

    if not isinstance(array, pa.StructArray):
        raise TypeError(f"expected an array of structs, not {array.type}")
    return array


def null_array(length: int, arrow_type: pa.DataType) -> ArrowArray:
    """`length` nulls of `arrow_type` (pyarrow-stubs overload `pa.nulls` per type, with none for a type known only
    at run time)."""
    import pyarrow as pa

    nulls: ArrowArray = pa.nulls(length, arrow_type)  # type: ignore[call-overload]
    return nulls
