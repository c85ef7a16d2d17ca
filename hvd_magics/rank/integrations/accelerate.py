"""Accelerate in a rank: its launchers refused, its state joined to the job.

:func:`install` patches, whenever they are imported:

- ``notebook_launcher`` and ``debug_launcher``: they start processes on this machine, and the
  cell already runs as the job's ranks; each fails at once with one line naming what to write;
- ``PartialState`` (under ``Accelerator()``, Hugging Face's ``Trainer`` and
  ``notebook_launcher``-style code): on CPU ranks Accelerate joins torchrun's process group only
  when told it runs on CPU (``Accelerator(cpu=True)``, ``ACCELERATE_USE_CPU``, which ``accelerate
  launch`` sets); a default ``Accelerator()`` saw ``WORLD_SIZE=2`` and ran with
  ``distributed_type`` ``NO``. A rank of a torch job whose Accelerate finds no accelerator now
  joins the job on CPU, as ``accelerate launch`` would; one that still counts other processes
  than the job's ranks (another engine: no process group to join) is refused.

Accelerate's training loops report their progress through :mod:`.plain_loops`.
"""
from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any

from hvd_magics.protocol import ENGINE_TORCH
from hvd_magics.rank.guards.import_hooks import after_call, after_import, refusing
from hvd_magics.rank.integrations.guards import (ALONE_MARK, LAUNCH_MARK, LaunchMismatchError,
                                                 RunsAloneError, alone_message, in_a_job,
                                                 job_size)
from hvd_magics.rank.rank_job import rank_job

_ACCELERATE = ("accelerate", "accelerate.launchers")
_ACCELERATE_STATE = "accelerate.state"


def accelerate_message(name: str) -> str:
    """What calling accelerate's ``name`` launcher in a rank fails with."""
    job = rank_job()
    size, engine = job.size, job.engine
    how = "" if engine == ENGINE_TORCH else " (run the cell with --engine torch)"
    return (f"accelerate's {name} starts processes of its own on this machine, and this code "
            f"already runs as each of the job's {size} ranks. Fix: call the training function "
            f"directly: Accelerator() joins the job's torch.distributed group{how}.")


def _guard_launchers(module: Any) -> None:
    for name in ("notebook_launcher", "debug_launcher"):
        launcher = getattr(module, name, None)
        if launcher is None or getattr(launcher, LAUNCH_MARK, False):
            continue

        def refused(*_args: Any, _name: str = name, **_kwargs: Any) -> Any:
            raise LaunchMismatchError(accelerate_message(_name))

        functools.update_wrapper(refused, launcher)
        setattr(refused, LAUNCH_MARK, True)
        setattr(module, name, refused)


def _cpu_when_alone(prepare: Any) -> Any:
    """Accelerate's ``PartialState._prepare_backend``, choosing torch's Gloo on CPU (as
    ``cpu=True`` does) where it found no accelerator in a torch job of several ranks."""
    @functools.wraps(prepare)
    def prepare_backend(self: Any, cpu: bool = False, *args: Any, **kwargs: Any) -> Any:
        backend, distributed = prepare(self, cpu, *args, **kwargs)
        if (not cpu and str(distributed).endswith(".NO") and job_size() > 1
                and rank_job().engine == ENGINE_TORCH):
            self._cpu = True  # noqa: SLF001 - what PartialState(cpu=True) sets
            backend, distributed = prepare(self, True, *args, **kwargs)
        return backend, distributed

    setattr(prepare_backend, ALONE_MARK, True)
    return prepare_backend


def _guard_state(module: Any) -> None:
    state = getattr(module, "PartialState", None)
    if state is None or getattr(state._prepare_backend, ALONE_MARK, False):  # noqa: SLF001
        return
    state._prepare_backend = _cpu_when_alone(state._prepare_backend)  # noqa: SLF001
    after_call(state, "__init__", refusing(
        lambda made: alone_message(_accelerate_user(), made.num_processes), RunsAloneError),
        ALONE_MARK)


def _accelerate_user() -> str:
    """Whom Accelerate's state is made for: Hugging Face's ``Trainer`` when its frames are on
    the stack (it runs on Accelerate), else Accelerate itself."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("transformers."):
            return "Hugging Face's Trainer (on Accelerate)"
        frame = frame.f_back
    return "Accelerate"


def install() -> None:
    """Guard Accelerate's launchers and state in a rank of ours (nothing elsewhere)."""
    if not in_a_job():
        return
    after_import(_ACCELERATE, _guard_launchers)
    if job_size() > 1:
        after_import((_ACCELERATE_STATE,), _guard_state)
