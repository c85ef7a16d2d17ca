"""Values that travel back from rank 0: encoded on the rank, decoded in the notebook only when safe.

A job sends back one or more *parts*: ``value`` (what ``main`` returned, or the cell's last
expression) and, for ``%%horovod --return a,b``, one part per name. Each part carries its type and
repr, and its pickle unless it could not be pickled or is over the size limit.

The notebook decodes a part in one of two ways:

- ``strict`` (``HorovodRunner.run``'s value, ``--return`` names: the user asked for the object):
  decode it, or raise :class:`ResultDecodeError` naming the type, the reason and the fix.
- guarded (the cell's last value, which the user did not ask for): decode it only when that
  imports nothing new but the standard library, numpy and pandas. Otherwise (or when the rank
  could not pickle it) the notebook gets a :class:`RemoteValue` that shows the rank's repr and says
  how to bring the object back. So a cell ending in ``model.fit(...)`` never imports TensorFlow
  (or takes a GPU) in the notebook. A pickle that fails to decode raises as in ``strict``.
"""
from __future__ import annotations

import base64
import io
import os
import pickle
import sys
from typing import Any

from hvd_magics.errors import ResultDecodeError
from hvd_magics.protocol import ENV_MAX_RESULT_MB

#: Largest pickled value (per job) that travels back to the notebook, unless raised.
DEFAULT_MAX_RESULT_MB = 256
#: Highest limit that can be set (the event channel's frame limit, less base64's growth).
HIGHEST_MAX_RESULT_MB = 1500
#: Characters of a value's repr kept.
REPR_CHARS = 2000
#: Modules a guarded decode may import besides the standard library and what is already imported.
LIGHT_MODULES = frozenset({"numpy", "pandas", "cloudpickle"})
#: The part that holds the job's value.
VALUE = "value"
#: Parts named ``return:NAME`` hold the variables ``%%horovod --return NAME`` brings back.
RETURN_PREFIX = "return:"


class Parts(dict):
    """Values a job sends back one by one: ``{"value": ..., "<name>": ...}``."""


def max_result_bytes() -> int:
    """The size limit of the values one job sends back, from the rank's environment."""
    try:
        megabytes = float(os.environ.get(ENV_MAX_RESULT_MB, DEFAULT_MAX_RESULT_MB))
    except ValueError:
        megabytes = DEFAULT_MAX_RESULT_MB
    return int(min(max(megabytes, 0), HIGHEST_MAX_RESULT_MB) * 1e6)


