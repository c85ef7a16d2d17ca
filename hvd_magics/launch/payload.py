"""Serialising what a job ships to its ranks, with errors that name what cannot travel.

A Spark DataFrame among the values travels as a reference: the pickle calls
:func:`hvd_magics.rank.api.shard.open_shard` on the rank, which gives that rank's shard of it; the
DataFrame itself becomes a source of the job's barrier stage
(:mod:`hvd_magics.launch.dataframe_input`).
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import io
import socket
import threading
import types
import warnings
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

import cloudpickle

from hvd_magics.errors import PayloadError, sentence
from hvd_magics.launch.dataframe_input import DataFrameSources, is_dataframe, names_by_id
from hvd_magics.common.kept_values import SentValue
from hvd_magics.rank.api.shard import open_shard

#: A payload larger than this gets a warning with its size.
LARGE_PAYLOAD_BYTES = 10 * 1024 * 1024

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_ADVICE = "create it inside the function (or the %%horovod cell) so that each rank makes its own"


#: What cloudpickle 3.1.3 and later name the file of every function pickled by value.
_DYNAMIC_FILE = "<dynamic-code>"


class _JobPickler(cloudpickle.CloudPickler):
    """cloudpickle, with every Spark DataFrame pickled as its rank's shard, and the code of a
    function pickled by value keeping the name of its file.

    cloudpickle 3.1.3 names that file ``<dynamic-code>`` (so that pickles are the same wherever
    the function was defined). A rank then cannot find the function's source: its tracebacks and
    stacks lose the lines of the user's code, which they no longer count as the user's, and
    TensorFlow's AutoGraph cannot convert a ``tf.function`` written in it (a Python ``if`` on a
    tensor fails with ``OperatorNotAllowedInGraphError``).
    """

    def __init__(self, file: io.BytesIO, sources: DataFrameSources) -> None:
        super().__init__(file)
        self.sources = sources

    def reducer_override(self, obj: Any) -> Any:
        if is_dataframe(obj):
            return open_shard, (self.sources.index_of(obj),)
        if isinstance(obj, types.CodeType):
            constructor, args = self.dispatch_table[types.CodeType](obj)
            return constructor, tuple(obj.co_filename if isinstance(a, str) and a == _DYNAMIC_FILE
                                      else a for a in args)
        return super().reducer_override(obj)


def dumps(value: Any, sources: DataFrameSources | None = None) -> bytes:
    """Pickle ``value`` for a rank; the DataFrames in it are added to ``sources``."""
    buffer = io.BytesIO()
    _JobPickler(buffer, sources if sources is not None else DataFrameSources()).dump(value)
    return buffer.getvalue()


def sent_value(value: Any) -> SentValue | None:
    """``value`` pickled with its digest, to travel to a warm pool's ranks; ``None`` when it
    cannot be pickled (:func:`serialize_job` says why) or holds a DataFrame (dealt as shards)."""
    found = DataFrameSources()
    try:
        pickled = dumps(value, found)
    except Exception:  # noqa: BLE001 - serialize_job names the value and the reason
        return None
    if len(found):
        return None
    return SentValue(hashlib.blake2b(pickled, digest_size=16).hexdigest(), pickled)


@dataclass
class JobPayload:
    """What a job ships: the pickled ``(main, kwargs)`` and the DataFrames it reads."""

    blob: bytes
    sources: DataFrameSources = field(default_factory=DataFrameSources)


def _kind_reason(value: Any) -> str | None:
    """Why ``value``'s type can never travel (cheap: no pickling), or ``None``."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if kind.startswith("pyspark.") and type(value).__name__ in (
            "SparkSession", "SparkContext", "RDD", "SQLContext"):
        return f"it is a {type(value).__name__}, which lives on the driver only"
    if isinstance(value, io.IOBase):
        return "it is an open file or stream"
    if isinstance(value, socket.socket):
        return "it is a socket"
    if isinstance(value, _LOCK_TYPES):
        return "it is a lock"
    if isinstance(value, types.GeneratorType):
        return "it is a generator (its position cannot be copied)"
    return None


