"""A rank's shard of a Spark DataFrame: the rows this rank trains on, read from a local Arrow file.

The Spark task that hosts a rank writes its partition's Arrow batches to a local Arrow IPC file;
the rank opens it memory-mapped, so the rows are read once and not copied into Python objects.
:class:`Shard` gives them in the forms training code wants: numpy arrays per column (MLlib vectors
and array columns as 2-D float arrays), pandas, batches of dicts, a ``tf.data.Dataset`` or a
PyTorch ``DataLoader``.

Every rank runs the same number of steps per epoch, derived from all ranks' row counts, so no
allreduce waits for a rank that ran out of data. Shards differ by a few rows at most; what
happens to those is the ``remainder`` choice of :meth:`Shard.steps_per_epoch` (``"repeat"``: a
smaller shard starts over to fill its last batch; ``"drop"``: only full batches of the smallest
shard).

In a rank, a DataFrame the job's function or cell used arrives as its :class:`Shard`: the driver
pickles it as a call to :func:`open_shard`, which reads the file the rank's Spark task wrote
(:mod:`hvd_magics.task.shard_files`).
"""
from __future__ import annotations

import math
import os
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from hvd_magics.errors import ShardError  # noqa: F401 - the error of this module's API
from hvd_magics.protocol import ENV_SHARDS
from hvd_magics.rank.api.shard_columns import column_array, is_vector, row_width
from hvd_magics.rank.instruments import step_split
from hvd_magics.rank.rank_job import rank_job

#: What :meth:`Shard.steps_per_epoch` does with the rows by which shards differ.
REPEAT, DROP = "repeat", "drop"
#: Arrow field names of an MLlib ``VectorUDT`` column (``type`` 0: sparse, 1: dense).
#: Called with ``(shard, steps, batch_size)`` as each pass over a shard's batches begins
#: (:func:`when_a_pass_begins`).
_pass_hooks: list[Callable[[Shard, int, int], None]] = []


def when_a_pass_begins(hook: Callable[[Shard, int, int], None]) -> None:
    """Call ``hook(shard, steps, batch_size)`` as each pass over a shard's batches begins (a
    plain loop's epochs are inferred from it: :mod:`hvd_magics.rank.integrations.plain_loops`
    hooks itself here once this module is imported; the api imports no integration)."""
    if hook not in _pass_hooks:
        _pass_hooks.append(hook)


def _describe_type(kind: Any) -> str:
    if is_vector(kind):
        return "vector"
    return str(kind)


