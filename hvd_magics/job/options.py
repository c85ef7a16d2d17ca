"""The options of a job, checked in one place for ``HorovodRunner`` and ``%%horovod`` alike.

Each check returns the value as it will be used, or raises ``ValueError`` with a message that
names the option and the fix (the magic turns it into a one-line ``UsageError``).
"""
from __future__ import annotations

from typing import Any

#: Default seconds to wait for every rank process to start (Spark scheduling included).
DEFAULT_START_TIMEOUT_S = 120.0
#: ``driver_log_verbosity`` values: HorovodRunner's two, and ``debug`` (framework chatter too).
VERBOSITY_ALL = "all"
VERBOSITY_LOG_CALLBACK_ONLY = "log_callback_only"
VERBOSITY_DEBUG = "debug"
VERBOSITIES = (VERBOSITY_ALL, VERBOSITY_LOG_CALLBACK_ONLY, VERBOSITY_DEBUG)


def validate_np(np: Any) -> int:
    """``np`` as an int (``> 0``: Spark tasks, ``< 0``: processes on the driver)."""
    if isinstance(np, bool) or not isinstance(np, int):
        raise ValueError(f"np must be a whole number of ranks, got {np!r}")
    if np == 0:
        raise ValueError("np=0 runs nothing: use np>0 for ranks as Spark tasks, "
                         "or np<0 for -np ranks on the driver")
    return np


def validate_start_timeout(seconds: Any) -> float:
    """The start timeout as positive seconds."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise ValueError(f"start_timeout (--start-timeout) must be a positive number of seconds, "
                         f"got {seconds!r}")
    return value


def validate_verbosity(verbosity: Any) -> str:
    """One of :data:`VERBOSITIES`."""
    if verbosity not in VERBOSITIES:
        raise ValueError(f"driver_log_verbosity must be one of {VERBOSITIES}, got {verbosity!r}")
    return verbosity
