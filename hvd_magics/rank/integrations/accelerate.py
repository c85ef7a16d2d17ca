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

- ``Accelerator``: given a DeepSpeed or FSDP plugin (or told to use them by Accelerate's
  variables) that it then leaves out, it trains with DDP, every rank holding the whole model
  and its optimizer state, and said nothing: ``cpu=True`` drops a DeepSpeed plugin (DeepSpeed
  itself runs on CPU ranks), and Accelerate shards with FSDP only on GPUs. What it runs is
  read once it is made, and a plugin it left out is said once, with the fix, as a warning.

Accelerate's training loops report their progress through :mod:`.plain_loops`.
"""
from __future__ import annotations

import functools
import os
import sys
from types import FrameType
from typing import Any

from hvd_magics.protocol import ENGINE_TORCH
from hvd_magics.rank.guards.import_hooks import (after_call, after_import, before_call,
                                                 refusing)
from hvd_magics.rank.integrations.guards import (ALONE_MARK, LAUNCH_MARK, LaunchMismatchError,
                                                 RunsAloneError, alone_message, in_a_job,
                                                 job_size, warn_at_users_line)
from hvd_magics.rank.rank_job import rank_job

_ACCELERATE = ("accelerate", "accelerate.launchers")
_ACCELERATE_STATE = "accelerate.state"
_ACCELERATOR = "accelerate.accelerator"
#: Marks the patches of ``Accelerator.__init__``; the plugins it was asked to use, on it.
_PLUGINS_MARK, _ASKED = "_hvd_magics_plugins", "_hvd_magics_asked_plugins"


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


def _plugins_asked(accelerator: Any, *_args: Any, **kwargs: Any) -> None:
    """Note on ``accelerator`` (before its ``__init__`` runs) which plugins it is asked to
    use, and whether ``cpu=True``."""
    def wanted(plugin: str, variable: str) -> bool:
        return (kwargs.get(plugin) is not None
                or os.environ.get(variable, "").lower() in ("true", "1"))

    asked = [kind for kind, plugin, variable in (
        ("DEEPSPEED", "deepspeed_plugin", "ACCELERATE_USE_DEEPSPEED"),
        ("FSDP", "fsdp_plugin", "ACCELERATE_USE_FSDP")) if wanted(plugin, variable)]
    cpu = bool(kwargs.get("cpu")) or os.environ.get("ACCELERATE_USE_CPU", "").lower() in (
        "true", "1")
    accelerator.__dict__[_ASKED] = (asked, cpu, _accelerate_user())


def plugin_left_out(kind: str, runs: str, cpu: bool) -> str:
    """What is said when an ``Accelerator`` asked to use ``kind`` (``"DEEPSPEED"``,
    ``"FSDP"``) runs ``runs`` without it."""
    ddp = (f"it runs {runs} (DDP: every rank holds the whole model and its optimizer state)"
           if runs == "MULTI_CPU" else f"it runs {runs}")
    if kind == "DEEPSPEED" and cpu:
        return (f"Accelerator(cpu=True) was given a DeepSpeed plugin and trains without "
                f"DeepSpeed: with cpu=True Accelerate leaves the plugin out, and {ddp}. Fix: "
                f"leave out cpu=True: DeepSpeed runs on CPU ranks (its CPU accelerator, over "
                f"Gloo)")
    if kind == "FSDP" and runs == "MULTI_CPU":
        return (f"Accelerator was given an FSDP plugin and trains without FSDP here: "
                f"Accelerate shards a model only on GPUs, so on these CPU ranks {ddp}. It runs "
                f"as FSDP on GPU ranks; to shard on CPU ranks, use torch's fully_shard in your "
                f"own loop (hvd_magics.checkpoint saves its shards)")
    name = {"DEEPSPEED": "a DeepSpeed", "FSDP": "an FSDP"}[kind]
    return f"Accelerator was given {name} plugin and trains without it: {ddp}"


def _say_plugins_left_out(accelerator: Any) -> None:
    """Once the ``Accelerator`` is made: each plugin it was asked to use and does not, said
    once as a warning (a Trainer's own is said by the Trainer's integration)."""
    asked, cpu, user = accelerator.__dict__.pop(_ASKED, ([], False, ""))
    kind = getattr(accelerator, "distributed_type", None)
    runs = str(getattr(kind, "value", kind))
    for wanted in asked:
        if runs != wanted and not (wanted == "FSDP" and user.startswith("Hugging Face")):
            warn_at_users_line(plugin_left_out(wanted, runs, cpu))


def _guard_plugins(module: Any) -> None:
    accelerator = getattr(module, "Accelerator", None)
    if accelerator is None:
        return
    before_call(accelerator, "__init__", _plugins_asked, _PLUGINS_MARK)
    after_call(accelerator, "__init__", _say_plugins_left_out, _PLUGINS_MARK + "_said")


def install() -> None:
    """Guard Accelerate's launchers and state in a rank of ours (nothing elsewhere)."""
    if not in_a_job():
        return
    after_import(_ACCELERATE, _guard_launchers)
    if job_size() > 1:
        after_import((_ACCELERATE_STATE,), _guard_state)
        after_import((_ACCELERATOR,), _guard_plugins)
