"""A library in a rank that would start processes of its own, or plan ranks the job does not
have, fails at once with one line naming what to write instead (not a hang, an ``IndexError``
from deep inside it, or ranks that each train alone).

:func:`install` patches, whenever they are imported:

- accelerate's ``notebook_launcher`` and ``debug_launcher``: they start processes on this
  machine, and the cell already runs as the job's ranks;
- on the torch engine, Lightning's ``Trainer`` (``pytorch_lightning`` and ``lightning.pytorch``)
  and ``Fabric``: ``devices`` and ``num_nodes`` left at their defaults take the job's topology
  (each host's ranks and the hosts, as torchrun's variables say them), so one cell runs on a
  laptop's local Spark and on a cluster of several hosts; a strategy that spawns or forks its
  processes (``ddp_spawn``, ``ddp_notebook``, ``ddp_fork``) is refused, and so are explicit
  values that disagree with the topology, which Lightning itself does not check when the
  processes are started for it.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from hvd_magics.protocol import (ENGINE_TORCH, ENV_ENGINE, ENV_GROUP_WORLD_SIZE,
                                 ENV_LOCAL_WORLD_SIZE, ENV_SIZE)
from hvd_magics.rank.import_hooks import after_call, after_import, refusing, with_kwargs

_LIGHTNING_TRAINERS = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")
_LIGHTNING_FABRICS = ("lightning_fabric.fabric", "lightning.fabric.fabric")
_ACCELERATE = ("accelerate", "accelerate.launchers")
_GUARDED = "_hvd_magics_launcher_guard"
_SHAPED = "_hvd_magics_job_shape"


class LaunchMismatchError(RuntimeError):
    """A library in a rank would start its own processes, or plans other ranks than the job's."""


def accelerate_message(name: str) -> str:
    """What calling accelerate's ``name`` launcher in a rank fails with."""
    size = os.environ.get(ENV_SIZE, "?")
    engine = os.environ.get(ENV_ENGINE)
    how = "" if engine == ENGINE_TORCH else " (run the cell with --engine torch)"
    return (f"accelerate's {name} starts processes of its own on this machine, and this code "
            f"already runs as each of the job's {size} ranks. Fix: call the training function "
            f"directly: Accelerator() joins the job's torch.distributed group{how}.")


def job_shape() -> tuple[int, int]:
    """``(ranks per host, hosts)`` of this rank's job, as torchrun's variables say them."""
    return (int(os.environ.get(ENV_LOCAL_WORLD_SIZE, "1")),
            int(os.environ.get(ENV_GROUP_WORLD_SIZE, "1")))


def with_job_shape(_self: Any, _args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A ``Trainer``'s or ``Fabric``'s keyword arguments, with ``devices`` and ``num_nodes``
    that were left at their defaults (``"auto"`` and 1) set to the job's shape."""
    local, nodes = job_shape()
    adjusted = dict(kwargs)
    if adjusted.get("devices", "auto") == "auto":
        adjusted["devices"] = local
    adjusted.setdefault("num_nodes", nodes)
    return adjusted


def lightning_message(trainer: Any) -> str | None:
    """Why ``trainer`` (a Lightning ``Trainer`` or ``Fabric``) cannot run as this rank of the
    job, or ``None`` when it can."""
    strategy = getattr(trainer, "_strategy", None) or trainer.strategy
    local, nodes = job_shape()
    kind = type(trainer).__name__
    spelling = (f"leave devices and num_nodes out of {kind}(...) (they then take the job's "
                f"shape), or write {kind}(devices={local}, num_nodes={nodes}, strategy='ddp')")
    start = getattr(strategy, "_start_method", "popen")
    if start != "popen":
        return (f"Lightning's strategy starts its processes itself ({start}), and this code "
                f"already runs as each of the job's ranks. Fix: {spelling}.")
    devices = getattr(strategy, "num_processes", 1)
    planned = getattr(strategy, "num_nodes", 1)
    if (devices, planned) == (local, nodes):
        return None
    size = os.environ.get(ENV_SIZE, "?")
    total = devices * planned
    return (f"Lightning's {kind}(devices={devices}, num_nodes={planned}) plans {total} "
            f"process{'es' if total != 1 else ''}, {devices} per node, and the job runs {size} ranks "
            f"as {nodes} node{'s' if nodes != 1 else ''} of {local}. Fix: {spelling}.")


def _guard_lightning(module: Any) -> None:
    for name in ("Trainer", "Fabric"):
        owner = getattr(module, name, None)
        if owner is not None:
            after_call(owner, "__init__", refusing(lightning_message, LaunchMismatchError),
                       _GUARDED)
            with_kwargs(owner, "__init__", with_job_shape, _SHAPED)


def _guard_accelerate(module: Any) -> None:
    for name in ("notebook_launcher", "debug_launcher"):
        launcher = getattr(module, name, None)
        if launcher is None or getattr(launcher, _GUARDED, False):
            continue

        def refused(*_args: Any, _name: str = name, **_kwargs: Any) -> Any:
            raise LaunchMismatchError(accelerate_message(_name))

        functools.update_wrapper(refused, launcher)
        setattr(refused, _GUARDED, True)
        setattr(module, name, refused)


def install() -> None:
    """Guard the launchers (nothing outside a rank of ours)."""
    engine = os.environ.get(ENV_ENGINE)
    if engine is None:
        return
    after_import(_ACCELERATE, _guard_accelerate)
    if engine == ENGINE_TORCH:
        after_import(_LIGHTNING_TRAINERS + _LIGHTNING_FABRICS, _guard_lightning)
