"""What :class:`HorovodEstimator` refuses before any rank starts: missing columns, column types
that cannot become tensors, params out of range. (Nulls in the feature and label columns are
counted by the barrier tasks as the rows arrive: ``DataFrameSource.no_nulls``.)"""
from __future__ import annotations

from typing import Any

from hvd_magics.errors import EstimatorInputError

_NUMBERS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")


def _kind(data_type: Any) -> str:
    """``"number"``, ``"vector"``, ``"array"`` (of numbers) or ``"other"``."""
    name = type(data_type).__name__
    if name in _NUMBERS:
        return "number"
    if name == "VectorUDT":
        return "vector"
    if name == "ArrayType" and type(data_type.elementType).__name__ in _NUMBERS:
        return "array"
    return "other"


def column_kinds(frame: Any, columns: list[str], role: dict[str, str]) -> dict[str, str]:
    """The kind of each column (see :func:`_kind`).

    Raises
    ------
    EstimatorInputError
        For a column that is not there, or whose type cannot become a tensor.
    """
    fields = {field.name: field.dataType for field in frame.schema.fields}
    kinds = {}
    for column in columns:
        _require(fields, column, role[column])
        kind = _kind(fields[column])
        if kind == "other":
            raise EstimatorInputError(
                f"{role[column]} {column!r} has type {fields[column].simpleString()}, which cannot "
                "become a tensor. Fix: use a vector (VectorAssembler), an array of numbers or a "
                "number column.")
        kinds[column] = kind
    return kinds


def _require(fields: dict[str, Any], column: str, role: str) -> None:
    if column not in fields:
        raise EstimatorInputError(
            f"{role} {column!r} is not a column of the DataFrame (its columns: "
            f"{', '.join(fields)}). Fix: set {role.split()[0]} to one of them.")


def check_boolean(frame: Any, column: str) -> None:
    """Refuse an ``isValidationCol`` that is missing or not boolean."""
    fields = {field.name: field.dataType for field in frame.schema.fields}
    _require(fields, column, "isValidationCol")
    if type(fields[column]).__name__ != "BooleanType":
        raise EstimatorInputError(f"isValidationCol {column!r} has type "
                                  f"{fields[column].simpleString()}; it must be boolean. Fix: "
                                  f"df.withColumn({column!r}, F.col({column!r}).cast('boolean'))")


def check_params(batch_size: int, epochs: int, max_steps: int | None, fraction: float,
                 validation_col: str | None, np: int | None) -> None:
    if batch_size < 1:
        raise EstimatorInputError(f"batchSize must be at least 1, got {batch_size}")
    if epochs < 1:
        raise EstimatorInputError(f"epochs must be at least 1, got {epochs}")
    if max_steps is not None and max_steps < 1:
        raise EstimatorInputError(f"maxSteps must be at least 1 (or None), got {max_steps}")
    if not 0.0 <= fraction < 1.0:
        raise EstimatorInputError(f"validationFraction must be in [0, 1), got {fraction}")
    if fraction > 0 and validation_col:
        raise EstimatorInputError("set validationFraction or isValidationCol, not both")
    if np is not None and np < 1:
        raise EstimatorInputError(f"np must be at least 1 (ranks as Spark tasks), got {np}")


def check_model_dir(path: str) -> None:
    """Refuse a ``modelDir`` that is a file or that cannot be written, before any rank starts.

    The folder is made here when it is missing (the ranks write their checkpoints and the
    model into it), and a probe file is written and removed.

    Raises
    ------
    EstimatorInputError
        Naming the path, what is wrong with it and the fix.
    """
    import os
    import tempfile

    if os.path.exists(path) and not os.path.isdir(path):
        raise EstimatorInputError(
            f"modelDir {path!r} is an existing file, not a folder. Fix: set modelDir to a "
            "folder (the fit writes its checkpoints and the model there), or remove the file.")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hvd_magics-probe-"):
            pass
    except OSError as exc:
        raise EstimatorInputError(
            f"modelDir {path!r} cannot be written ({type(exc).__name__}: {exc.strerror or exc})."
            " Fix: set modelDir to a folder this user can write (on a cluster, shared storage "
            "that every executor reaches, such as /dbfs/...).") from None