class Shard:
    """The rows of one DataFrame that one rank trains on.

    Parameters
    ----------
    path : str or path
        The shard's Arrow IPC file (memory-mapped, not loaded).
    name : str
        What the DataFrame is called (shown by ``repr``).
    rank, size : int
        This rank and the number of ranks.
    rows_per_rank : sequence of int, optional
        Every rank's row count (rank order), for :meth:`steps_per_epoch`; this shard alone when
        not given.

    Examples
    --------
    >>> for batch in train.batches(64, shuffle=True, seed=epoch):   # doctest: +SKIP
    ...     step(batch["features"], batch["label"])
    """

    def __init__(self, path: str | os.PathLike, name: str = "DataFrame", rank: int = 0,
                 size: int = 1, rows_per_rank: Sequence[int] | None = None) -> None:
        import pyarrow as pa

        self.path = str(path)
        self.name = name
        self.rank = rank
        self.size = size
        source = pa.memory_map(self.path, "r")
        #: the whole mapped file, in which the table's buffers lie (see :class:`_MappedRows`)
        self._mapped = source.read_buffer()
        source.seek(0)
        self._table = pa.ipc.open_file(source).read_all()
        self.rows_per_rank = list(rows_per_rank) if rows_per_rank is not None else [len(self)]
        self._arrays: dict[str, np.ndarray] = {}
        #: columns read where they lie in the mapped file (:meth:`_rows_of`), made once
        self._in_place: dict[str, _MappedRows] = {}

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def columns(self) -> list[str]:
        """The column names, in order."""
        return list(self._table.column_names)

    @property
    def dtypes(self) -> dict[str, str]:
        """Column name to its Arrow type (``vector`` for MLlib vectors)."""
        return {f.name: _describe_type(f.type) for f in self._table.schema}

    @property
    def nbytes(self) -> int:
        """Bytes of the shard's Arrow data."""
        return self._table.nbytes

    def __repr__(self) -> str:
        columns = ", ".join(f"{n} {t}" for n, t in self.dtypes.items())
        return (f"<Shard of {self.name}: rank {self.rank} of {self.size}, {len(self):,} rows "
                f"of {sum(self.rows_per_rank):,}; columns: {columns}>")

    def to_pandas(self, columns: Sequence[str] | None = None) -> Any:
        """The shard (or ``columns`` of it) as a pandas DataFrame."""
        table = self._table.select(list(columns)) if columns is not None else self._table
        return table.to_pandas()

    def _column(self, column: str) -> Any:
        if column not in self._table.column_names:
            raise KeyError(f"{self.name} has no column {column!r}; it has {self.columns}")
        chunked = self._table.column(column)
        # one chunk (a file written in one go): a view of the mapped file, no copy
        return chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()

    def to_numpy(self, column: str) -> np.ndarray:
        """Column ``column`` as a numpy array: numbers as 1-D, vectors and arrays as 2-D floats.

        Raises
        ------
        KeyError
            For a column the DataFrame does not have.
        ShardError
            For a column whose type cannot become an array (named with its type), or an array
            column whose rows differ in length.
        """
        if column in self._arrays:
            return self._arrays[column]
        array = column_array(self.name, column, self._column(column))
        self._arrays[column] = array
        return array

    def _rows_of(self, column: str) -> np.ndarray | _MappedRows:
        """Column ``column`` to gather rows from by index (``array[rows]``): a list or dense
        vector column of a file written in several batches where it lies in the mapped file
        (:class:`_MappedRows`), any other as :meth:`to_numpy` gives it."""
        if column in self._in_place:
            return self._in_place[column]
        if column not in self._arrays and column in self._table.column_names:
            chunks = self._table.column(column).chunks
            lists = _dense_lists(chunks) if len(chunks) > 1 else None
            if lists is not None:
                mapped = _MappedRows.over(self._mapped, lists,
                                          row_width(self.name, column, lists))
                if mapped is not None:
                    self._in_place[column] = mapped
                    return mapped
        return self.to_numpy(column)

    def steps_per_epoch(self, batch_size: int, remainder: str = REPEAT) -> int:
        """Batches every rank runs in one epoch (the same on every rank).

        ``remainder`` says what happens to the rows by which shards differ (a few at most):
        ``"repeat"`` (the default) takes the largest shard's rows over ``batch_size``, rounded up,
        and a smaller shard starts over to fill its last batches, so every row is seen every epoch
        (as PyTorch's ``DistributedSampler`` does); ``"drop"`` takes only full batches of the
        smallest shard, so the rows past them are left out of that epoch (with shuffling, other
        rows each epoch).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if remainder == REPEAT:
            return math.ceil(max(self.rows_per_rank) / batch_size)
        if remainder != DROP:
            raise ValueError(f"remainder must be {REPEAT!r} or {DROP!r}, got {remainder!r}")
        steps = min(self.rows_per_rank) // batch_size
        if steps == 0:
            raise ValueError(f"batch_size={batch_size} is larger than the smallest shard of "
                             f"{self.name} ({min(self.rows_per_rank)} rows): with "
                             "remainder='drop' no full batch is left. Use a smaller batch_size "
                             "or fewer ranks.")
        return steps

    def rows_per_epoch(self, batch_size: int, remainder: str = REPEAT) -> int:
        """Rows every rank goes through in one epoch (see :meth:`steps_per_epoch`)."""
        steps = self.steps_per_epoch(batch_size, remainder)
        return max(self.rows_per_rank) if remainder == REPEAT else steps * batch_size

    def epoch_order(self, batch_size: int, shuffle: bool = False, seed: int | None = None,
                    remainder: str = REPEAT) -> np.ndarray:
        """The row indices of one epoch, in order (``rows_per_epoch`` of them)."""
        wanted = self.rows_per_epoch(batch_size, remainder)
        order = (np.random.default_rng(seed).permutation(len(self)) if shuffle
                 else np.arange(len(self)))
        if wanted > len(order):
            order = np.tile(order, math.ceil(wanted / len(order)))
        return order[:wanted]

    def batch_rows(self, batch_size: int, shuffle: bool = False, seed: int | None = None,
                   remainder: str = REPEAT) -> list[np.ndarray]:
        """The row indices of each batch of one epoch (``steps_per_epoch`` of them)."""
        order = self.epoch_order(batch_size, shuffle, seed, remainder)
        return np.split(order, range(batch_size, len(order), batch_size))

    def batches(self, batch_size: int, shuffle: bool = False, seed: int | None = None,
                columns: Sequence[str] | None = None, remainder: str = REPEAT
                ) -> Iterator[dict[str, np.ndarray]]:
        """One epoch of ``steps_per_epoch(batch_size, remainder)`` batches, each a dict of
        column arrays.

        ``shuffle`` permutes the rows (reproducibly with ``seed``: pass the epoch for a new
        order every epoch).
        """
        names = list(columns) if columns is not None else self.columns
        arrays = {name: self._rows_of(name) for name in names}
        batches = self.batch_rows(batch_size, shuffle, seed, remainder)
        for hook in _pass_hooks:
            hook(self, len(batches), batch_size)
        for rows in batches:
            with step_split.input_wait():
                batch = {name: array[rows] for name, array in arrays.items()}
            yield batch

    def feature_matrix(self, features: str | Sequence[str]) -> np.ndarray:
        """The columns ``features`` as one 2-D float32 array (several are concatenated)."""
        names = [features] if isinstance(features, str) else list(features)
        parts = [self.to_numpy(n) for n in names]
        parts = [p.reshape(len(p), -1).astype(np.float32, copy=False) for p in parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def feature_rows(self, features: str | Sequence[str]) -> Any:
        """The columns ``features`` to gather rows from: ``rows[idx]`` (``idx`` an index array)
        is a new 2-D float32 array, ``feature_matrix(features)[idx]``.

        One array or dense vector column of a shard that arrived in several Arrow batches (more
        than 10,000 rows, as Spark sends them) is read where it lies in the mapped file, so
        the column is never copied whole, as :meth:`feature_matrix` copies it; anything else
        is :meth:`feature_matrix`'s array.
        """
        names = [features] if isinstance(features, str) else list(features)
        if len(names) == 1:
            rows = self._rows_of(names[0])
            if isinstance(rows, _MappedRows):
                return rows
        return self.feature_matrix(names)

    def to_tf_dataset(self, features: str | Sequence[str], label: str | None = None,
                      batch_size: int = 32, shuffle: bool = False, seed: int | None = None,
                      remainder: str = REPEAT) -> Any:
        """A ``tf.data.Dataset`` of ``(features, label)`` batches (``features`` alone without a
        label), ``steps_per_epoch(batch_size, remainder)`` of them per pass; with ``shuffle``,
        each pass (each Keras epoch) in a new order, reproducible with ``seed``. Several feature
        columns are concatenated. Under ``tf.distribute`` the rows are this rank's already: set
        the dataset's ``auto_shard_policy`` to ``OFF``."""
        import itertools

        import tensorflow as tf

        x = self.feature_rows(features)
        arrays = [x] if label is None else [x, self.to_numpy(label)]
        self.steps_per_epoch(batch_size, remainder)  # a bad batch size fails here, not in fit
        passes = itertools.count()

        def one_pass() -> Iterator[Any]:
            # each batch gathered by numpy out of the mapped file, as `batches` does: tf.data's
            # per-row shuffle and batch of from_tensor_slices read 0.16 M rows/s of 784 floats
            number = next(passes)
            order_seed = None if seed is None else seed + number
            for rows in self.batch_rows(batch_size, shuffle, order_seed, remainder):
                batch = tuple(array[rows] for array in arrays)
                yield batch if label is not None else batch[0]

        specs = tuple(tf.TensorSpec((None, *a.shape[1:]), tf.as_dtype(a.dtype)) for a in arrays)
        return tf.data.Dataset.from_generator(
            one_pass, output_signature=specs if label is not None else specs[0]).prefetch(2)

    def to_torch(self, features: str | Sequence[str], label: str | None = None,
                 batch_size: int = 32, shuffle: bool = False, seed: int | None = None,
                 remainder: str = REPEAT) -> Any:
        """A PyTorch ``DataLoader`` of ``[features, label]`` batches (``[features]`` without a
        label), ``steps_per_epoch(batch_size, remainder)`` of them per epoch; with ``shuffle``,
        each epoch (each ``iter``) in a new order, reproducible with ``seed``. Features are
        float32; an integer label becomes int64 (class indices, as torch's losses want them)."""
        from torch.utils.data import DataLoader

        arrays = [self.feature_rows(features)]
        if label is not None:
            labels = self.to_numpy(label)
            if labels.dtype.kind in "iub":  # class indices: torch's losses want int64
                labels = labels.astype(np.int64)
            arrays.append(labels)
        batches = _EpochBatches(self, batch_size, shuffle, seed, remainder)
        return DataLoader(_RowGather(arrays, self), batch_size=None, sampler=batches)


