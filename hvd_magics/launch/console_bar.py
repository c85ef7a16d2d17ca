"""Spark's console progress bar, off while a job's stage runs (driver side, classic Spark).

Spark's ``ConsoleProgressBar`` draws every stage that has run for half a second, and draws it
again every minute even when nothing changed. In a Jupyter kernel the JVM's standard error is the
cell's: a cold job's bar (``[Stage 0:> (0 + 2) / 2]``) landed in its cell beside the dashboard,
and a pool's barrier stage, which runs for hours, landed in whatever cell ran each minute.
``spark.ui.showConsoleProgress`` is read only when the SparkContext starts, so while a job or a
pool runs the bar is stopped, and a new one is put in its place when the last of them ends
(through the context's ``_progressBar`` field; when that field is not there, the bar stays as
it is).
"""
from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
#: Jobs and pools that asked for the bar to be off, and the context it was taken from.
_paused: dict[str, Any] = {"count": 0, "sc": None}


def _field(jsc: Any) -> Any:
    field = jsc.getClass().getDeclaredField("_progressBar")
    field.setAccessible(True)
    return field


def pause(sc: Any) -> bool:
    """Stop the console progress bar of ``sc`` (a ``SparkContext``) until :func:`resume`;
    whether this call counts (the bar was on, or another job had already stopped it)."""
    with _lock:
        if _paused["count"]:
            _paused["count"] += 1
            return True
        try:
            jsc = sc._jsc.sc()  # noqa: SLF001 - the JVM SparkContext
            field = _field(jsc)
            bar = field.get(jsc)
            if not bar.isDefined():
                return False  # spark.ui.showConsoleProgress is off: nothing to do
            bar.get().stop()
            field.set(jsc, sc._jvm.scala.Option.empty())  # noqa: SLF001
        except Exception:  # noqa: BLE001 - another Spark: leave its bar as it is
            return False
        _paused.update(count=1, sc=sc)
        return True


def resume() -> None:
    """A job or pool that paused the bar ended: the last one puts a new bar in place."""
    with _lock:
        if not _paused["count"]:
            return
        _paused["count"] -= 1
        if _paused["count"]:
            return
        sc, _paused["sc"] = _paused["sc"], None
        try:
            jsc = sc._jsc.sc()  # noqa: SLF001
            bar = sc._jvm.org.apache.spark.ui.ConsoleProgressBar(jsc)  # noqa: SLF001
            _field(jsc).set(jsc, sc._jvm.scala.Some(bar))  # noqa: SLF001
        except Exception:  # noqa: BLE001,S110 - the context stopped meanwhile: no bar to restore
            pass