def why_not_shippable(value: Any) -> str | None:
    """Say why ``value`` cannot travel to a rank, or ``None`` when it can be pickled (a Spark
    DataFrame can: it arrives as the rank's shard)."""
    reason = _kind_reason(value)
    if reason is not None:
        return reason
    try:
        dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is reported by name
        return f"it cannot be pickled ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def function_references(fn: Callable) -> dict[str, Any]:
    if not inspect.isfunction(fn):
        return {}
    refs = inspect.getclosurevars(fn)
    return {**refs.nonlocals, **refs.globals}


def serialize_job(main: Callable, kwargs: Mapping[str, Any],
                  names: Mapping[str, Any] | None = None,
                  labels: Mapping[str, Any] | None = None, advice: str = _ADVICE) -> JobPayload:
    """Pickle ``(main, kwargs)`` for the ranks, once.

    ``names`` (default: ``kwargs`` and the globals ``main`` uses) name the DataFrames found, as
    their shards show them. ``labels`` (default: the arguments and the variables ``main`` uses)
    say, by the words an error names them with, which values to blame when the job cannot be
    pickled; only then is each pickled on its own, to find the one.

    Raises
    ------
    PayloadError
        Naming the argument or the variable ``main`` uses that cannot be pickled, and ``advice``.
    """
    if not callable(main):
        raise PayloadError(f"main must be a function, got {type(main).__name__}")
    if labels is None or names is None:
        references = {k: v for k, v in function_references(main).items()
                      if not inspect.ismodule(v)}
        if labels is None:
            fn = getattr(main, "__name__", "main")
            labels = {**{f"argument {k!r}": v for k, v in kwargs.items()},
                      **{f"variable {k!r} used by {fn}()": v for k, v in references.items()}}
        if names is None:
            names = {**references, **kwargs}
    culprit = next(((label, reason) for label, value in labels.items()
                    if (reason := _kind_reason(value)) is not None), None)
    sources = DataFrameSources(names_by_id(names))
    blob = b""
    if culprit is None:
        try:
            blob = dumps((main, dict(kwargs)), sources)
        except Exception as exc:
            culprit = next(((label, reason) for label, value in labels.items()
                            if (reason := why_not_shippable(value)) is not None), None)
            if culprit is None:
                raise PayloadError(f"Cannot pickle the job for the ranks: {type(exc).__name__}: "
                                   f"{sentence(str(exc))} Fix: {advice}.") from exc
    if culprit is not None:
        label, reason = culprit
        raise PayloadError(f"Cannot ship {label} to the ranks: {reason}. Fix: {advice}.")
    if len(blob) > LARGE_PAYLOAD_BYTES:
        warnings.warn(
            f"The job ships {len(blob) / 1e6:.1f} MB to every rank; load large data inside the "
            "function (from a file or table, or pass a Spark DataFrame: each rank gets its "
            "shard) instead of capturing it.", stacklevel=3)
    return JobPayload(blob, sources)


def leading_imports(source: str | ast.Module) -> list[str]:
    """The modules a cell (or a function's source, or its parsed tree) imports before anything
    else it does.

    A rank imports them while the launch goes on: only these, because a later import may depend
    on what the code did first (``os.environ["KERAS_BACKEND"] = ...`` before ``import keras``).
    """
    import textwrap

    if isinstance(source, str):
        try:
            tree = ast.parse(textwrap.dedent(source))
        except SyntaxError:
            return []
    else:
        tree = source
    body = tree.body
    if len(body) == 1 and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = body[0].body
    names: list[str] = []
    for index, node in enumerate(body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module != "__future__":
            names.append(node.module)
        else:
            break
    return list(dict.fromkeys(names))
