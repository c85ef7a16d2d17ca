"""Serialising what a job ships to its ranks, with errors that name what cannot travel."""
from __future__ import annotations

import inspect
import io
import socket
import threading
import types
import warnings
from typing import Any, Callable, Mapping

import cloudpickle

from hvd_magics.errors import PayloadError

#: A payload larger than this gets a warning with its size.
LARGE_PAYLOAD_BYTES = 10 * 1024 * 1024

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_ADVICE = "create it inside the function (or the %%horovod cell) so that each rank makes its own"


def why_not_shippable(value: Any) -> str | None:
    """Say why ``value`` cannot travel to a rank, or ``None`` when it can be pickled."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if kind.startswith("pyspark.") and type(value).__name__ in (
            "SparkSession", "SparkContext", "DataFrame", "RDD", "SQLContext"):
        return f"it is a {type(value).__name__}, which lives on the driver only"
    if isinstance(value, io.IOBase):
        return "it is an open file or stream"
    if isinstance(value, socket.socket):
        return "it is a socket"
    if isinstance(value, _LOCK_TYPES):
        return "it is a lock"
    if isinstance(value, types.GeneratorType):
        return "it is a generator (its position cannot be copied)"
    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is reported by name
        return f"it cannot be pickled ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def find_unshippable(named: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first ``(name, reason)`` among ``named`` values that cannot travel, or ``None``."""
    for name, value in named.items():
        reason = why_not_shippable(value)
        if reason is not None:
            return name, reason
    return None


def _function_references(fn: Callable) -> dict[str, Any]:
    if not inspect.isfunction(fn):
        return {}
    refs = inspect.getclosurevars(fn)
    return {**refs.nonlocals, **refs.globals}


def serialize_job(main: Callable, kwargs: Mapping[str, Any]) -> bytes:
    """Pickle ``(main, kwargs)`` for the ranks.

    Raises
    ------
    PayloadError
        Naming the argument or the variable ``main`` uses that cannot be pickled.
    """
    if not callable(main):
        raise PayloadError(f"main must be a function, got {type(main).__name__}")
    culprit = find_unshippable({f"argument {k!r}": v for k, v in kwargs.items()})
    culprit = culprit or find_unshippable(
        {f"variable {k!r} used by {getattr(main, '__name__', 'main')}()": v
         for k, v in _function_references(main).items() if not inspect.ismodule(v)})
    if culprit is not None:
        name, reason = culprit
        raise PayloadError(f"Cannot ship {name} to the ranks: {reason}. Fix: {_ADVICE}.")
    try:
        blob = cloudpickle.dumps((main, dict(kwargs)))
    except Exception as exc:  # noqa: BLE001
        raise PayloadError(f"Cannot pickle the job for the ranks: {type(exc).__name__}: {exc}. "
                           f"Fix: {_ADVICE}.") from exc
    if len(blob) > LARGE_PAYLOAD_BYTES:
        warnings.warn(
            f"The job ships {len(blob) / 1e6:.1f} MB to every rank; load large data inside the "
            "function (from a file or table) instead of capturing it.", stacklevel=3)
    return blob
