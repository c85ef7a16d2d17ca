"""Keep a warm pool's (or a background job's) Spark job out of pyspark's Ctrl-C handler (driver
side, classic Spark).

A classic ``SparkContext`` made in the main thread replaces the ``SIGINT`` handler with one that
cancels *every* Spark job and raises ``KeyboardInterrupt``. The notebook's stop button is a
``SIGINT``: it cancelled the pool's long-lived stage too, so interrupting a cell on a pool lost
the pool and every variable its ranks kept (while the cell said they were kept). While pools
live, :func:`_handler` takes pyspark's place: it cancels every active job except the pools'
(known by their job groups) and raises ``KeyboardInterrupt`` as before; pyspark's handler is
put back when the last pool ends in the main thread (ended in another thread, say by its idle
timeout, ours stays, and with no pool left it cancels every job, as pyspark's does).
"""
from __future__ import annotations

import signal
import threading
from typing import Any, NoReturn

_lock = threading.Lock()
_state: dict[str, Any] = {"groups": set(), "previous": None, "sc": None}


def _handler(signum: int, frame: Any) -> NoReturn:  # noqa: ARG001
    sc = _state["sc"]
    try:
        tracker = sc.statusTracker()
        kept = {job for group in list(_state["groups"])
                for job in tracker.getJobIdsForGroup(group)}
        for job in tracker.getActiveJobsIds():
            if job not in kept:
                sc._jsc.sc().cancelJob(job)  # noqa: SLF001
    finally:
        raise KeyboardInterrupt()


def install(sc: Any) -> bool:
    """Put our handler in pyspark's place now (from the main thread), so that a job whose
    stage is submitted from another thread (a background job's) can be kept by
    :func:`protect`; with no group kept it cancels every job, as pyspark's does. Whether it
    is in place."""
    with _lock:
        if signal.getsignal(signal.SIGINT) is _handler:
            _state["sc"] = sc
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        _state["previous"] = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, _handler)
        _state["sc"] = sc
    return True


def protect(sc: Any, group: str) -> bool:
    """Keep the jobs of ``group`` (a pool's, a background job's) from being cancelled by an
    interrupt; whether it could (only the main thread sets signal handlers: from another
    thread, only once :func:`install` put ours in place)."""
    if not install(sc):
        return False
    with _lock:
        _state["groups"].add(group)
    return True


def release(group: str) -> None:
    """The pool of ``group`` ended: its jobs are no longer kept; the last one puts pyspark's
    handler back (when called in the main thread)."""
    with _lock:
        _state["groups"].discard(group)
        if _state["groups"] or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is _handler and _state["previous"] is not None:
            signal.signal(signal.SIGINT, _state["previous"])
        _state["previous"] = None
