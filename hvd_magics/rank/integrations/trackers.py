"""Say when a rank records the job in MLflow itself, and who does it.

Hugging Face's ``MLflowCallback`` (``report_to="mlflow"``), Lightning's ``MLFlowLogger``,
Accelerate's ``log_with="mlflow"`` and a cell's own ``mlflow.start_run()`` or ``autolog`` all
create their run through ``MlflowClient.create_run``. A rank hooks it (:func:`install`, when
``mlflow`` is imported) and sends one ``tracker`` event per recorder: who (the library whose
code asked, or the cell) and the tracking URI. The driver, when it records the job in MLflow
too, says so in the run's summary: one job, two runs, and how to keep one.
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from hvd_magics.events import TrackerEvent
from hvd_magics.protocol import TRACKER
from hvd_magics.rank import rank_events
from hvd_magics.rank.guards.import_hooks import after_import, before_call

_CLIENT_MODULE = "mlflow.tracking.client"
_PATCHED = "_hvd_magics_tracker_watch"
#: Libraries with an MLflow integration, by the package their frames live in.
LIBRARIES = ("transformers", "pytorch_lightning", "lightning", "accelerate", "keras", "tf_keras")
#: Who has been said (once per rank).
_said: set[str] = set()


def recorder() -> str:
    """Who asks for the run: the first library of :data:`LIBRARIES` on the stack, else the
    cell."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        package = str(frame.f_globals.get("__name__", "")).split(".", 1)[0]
        if package in LIBRARIES:
            return package
        frame = frame.f_back
    return "the cell"


def _said_who(client: Any, *_args: Any, **_kwargs: Any) -> None:
    by = recorder()
    if by not in _said:
        _said.add(by)
        uri = str(getattr(client, "tracking_uri", "") or "")
        rank_events.emit(TrackerEvent(kind=TRACKER, by=by, uri=uri))


def _patch_client(module: Any) -> None:
    client = getattr(module, "MlflowClient", None)
    if client is not None:
        before_call(client, "create_run", _said_who, _PATCHED)


def install() -> None:
    """Watch MLflow's run creation once ``mlflow`` is imported."""
    after_import((_CLIENT_MODULE,), _patch_client)
