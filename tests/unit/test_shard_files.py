"""A task's shard files: the rows of each source written as they arrive, with their null counts
(no Spark: the batches are built here as the barrier stage's input tags them)."""
import pyarrow as pa
import pytest

from hvd_magics.protocol import ROW_COLUMN, SOURCE_COLUMN
from hvd_magics.task.shard_files import null_values, write_shards

ROW = pa.struct([("x", pa.list_(pa.float32())), ("y", pa.int32())])


def _tagged(source: int, xs: list, ys: list) -> pa.RecordBatch:
    """Rows of ``source`` as the stage's input holds them: the other source's struct null."""
    rows = pa.array([{"x": x, "y": y} for x, y in zip(xs, ys)], ROW)
    empty = pa.nulls(len(xs), ROW)
    structs = (rows, empty) if source == 0 else (empty, rows)
    return pa.RecordBatch.from_arrays([pa.array([source] * len(xs), pa.int32()), *structs],
                                      names=[SOURCE_COLUMN, ROW_COLUMN.format(0),
                                             ROW_COLUMN.format(1)])


def test_each_source_counts_its_nulls_per_column_over_every_batch(tmp_path):
    batches = [_tagged(0, [[1.0], None, [2.0]], [1, None, 3]),
               _tagged(1, [[1.0], [2.0]], [None, 4]),
               _tagged(0, [None], [5])]
    train, val = write_shards(batches, tmp_path, {0: "train", 1: "val"})
    assert (train.rows, val.rows) == (4, 2)
    assert train.nulls == {"x": 2, "y": 1} and val.nulls == {"y": 1}
    assert pa.ipc.open_file(train.path).read_all().column("x").null_count == 2


@pytest.mark.parametrize("no_nulls, expected", [
    ({0: {"x": "featuresCol", "y": "labelCol"}, 1: {"x": "featuresCol", "y": "labelCol"}},
     "featuresCol 'x' has 3 null values. Fix: drop those rows (df.na.drop(subset=['x']))"),
    ({0: {"y": "labelCol"}, 1: {"y": "labelCol"}}, "labelCol 'y' has 1 null values."),
    ({1: {"x": "featuresCol"}}, None),  # the nulls of x are in source 0's rows
    ({}, None),
])
def test_nulls_are_summed_over_tasks_and_sources_and_named_with_the_fix(no_nulls, expected):
    shards = [{"source": 0, "rows": 5, "nulls": {"x": 2}},
              {"source": 0, "rows": 5, "nulls": {"x": 1, "y": 1}},
              {"source": 1, "rows": 2, "nulls": {}},
              {"source": 1, "rows": 0}]  # a receiver's answer for no rows has no counts
    problem = null_values(shards, no_nulls)
    assert problem == expected if expected is None else problem.startswith(expected)