def _dense_lists(chunks: Sequence[Any]) -> list[Any] | None:
    """The list arrays of a list column's chunks, or of a vector column's whose rows are all
    dense; ``None`` for any other column."""
    import pyarrow as pa

    kind = chunks[0].type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return list(chunks)
    if is_vector(kind) and all(c.field("type").null_count == 0 and
                                np.all(c.field("type").to_numpy() == 1) for c in chunks):
        return [c.field("values") for c in chunks]
    return None


class _MappedRows:
    """The rows of a 2-D column whose file holds several Arrow batches, gathered where they lie.

    A Spark task writes its shard as the batches arrive (10,000 rows each by default), so a
    column is in pieces: each batch's values are contiguous in the mapped file, and the batches
    lie apart. Joining them (``to_numpy``) copies the column: 2 s for 500,000 rows of 784 floats,
    and the rank's memory grows by the shard's size. Instead: a read-only window over the whole
    mapped file, whose row ``i`` is the ``width`` values from value ``i`` on (a view, no copy),
    and each row's start in it. ``rows[idx]`` is then one numpy gather, as on one array, at the
    same speed; the result is float32 as :meth:`Shard.to_numpy` gives it.
    """

    def __init__(self, window: np.ndarray, starts: np.ndarray) -> None:
        self._window = window
        self._starts = starts
        self.shape = (len(starts), window.shape[1])
        self.dtype = np.dtype(np.float32)
        self.ndim = 2

    @classmethod
    def over(cls, mapped: Any, lists: Sequence[Any], width: int) -> _MappedRows | None:
        """The rows of the list arrays ``lists`` (each of rows of ``width`` values) that lie in
        the buffer ``mapped``; ``None`` when they cannot be read in place (nulls, values that
        are not numbers, not in ``mapped``), and the caller joins them."""
        from numpy.lib.stride_tricks import as_strided

        if width == 0:
            return None
        try:
            values = [lst.flatten().to_numpy(zero_copy_only=True) for lst in lists]
        except Exception:  # noqa: BLE001 - nulls or types numpy cannot view: joined instead
            return None
        dtype = values[0].dtype
        if dtype.kind not in "fiu" or any(v.dtype != dtype for v in values):
            return None
        base = np.frombuffer(mapped, dtype=dtype, count=mapped.size // dtype.itemsize)
        starts = []
        for lst, array in zip(lists, values):
            first, misaligned = divmod(array.ctypes.data - base.ctypes.data, dtype.itemsize)
            if misaligned or first < 0 or first + len(lst) * width > len(base):
                return None
            starts.append(first + np.arange(len(lst), dtype=np.int64) * width)
        window = as_strided(base, shape=(len(base) - width + 1, width),
                            strides=(dtype.itemsize, dtype.itemsize), writeable=False)
        return cls(window, np.concatenate(starts))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        return self._window[self._starts[rows]].astype(np.float32, copy=False)


class _RowGather:
    """A map-style dataset whose item is a batch: the rows of an index array, gathered by numpy
    (one fancy-indexing copy out of the mapped file: 1.7 M rows/s of 784 floats, shuffled,
    against 1.2 M for indexing a torch tensor made from it), then made tensors by the loader
    without a copy."""

    def __init__(self, arrays: list[np.ndarray], shard: Shard | None = None) -> None:
        self._arrays = arrays
        #: The shard whose rows these are (a library that would deal them out again is told).
        self.shard = shard

    def __len__(self) -> int:
        return len(self._arrays[0])

    def __getitem__(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(array[rows] for array in self._arrays)


class _EpochBatches:
    """The row indices of each batch of one epoch per ``iter`` (a new order each epoch when
    shuffling, reproducible from the seed): a batch is gathered in one indexing operation."""

    def __init__(self, shard: Shard, batch_size: int, shuffle: bool, seed: int | None,
                 remainder: str) -> None:
        self._shard, self._batch_size, self._shuffle = shard, batch_size, shuffle
        self._seed, self._remainder, self._epoch = seed, remainder, 0
        self._steps = shard.steps_per_epoch(batch_size, remainder)

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[np.ndarray]:
        seed = None if self._seed is None else self._seed + self._epoch
        self._epoch += 1
        return iter(self._shard.batch_rows(self._batch_size, self._shuffle, seed,
                                           self._remainder))


_OPENED: dict[str, Shard] = {}


def opened() -> list[Shard]:
    """The shards of this job (a warm pool's cell) that this rank has opened."""
    paths = {d["path"] for d in rank_job().shards}
    return [shard for path, shard in _OPENED.items() if path in paths]


def open_shard(index: int) -> Shard:
    """The shard of the job's DataFrame number ``index`` on this rank (what a DataFrame in the
    job's function or cell becomes when the rank unpickles it)."""
    job = rank_job()
    described = {d["index"]: d for d in job.shards}
    if index not in described:
        raise RuntimeError("this process is not a rank of a job that sharded DataFrames "
                           f"(no {ENV_SHARDS} entry {index})")
    d = described[index]
    # By file: a warm pool's rank gets other files (and the same index) in later cells, and
    # one DataFrame read in several cells stays one Shard.
    if d["path"] not in _OPENED:
        _OPENED[d["path"]] = Shard(d["path"], d["name"],
                                   job.rank,
                                   len(d["rows_per_rank"]), d["rows_per_rank"])
    return _OPENED[d["path"]]
