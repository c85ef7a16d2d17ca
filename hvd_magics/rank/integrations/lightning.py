"""Lightning reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when Lightning's ``Trainer`` is imported
(``pytorch_lightning`` or ``lightning.pytorch``), every ``Trainer`` made gains a callback that
reports each training epoch (its number, of ``max_epochs``, and its batches), the steps with the
latest loss, and at the epoch's end every metric the module logged (``self.log``: training and
validation) through :mod:`hvd_magics.rank.api.progress`: the dashboard's rows, epoch timing and
charts; Lightning's own progress bar gives way to them. The loss stays a tensor until a report
leaves the rank (a few times a second), so no step waits for the device.

On a preemption notice (:mod:`hvd_magics.rank.api.preemption`) the callback asks
``checkpoint.preempting()`` before each training batch, on every rank: from the call it turns
True, every rank saves the ``Trainer``'s checkpoint (``trainer.save_checkpoint``: rank 0 writes
it, under a temporary name renamed into place) in the job's checkpoint folder,
``lightning/step-<global step>.ckpt``, and the attempt ends (``Preempted``); the next attempt's
``fit`` resumes from the newest one there when it is not told where to (``ckpt_path``).

With ``--keep-steps`` (``keep_steps=True``), the first rank of each host keeps the ``Trainer``'s
checkpoint of every step in the host's memory before the next batch
(:mod:`hvd_magics.rank.api.keeping`); a later attempt's ``fit`` resumes from the step every host
holds when it is newer than a checkpoint saved on a notice.

On the torch engine, a ``Trainer``'s or ``Fabric``'s ``devices`` and ``num_nodes`` left at their
defaults take the job's topology (each host's ranks and the hosts, as torchrun's variables say
them), so one cell runs on a laptop's local Spark and on a cluster of several hosts; a strategy
that spawns or forks its processes (``ddp_spawn``, ``ddp_notebook``, ``ddp_fork``) is refused,
and so are explicit values that disagree with the topology, which Lightning itself does not
check when the processes are started for it. On the other engines (no ``torch.distributed``
group to join) a ``Trainer`` that would run its rank alone is refused.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hvd_magics.rank.api import preemption, progress
from hvd_magics.rank.api.checkpoint import (latest, newest_saved_on_notice, notice_folder,
                                             notice_step)
from hvd_magics.rank.api.kept_restore import memory_step_newer_than
from hvd_magics.rank.api.keeping import keep, writes_kept_steps
from hvd_magics.protocol import ENGINE_TORCH
from hvd_magics.rank.guards.import_hooks import (after_call, after_import, before_call, refusing,
                                          with_kwargs)
from hvd_magics.rank.integrations.guards import (ALONE_MARK, LAUNCH_MARK, LaunchMismatchError,
                                                 RunsAloneError, alone_message, in_a_job,
                                                 job_size, mine_alone)
from hvd_magics.rank.rank_job import rank_job

_FABRIC_MODULES = ("lightning_fabric.fabric", "lightning.fabric.fabric")
_SHAPED = "_hvd_magics_job_shape"

_TRAINER_MODULES = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")
_PATCHED = "_hvd_magics_progress"
#: Per Lightning package, its callback class (made once, on the first Trainer).
_CALLBACKS: dict[str, type] = {}
#: The folder of the job's checkpoint folder that holds the checkpoints saved on a notice.
SAVED_ON_NOTICE = "lightning"


def _save_on_notice(trainer: Any) -> None:
    """Every rank: save the Trainer's checkpoint at this step (rank 0 writes it), then end the
    attempt."""
    folder = notice_folder(SAVED_ON_NOTICE)
    step = int(trainer.global_step)
    final = folder / f"step-{step}.ckpt"
    partial = folder / f".step-{step}.ckpt.partial"
    if trainer.is_global_zero:
        folder.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(str(partial))  # every rank takes part; rank 0 writes
    if trainer.is_global_zero:
        os.replace(partial, final)
    preemption.after_save(step)


def _keep_step(trainer: Any) -> None:
    """Keep the Trainer's checkpoint of this step in the host's memory (``--keep-steps``): what
    ``save_checkpoint`` would write, by the host's first rank."""
    if trainer.global_step > 0 and writes_kept_steps():
        keep(trainer._checkpoint_connector.dump_checkpoint(weights_only=False),
             int(trainer.global_step))


