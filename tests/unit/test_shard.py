"""A rank's shard of a DataFrame, from a local Arrow file (no Spark: the file is written here the
way a Spark task writes its partition, MLlib vectors as Spark's Arrow struct)."""
import numpy as np
import pyarrow as pa
import pytest

from hvd_magics.rank.api.shard import Shard, ShardError

VECTOR = pa.struct([("type", pa.int8()), ("size", pa.int32()),
                    ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float64()))])


def _table(rows: int = 10, sparse: bool = False) -> pa.Table:
    vectors = [{"type": 1, "size": None, "indices": None, "values": [float(i), float(-i)]}
               for i in range(rows)]
    if sparse:
        vectors[1] = {"type": 0, "size": 2, "indices": [1], "values": [7.0]}
    return pa.table({
        "features": pa.array([[float(i)] * 3 for i in range(rows)], pa.list_(pa.float32())),
        "vec": pa.array(vectors, VECTOR),
        "label": pa.array(range(rows), pa.int64()),
        "name": pa.array([f"row{i}" for i in range(rows)]),
    })


def write_shard(table: pa.Table, path) -> None:
    """An Arrow IPC file, as a Spark task writes its rows (hvd_magics.task.shard_files)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _shard(tmp_path, table, **kwargs) -> Shard:
    path = tmp_path / "part.arrow"
    write_shard(table, path)
    return Shard(path, name="train", **kwargs)


def test_a_shard_says_what_it_is(tmp_path):
    shard = _shard(tmp_path, _table(), rank=1, size=2, rows_per_rank=[12, 10])
    assert len(shard) == 10 and shard.columns == ["features", "vec", "label", "name"]
    assert shard.dtypes["vec"] == "vector" and shard.dtypes["label"] == "int64"
    assert repr(shard) == ("<Shard of train: rank 1 of 2, 10 rows of 22; columns: features "
                           "list<item: float>, vec vector, label int64, name string>")
    assert list(shard.to_pandas(["label"])["label"]) == list(range(10))


def test_columns_become_arrays_vectors_and_lists_two_dimensional(tmp_path):
    shard = _shard(tmp_path, _table(sparse=True))
    assert shard.to_numpy("features").shape == (10, 3)
    vec = shard.to_numpy("vec")
    assert vec.shape == (10, 2) and vec[3].tolist() == [3.0, -3.0]
    assert vec[1].tolist() == [0.0, 7.0]  # the sparse row, scattered
    assert shard.to_numpy("label").dtype == np.int64
    assert shard.to_numpy("name")[2] == "row2"


def test_every_rank_runs_the_same_steps_and_shuffling_is_seeded(tmp_path):
    small = _shard(tmp_path, _table(7), rows_per_rank=[7, 10])
    assert small.steps_per_epoch(3) == 4  # ceil(10 / 3): the largest shard decides
    epoch = [b["label"].tolist() for b in small.batches(3, columns=["label"])]
    # the smaller shard starts over to fill the epoch: every row seen, as many rows as rank 1
    assert epoch == [[0, 1, 2], [3, 4, 5], [6, 0, 1], [2]]
    assert small.steps_per_epoch(3, remainder="drop") == 2  # 7 // 3 full batches
    dropped = [b["label"].tolist() for b in small.batches(3, columns=["label"], remainder="drop")]
    assert dropped == [[0, 1, 2], [3, 4, 5]]
    first = [b["label"].tolist() for b in small.batches(3, shuffle=True, seed=1)]
    again = [b["label"].tolist() for b in small.batches(3, shuffle=True, seed=1)]
    other = [b["label"].tolist() for b in small.batches(3, shuffle=True, seed=2)]
    assert first == again and first != other and len(first) == 4
    assert sorted(sum(first[:3], [])[:7]) == list(range(7))  # a permutation, then the wrap
    with pytest.raises(ValueError, match="remainder must be 'repeat' or 'drop'"):
        small.steps_per_epoch(3, remainder="pad")
    with pytest.raises(ValueError, match="larger than the smallest shard of train \\(7 rows\\)"):
        small.steps_per_epoch(8, remainder="drop")
    with pytest.raises(ValueError, match="positive integer"):
        small.steps_per_epoch(0)


def test_torch_and_tensorflow_loaders_give_the_same_steps(tmp_path):
    shard = _shard(tmp_path, _table(10), rows_per_rank=[10, 7])
    loader = shard.to_torch(["features", "vec"], "label", batch_size=3, remainder="drop")
    batches = list(loader)
    assert len(batches) == 2 and tuple(batches[0][0].shape) == (3, 5)
    assert batches[0][1].tolist() == [0, 1, 2]
    shuffled = shard.to_torch("features", "label", batch_size=3, shuffle=True, seed=0)
    epoch1 = [y.tolist() for _, y in shuffled]
    epoch2 = [y.tolist() for _, y in shuffled]
    assert len(epoch1) == 4 and sorted(sum(epoch1, [])) == list(range(10))
    assert epoch1 != epoch2  # a new order every epoch, reproducible from the seed
    dataset = shard.to_tf_dataset("features", "label", batch_size=3)
    steps = [(x.shape[0], y.numpy().tolist()) for x, y in dataset]
    assert steps == [(3, [0, 1, 2]), (3, [3, 4, 5]), (3, [6, 7, 8]), (1, [9])]
    shuffled = shard.to_tf_dataset("features", "label", batch_size=4, shuffle=True, seed=3)
    passes = [[y.numpy().tolist() for _, y in shuffled] for _ in range(2)]
    assert all(sorted(sum(p, [])) == list(range(10)) for p in passes)  # every row, each pass
    assert passes[0] != passes[1]  # a new order each pass (each Keras epoch)
    again = shard.to_tf_dataset("features", "label", batch_size=4, shuffle=True, seed=3)
    assert [y.numpy().tolist() for _, y in again] == passes[0]  # reproducible from the seed
    assert [x.shape for x in shard.to_tf_dataset("features", batch_size=4)] == [
        (4, 3), (4, 3), (2, 3)]
    fewer = _shard(tmp_path, _table(7), rows_per_rank=[7, 10])
    labels = [y.numpy().tolist() for _, y in fewer.to_tf_dataset("features", "label", 3)]
    assert labels == [[0, 1, 2], [3, 4, 5], [6, 0, 1], [2]]


def test_columns_that_cannot_become_arrays_are_named(tmp_path):
    table = pa.table({"m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64())),
                      "n": pa.array([None], pa.float64())})
    shard = _shard(tmp_path, table)
    with pytest.raises(ShardError, match="column 'm' of train has type map<string, int64>"):
        shard.to_numpy("m")
    with pytest.raises(ShardError, match="column 'n' of train has 1 nulls"):
        shard.to_numpy("n")
    with pytest.raises(KeyError, match="no column 'nope'"):
        shard.to_numpy("nope")
    ragged = _shard(tmp_path, pa.table({"r": pa.array([[1.0], [1.0, 2.0]])}))
    with pytest.raises(ShardError, match="rows of different lengths \\(1 to 2\\)"):
        ragged.to_numpy("r")


def test_reading_does_not_copy_the_file_into_memory(tmp_path):
    rows = 200_000
    table = pa.table({"x": pa.array(np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
                                    .tolist(), pa.list_(pa.float32(), 16))})
    shard = _shard(tmp_path, table)
    import pyarrow

    before = pyarrow.total_allocated_bytes()
    x = shard.to_numpy("x")
    assert x.shape == (rows, 16) and x[5, 3] == 5 * 16 + 3
    assert pyarrow.total_allocated_bytes() - before < 1_000_000  # a view of the mapped file


def _batched_shard(tmp_path, table, batch_rows: int) -> Shard:
    """A shard whose file holds several Arrow batches, as a task writes rows arriving in pieces."""
    path = tmp_path / "batched.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return Shard(path, name="train")


@pytest.mark.parametrize("kind", [pa.list_(pa.float32()), pa.list_(pa.float64()),
                                  pa.list_(pa.float32(), 5), pa.list_(pa.int32())])
def test_a_file_of_many_batches_gives_every_row_in_place(tmp_path, kind):
    rows = 1003
    values = np.arange(rows * 5).reshape(rows, 5) % 997
    table = pa.table({"x": pa.array(values.tolist(), kind), "y": pa.array(range(rows))})
    shard = _batched_shard(tmp_path, table, batch_rows=100)
    assert shard._table.column("x").num_chunks == 11
    order = np.random.default_rng(3).permutation(rows)
    gathered = np.concatenate([x.numpy() for x, _ in
                               shard.to_torch("x", "y", batch_size=64, shuffle=True, seed=3)])
    assert gathered.dtype == np.float32
    assert np.array_equal(gathered, values[order].astype(np.float32))
    batch = next(shard.batches(7, columns=["x"]))
    assert np.array_equal(batch["x"], values[:7].astype(np.float32))
    first = next(iter(shard.to_tf_dataset("x", batch_size=4)))
    assert np.array_equal(first.numpy(), values[:4].astype(np.float32))
    rows_of = shard.feature_rows(["x"])  # what the estimator's PyTorch fit gathers from
    assert rows_of is shard.feature_rows("x") and not isinstance(rows_of, np.ndarray)
    assert np.array_equal(rows_of[order[:50]], values[order[:50]].astype(np.float32))
    assert np.array_equal(shard.to_numpy("x"), values.astype(np.float32))


def test_a_file_of_many_batches_is_not_joined_in_memory_to_train_on(tmp_path):
    rows = 100_000
    table = pa.table({"x": pa.array(np.ones((rows, 32), np.float32).tolist(),
                                    pa.list_(pa.float32())), "y": pa.array(np.zeros(rows))})
    shard = _batched_shard(tmp_path, table, batch_rows=10_000)
    before = pa.total_allocated_bytes()
    loader = shard.to_torch("x", "y", batch_size=1000, shuffle=True, seed=0)
    assert sum(len(y) for _, y in loader) == rows
    # joining the ten batches would allocate the column's 12.8 MB
    assert pa.total_allocated_bytes() - before < 2_000_000


def test_vectors_in_many_batches_dense_in_place_and_sparse_scattered(tmp_path):
    dense = _batched_shard(tmp_path, _table(25), batch_rows=4)
    x = np.concatenate([x.numpy() for x, _ in dense.to_torch("vec", "label", batch_size=5)])
    assert x[:, 0].tolist() == list(range(25)) and x[:, 1].tolist() == [-i for i in range(25)]
    sparse = _batched_shard(tmp_path, _table(25, sparse=True), batch_rows=4)
    x = np.concatenate([x.numpy() for x, _ in sparse.to_torch("vec", "label", batch_size=5)])
    assert x[1].tolist() == [0.0, 7.0] and x[3].tolist() == [3.0, -3.0]


def test_null_rows_of_an_array_column_are_named(tmp_path):
    table = pa.table({"x": pa.array([[1.0, 2.0], None, [3.0, 4.0]] * 4)})
    shard = _batched_shard(tmp_path, table, batch_rows=5)
    with pytest.raises(ShardError, match="column 'x' of train has 4 null rows"):
        next(iter(shard.to_torch("x", batch_size=2)))
