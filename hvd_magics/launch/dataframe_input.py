"""Spark DataFrames a job reads, turned into the input of its barrier stage (driver side).

Each DataFrame the job uses becomes a *source*. Its rows reach the ranks without passing through
the driver or through Python before the barrier stage, in one Spark shuffle:

1. Every row of source ``s`` becomes ``(__source = s, __key, __s<s> = struct(all its columns))``.
   ``__key`` sends the row to barrier task ``(row's index in its partition + partition index) mod
   np`` (:func:`partition_keys` picks, per task, a key that Spark's hash partitioning sends
   there), so each input partition is dealt out evenly, its remainder rows rotating with the
   partition: shards differ by a few rows at most, whatever the partitions' sizes.
2. The sources are unioned by name (a row has nulls in the other sources' struct columns) and
   repartitioned by ``__key`` into ``np`` partitions, each sorted by source and by where its
   rows were (``__order``: partition and row): the shuffle hands a task its rows in the order
   its fetches complete, which on a cluster differs from one job to the next, and a shard's
   order is what a seeded shuffle of its batches permutes (a resumed fit, a second run, must
   see the same batches). The barrier stage runs on them. Each task
   writes its rows of each source to a local Arrow file (:mod:`hvd_magics.task.shard_files`), and
   its rank reads that file as a :class:`hvd_magics.rank.api.shard.Shard`.

Only the rows' placement depends on Spark's hash function: were it ever to differ, the shards
would still be disjoint and cover every row once, only less even.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

from hvd_magics.errors import PayloadError
from hvd_magics.protocol import KEY_COLUMN, ORDER_COLUMN, ROW_COLUMN, SOURCE_COLUMN
#: The seed of Spark's ``HashPartitioning`` (``Murmur3Hash``).
SPARK_HASH_SEED = 42


def is_dataframe(value: Any) -> bool:
    """Whether ``value`` is a Spark DataFrame (classic or Spark Connect); never imports pyspark."""
    module = sys.modules.get("pyspark.sql.dataframe")
    return module is not None and isinstance(value, module.DataFrame)


@dataclass
class DataFrameSource:
    """One DataFrame a job reads.

    Attributes
    ----------
    index : int
        Its position among the job's sources (the ``__source`` column).
    name : str
        What the user calls it (the notebook variable or the keyword), shown by the shard.
    frame : DataFrame
        The DataFrame itself (stays on the driver).
    no_nulls : dict
        Its columns that must hold no nulls, each with what an error calls it (the estimator's
        ``{"label": "labelCol"}``): counted as the rows reach the tasks, and the job is refused
        before any rank gets it when one holds some.
    """

    index: int
    name: str
    frame: Any
    no_nulls: dict[str, str] = field(default_factory=dict)


class DataFrameSources:
    """The DataFrames of one job, in first-seen order, found by identity."""

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self._names = dict(names or {})
        self.sources: list[DataFrameSource] = []

    def index_of(self, frame: Any) -> int:
        """The source index of ``frame`` (added on first sight)."""
        for source in self.sources:
            if source.frame is frame:
                return source.index
        index = len(self.sources)
        name = self._names.get(id(frame), f"DataFrame {index}")
        self.sources.append(DataFrameSource(index, name, frame))
        return index

    def __len__(self) -> int:
        return len(self.sources)

    def __iter__(self):  # noqa: ANN204
        return iter(self.sources)


def names_by_id(named: Mapping[str, Any]) -> dict[int, str]:
    """``id(DataFrame) -> name`` for the DataFrames among ``named`` values."""
    return {id(value): name for name, value in named.items() if is_dataframe(value)}


# -- which columns a shard can give as arrays -----------------------------------------------------

def _column_problem(kind: Any) -> str | None:
    """Why a Spark column type cannot become numpy arrays on the ranks, or ``None``."""
    from pyspark.sql import types as T

    if isinstance(kind, (T.NumericType, T.BooleanType, T.StringType, T.BinaryType,
                         T.DateType, T.TimestampType, T.TimestampNTZType)):
        if isinstance(kind, T.DecimalType):
            return "decimals do not become float arrays; cast it to double"
        return None
    if isinstance(kind, T.UserDefinedType):
        if type(kind).__name__ == "VectorUDT":
            return None
        return f"the user-defined type {type(kind).__name__} is not known to the ranks"
    if isinstance(kind, T.ArrayType):
        inner = kind.elementType
        if isinstance(inner, (T.NumericType, T.BooleanType)) and not isinstance(
                inner, T.DecimalType):
            return None
        return (f"arrays of {inner.simpleString()} do not become a 2-D float array; use arrays "
                "of numbers (flatten nested arrays, e.g. with F.flatten)")
    return f"{kind.simpleString()} columns do not become arrays; select or cast the columns"


def check_columns(source: DataFrameSource) -> None:
    """Refuse, before anything starts, a DataFrame with a column its shard cannot give as arrays.

    Raises
    ------
    PayloadError
        Naming the DataFrame, the column, its type and the fix.
    """
    fields = source.frame.schema.fields
    if not fields:
        raise PayloadError(f"the DataFrame {source.name!r} has no columns")
    names = [column.name for column in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PayloadError(f"the DataFrame {source.name!r} has more than one column named "
                           f"{', '.join(map(repr, twice))}. Fix: rename or drop them "
                           "(withColumnRenamed) before the job.")
    for column in fields:
        problem = _column_problem(column.dataType)
        if problem is not None:
            raise PayloadError(
                f"column {column.name!r} of the DataFrame {source.name!r} has type "
                f"{column.dataType.simpleString()}: {problem}. Fix: "
                f"{source.name}.drop({column.name!r}) or cast it before the job.")


def common_session(sources: DataFrameSources) -> Any:
    """The one SparkSession every source belongs to.

    Raises
    ------
    PayloadError
        When the DataFrames come from different sessions.
    """
    sessions = {id(s.frame.sparkSession): s.frame.sparkSession for s in sources}
    if len(sessions) > 1:
        raise PayloadError("the job's DataFrames belong to different SparkSessions; create them "
                           "all from one session")
    return next(iter(sessions.values()))


# -- the barrier stage's input ---------------------------------------------------------------------

_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash()`` of an ``int`` column value (Murmur3 x86 32-bit, ``hashInt``)."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotl(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@functools.lru_cache(maxsize=64)
def partition_keys(np: int) -> tuple[int, ...]:
    """For each partition ``p < np``, an ``int`` key that ``repartition(np, key)`` sends to
    ``p``."""
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < np:
        keys.setdefault(spark_hash_int(candidate) % np, candidate)
        candidate += 1
    return tuple(keys[p] for p in range(np))


def _tagged(source: DataFrameSource, np: int) -> Any:
    """``source``'s rows as ``(__source, __key, __s<index>)``."""
    from pyspark.sql import functions as F

    keys = F.array(*[F.lit(k) for k in partition_keys(np)])
    where = F.monotonically_increasing_id()  # partition << 33 | row in partition
    row_in_partition = where.bitwiseAND((1 << 33) - 1)
    task = (row_in_partition + F.spark_partition_id()) % np
    columns = [F.col(f"`{name}`") for name in source.frame.columns]
    return source.frame.select(F.lit(source.index).alias(SOURCE_COLUMN),
                               F.element_at(keys, (task + 1).cast("int")).alias(KEY_COLUMN),
                               F.struct(*columns).alias(ROW_COLUMN.format(source.index)),
                               where.alias(ORDER_COLUMN))


def sharded_input(sources: Iterable[DataFrameSource], np: int) -> Any:
    """The DataFrame whose ``np`` partitions hold the rows of every source, partition ``p``
    those of the rank that barrier task ``p`` hosts."""
    tagged = [_tagged(source, np) for source in sources]
    combined = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
    return combined.repartition(np, KEY_COLUMN).sortWithinPartitions(SOURCE_COLUMN,
                                                                     ORDER_COLUMN)