def _resume_saved(trainer: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: ARG001
    """On a later attempt, a ``fit`` told no ``ckpt_path`` resumes from the newest checkpoint
    saved on a notice, or from the step kept in the hosts' memory when that is newer (written
    to the rank's temporary folder for ``fit`` to read)."""
    if len(args) >= 5 or kwargs.get("ckpt_path") is not None:
        return kwargs
    saved = newest_saved_on_notice(SAVED_ON_NOTICE)
    if memory_step_newer_than(notice_step(saved) if saved else None) is not None:
        import torch

        state, step = latest()  # type: ignore[misc]
        path = Path(rank_job().tmpdir or tempfile.gettempdir()) / f"kept-step-{step}.ckpt"
        torch.save(state, path)
        return {**kwargs, "ckpt_path": str(path)}
    return {**kwargs, "ckpt_path": str(saved)} if saved is not None else kwargs


def _loss(outputs: Any) -> Any:
    """The training step's loss, detached (``None`` when the step returned none)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach() if loss is not None and hasattr(loss, "detach") else loss


def _batch_rows(batch: Any) -> int | None:
    """How many samples a batch holds: the length of its first tensor."""
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else None


def _loader_batch_size(trainer: Any) -> int | None:
    loader = getattr(trainer, "train_dataloader", None)
    size = getattr(loader, "batch_size", None)
    return size if isinstance(size, int) else None


def _callback_class(base: type) -> type:
    class HorovodMagicsProgress(base):
        def __init__(self) -> None:
            super().__init__()
            self.samples = 0
            self.keep_steps = rank_job().keep_steps

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:  # noqa: ARG002
            self.samples = 0
            steps = trainer.num_training_batches
            epochs = trainer.max_epochs
            progress.start_epoch(trainer.current_epoch + 1,
                                 epochs if epochs and epochs > 0 else None,
                                 int(steps) if isinstance(steps, (int, float)) and
                                 math.isfinite(steps) else None,
                                 _loader_batch_size(trainer))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:  # noqa: ARG002
            self.samples += _batch_rows(batch) or 0
            loss = _loss(outputs)
            progress.report(batch_idx + 1, **({"loss": loss} if loss is not None else {}))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                 batch_idx: int) -> None:  # noqa: ARG002
            # before the next batch: the step before it ended whole (the module's own
            # end-of-batch hook included)
            if preemption.preempting():
                _save_on_notice(trainer)
            if self.keep_steps:
                _keep_step(trainer)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:  # noqa: ARG002
            metrics = {name: value for name, value in trainer.callback_metrics.items()
                       if getattr(value, "numel", lambda: 1)() == 1}
            progress.end_epoch(samples=self.samples or None, **metrics)

    return HorovodMagicsProgress


def patch_trainer(module: Any) -> None:
    """Give every ``module.Trainer`` (Lightning's) the progress callback, once."""
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return
    package = module.__name__.rsplit(".trainer.trainer", 1)[0]

    def add_callback(made: Any) -> None:
        if package not in _CALLBACKS:
            import importlib

            callbacks = importlib.import_module(f"{package}.callbacks")
            _CALLBACKS[package] = _callback_class(callbacks.Callback)
        kind = _CALLBACKS[package]
        if not any(isinstance(c, kind) for c in made.callbacks):
            made.callbacks.append(kind())
        bar = getattr(made, "progress_bar_callback", None)
        if bar is not None:  # the dashboard's rows show it (in a terminal: the live lines)
            bar.disable()

    after_call(trainer, "__init__", add_callback, _PATCHED)
    with_kwargs(trainer, "fit", _resume_saved, _PATCHED)


def job_shape() -> tuple[int, int]:
    """``(ranks per host, hosts)`` of this rank's job, as torchrun's variables say them."""
    job = rank_job()
    return job.local_size, job.group_size


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
    job, or ``None`` when it can. One of a single process (``devices=1``) is this rank's own
    work (predicting on rank 0 after training): only its ``fit`` is refused
    (:func:`fit_alone_message`)."""
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
    if (devices, planned) == (local, nodes) or devices * planned == 1 or mine_alone():
        return None
    size = rank_job().size
    total = devices * planned
    return (f"Lightning's {kind}(devices={devices}, num_nodes={planned}) plans {total} "
            f"process{'es' if total != 1 else ''}, {devices} per node, and the job runs "
            f"{size} ranks "
            f"as {nodes} node{'s' if nodes != 1 else ''} of {local}. Fix: {spelling}.")


def fit_alone_message(trainer: Any, *_args: Any, **_kwargs: Any) -> str | None:
    """Why ``trainer.fit`` would train this rank's model alone (a ``Trainer`` of one process in
    a job of several ranks), or ``None``: predicting, validating and testing alone are left
    to the rank."""
    return alone_message("Lightning's Trainer", getattr(trainer, "world_size", 1))


def _guard_launch(module: Any) -> None:
    for name in ("Trainer", "Fabric"):
        owner = getattr(module, name, None)
        if owner is not None:
            after_call(owner, "__init__", refusing(lightning_message, LaunchMismatchError),
                       LAUNCH_MARK)
            with_kwargs(owner, "__init__", with_job_shape, _SHAPED)
    _guard_alone(module)


def _guard_alone(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        before_call(trainer, "fit", refusing(fit_alone_message, RunsAloneError), ALONE_MARK)


def install() -> None:
    """Patch Lightning's ``Trainer`` (and ``Fabric``) now if imported, and whenever it is later:
    progress always; in a rank of ours, the job's shape and the guards."""
    after_import(_TRAINER_MODULES, patch_trainer)
    engine = rank_job().engine
    if not in_a_job():
        return
    if engine == ENGINE_TORCH:
        after_import(_TRAINER_MODULES + _FABRIC_MODULES, _guard_launch)
    elif job_size() > 1:
        after_import(_TRAINER_MODULES, _guard_alone)