def type_name(value: Any) -> str:
    """``module.QualName`` of ``value``'s type (``int`` for builtins)."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def safe_repr(value: Any, limit: int = REPR_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters; never raises."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not fail the job
        text = f"<{type_name(value)} (repr failed: {type(exc).__name__})>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def unwrapped(value: Any) -> Any:
    """The model a ``DistributedDataParallel`` wraps (one cannot be rebuilt outside its process
    group, so it comes back as its ``.module``); any other value as it is."""
    parallel = sys.modules.get("torch.nn.parallel")
    ddp = getattr(parallel, "DistributedDataParallel", None)
    return value.module if ddp is not None and isinstance(value, ddp) else value


def encode_parts(result: Any) -> dict[str, dict[str, Any]]:
    """Encode what ``main`` returned (a :class:`Parts`, or one value) for the trip back.

    A part that cannot be pickled, or that would take the job over the size limit, travels as
    its type and repr with an ``error`` instead of a ``blob``. A DDP-wrapped model travels as the
    model it wraps (:func:`unwrapped`).
    """
    import cloudpickle

    parts = result if isinstance(result, Parts) else Parts({VALUE: result})
    budget = max_result_bytes()
    encoded: dict[str, dict[str, Any]] = {}
    for name, value in parts.items():
        value = unwrapped(value)
        part: dict[str, Any] = {"type": type_name(value), "repr": safe_repr(value)}
        try:
            blob = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - reported by type and reason
            part["error"] = f"it cannot be pickled ({type(exc).__name__}: {str(exc)[:300]})"
        else:
            part["bytes"] = len(blob)
            if len(blob) > budget:
                part["error"] = (f"it is {len(blob) / 1e6:.1f} MB pickled, over the "
                                 f"{max_result_bytes() / 1e6:.0f} MB a job sends back to the "
                                 "notebook")
                part["too_large"] = True
            else:
                budget -= len(blob)
                part["blob"] = base64.b64encode(blob).decode()
        encoded[name] = part
    return encoded


def _describe(name: str, part: dict[str, Any]) -> str:
    what = "rank 0's value" if name == VALUE else f"rank 0's {name.removeprefix(RETURN_PREFIX)!r}"
    return f"{what} (a {part.get('type', '?')})"


def decode_strict(name: str, part: dict[str, Any]) -> Any:
    """Decode a part the user asked for; raise :class:`ResultDecodeError` when it cannot be."""
    if "blob" not in part:
        fix = ("write it to storage (a file on shared storage, a table) and return its path"
               + (f", or raise the limit with the ranks' environment variable {ENV_MAX_RESULT_MB}"
                  if part.get("too_large") else ""))
        raise ResultDecodeError(f"{_describe(name, part)} cannot come back to the notebook: "
                                f"{part.get('error', 'nothing was sent')}. Fix: {fix}.")
    try:
        return pickle.loads(base64.b64decode(part["blob"]))
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is named
        raise ResultDecodeError(
            f"{_describe(name, part)} could not be decoded in the notebook "
            f"({type(exc).__name__}: {str(exc)[:300]}). Fix: return plain data (numbers, "
            "lists, dicts, numpy arrays), or save the object to a file and return its path."
        ) from None


class RemoteValue:
    """A value that stayed on rank 0: shows the rank's repr and why it did not come back."""

    def __init__(self, type_name: str, text: str, reason: str) -> None:
        self.type_name = type_name
        self.text = text
        self.reason = reason

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"{self.text}\n({self.reason})")


class _WouldImport(Exception):
    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.module = module


def _allowed(module: str) -> bool:
    top = module.partition(".")[0]
    return (module in sys.modules or top in LIGHT_MODULES
            or top in getattr(sys, "stdlib_module_names", ()))


class _GuardedUnpickler(pickle.Unpickler):
    """Unpickle only what imports nothing heavy that the notebook has not imported yet."""

    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module):
            raise _WouldImport(module)
        found = super().find_class(module, name)
        if module.startswith("cloudpickle") and name in ("subimport", "dynamic_subimport"):
            return _guarded_subimport(found)
        return found


def _guarded_subimport(subimport: Any) -> Any:
    def guarded(module_name: str, *args: Any) -> Any:
        if not _allowed(module_name):
            raise _WouldImport(module_name)
        return subimport(module_name, *args)
    return guarded


def decode_guarded(name: str, part: dict[str, Any], hint: str) -> Any:
    """Decode a part the user did not ask for, or return a :class:`RemoteValue` for it.

    ``hint`` says how to bring such an object back (shown in the :class:`RemoteValue`).
    """
    type_text, text = part.get("type", "?"), part.get("repr", "")
    if "blob" not in part:
        return RemoteValue(type_text, text, f"{_describe(name, part)} stayed on the rank: "
                                             f"{part.get('error', 'nothing was sent')}")
    try:
        return _GuardedUnpickler(io.BytesIO(base64.b64decode(part["blob"]))).load()
    except _WouldImport as exc:
        return RemoteValue(type_text, text,
                           f"{_describe(name, part)} stayed on the rank: bringing it here would "
                           f"import {exc.module.partition('.')[0]} into the notebook. {hint}")
    except Exception:  # noqa: BLE001 - named the same way as a value the user asked for
        return decode_strict(name, part)
