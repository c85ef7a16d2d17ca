"""A shard's Arrow columns as numpy arrays: numbers 1-D, lists and vectors (Spark ML's, dense or
sparse) 2-D float32, each refusal naming the column and the fix."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hvd_magics.errors import ShardError

#: The fields of Spark ML's vector type as Arrow has it.
_VECTOR_FIELDS = {"type", "size", "indices", "values"}


def is_vector(kind: Any) -> bool:
    """Whether Arrow type ``kind`` is Spark ML's vector (a struct of its four fields)."""
    import pyarrow as pa

    return pa.types.is_struct(kind) and {kind.field(i).name for i in range(kind.num_fields)} \
        >= _VECTOR_FIELDS


def column_array(name: str, column: str, data: Any) -> np.ndarray:
    """Column ``column`` (Arrow ``data``) of the DataFrame ``name`` as a numpy array."""
    import pyarrow as pa

    kind = data.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        if data.null_count:
            raise ShardError(f"column {column!r} of {name} has {data.null_count} nulls; "
                             "fill or drop them in Spark before training (df.na.fill / "
                             "df.dropna)")
        array = data.to_numpy(zero_copy_only=False)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        array = data.to_numpy(zero_copy_only=False)
    elif (pa.types.is_list(kind) or pa.types.is_large_list(kind)
          or pa.types.is_fixed_size_list(kind)):
        array = _lists(name, column, data)
    elif is_vector(kind):
        array = _vectors(name, column, data)
    else:
        raise ShardError(f"column {column!r} of {name} has type {kind}, which does not "
                         "become a numpy array; select numeric, string, array or vector "
                         "columns (cast it in Spark first)")
    return array


def row_width(name: str, column: str, lists: Sequence[Any]) -> int:
    """The one length of every row of the list arrays ``lists`` (a column's chunks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.list_value_length(pa.chunked_array(lists))
    if lengths.null_count:
        raise ShardError(f"array column {column!r} of {name} has {lengths.null_count} "
                         "null rows; fill or drop them in Spark before training (df.dropna)")
    lengths = lengths.to_numpy()
    width = int(lengths[0]) if len(lengths) else 0
    if len(lengths) and (lengths != width).any():
        raise ShardError(f"array column {column!r} of {name} has rows of different "
                         f"lengths ({lengths.min()} to {lengths.max()}); pad them in "
                         "Spark to one length")
    return width

def _lists(name: str, column: str, data: Any) -> np.ndarray:
    width = row_width(name, column, [data])
    values = data.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(data), width).astype(np.float32, copy=False)


def _vectors(name: str, column: str, data: Any) -> np.ndarray:
    kinds = data.field("type").to_numpy(zero_copy_only=False)
    values = data.field("values")
    dense_rows = kinds == 1
    if dense_rows.all():  # the usual case: one reshape, no loop
        return _lists(name, column, values)
    sizes = data.field("size").to_numpy(zero_copy_only=False)
    width = int(max((len(values[i]) for i in np.flatnonzero(dense_rows)[:1]), default=0))
    if (~dense_rows).any():
        width = max(width, int(np.nanmax(sizes[~dense_rows])))
    out: np.ndarray = np.zeros((len(data), width), dtype=np.float32)
    indices = data.field("indices")
    for row in range(len(data)):
        row_values = values[row].values.to_numpy(zero_copy_only=False)
        if dense_rows[row]:
            out[row, :len(row_values)] = row_values
        else:
            out[row, indices[row].values.to_numpy(zero_copy_only=False)] = row_values
    return out
