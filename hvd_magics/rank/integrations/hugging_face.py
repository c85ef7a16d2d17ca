"""Hugging Face's ``Trainer`` reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when ``transformers.trainer`` is imported, every
``Trainer`` made gains a ``TrainerCallback`` that reports each training epoch (its number, of
``num_train_epochs``, and its optimizer steps), the steps with the latest logged values (loss,
learning rate, gradient norm), and at the epoch's end those values and the last evaluation's
(``eval_*``) through :mod:`hvd_magics.rank.api.progress`: the dashboard's rows, epoch timing and
charts. An evaluation due at an epoch's end belongs to that epoch (its ``eval_*`` values are drawn
beside their training twins). It reads only what the ``Trainer`` logs (its ``logging_steps``):
nothing is computed for it. The ``Trainer``'s own bar and printed logs give way to the dashboard:
its logs go to the run's log file.

On a preemption notice (:mod:`hvd_magics.rank.api.preemption`: an executor of the job is being
decommissioned) the callback asks ``checkpoint.preempting()`` once an optimizer step, on every
rank: from the call it turns True, the ``Trainer`` saves a checkpoint at that step (its own, in
``output_dir``) and the attempt ends there (``Preempted``, raised once it saved); the next
attempt's ``train()`` resumes from the newest checkpoint in ``output_dir`` when it is not told
where to (``resume_from_checkpoint``), redoing no step.

In a Horovod or tf job (no ``torch.distributed`` group to join), a ``Trainer`` that would run
its rank alone is refused with the fix.
"""
from __future__ import annotations

import math
import os
from typing import Any

from hvd_magics.events import RunLogEvent
from hvd_magics.protocol import RUN_LOG
from hvd_magics.rank.api import preemption, progress
from hvd_magics.rank import rank_events
from hvd_magics.rank.api.checkpoint import attempt
from hvd_magics.rank.guards.import_hooks import after_call, after_import, refusing, with_kwargs
from hvd_magics.rank.integrations.guards import (ALONE_MARK, RunsAloneError, alone_message,
                                                 in_a_job, job_size, warn_at_users_line)

_TRAINER_MODULE = "transformers.trainer"
_PATCHED = "_hvd_magics_progress"
_CALLBACK: list[type] = []
#: The Trainer's own timings of an evaluation (the dashboard measures speed itself).
_SPEED_SUFFIXES = ("_runtime", "_per_second")


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    """The numeric values of a ``Trainer`` log (its ``epoch`` and run totals left out)."""
    out: dict[str, float] = {}
    for name, value in (logs or {}).items():
        if (name in ("epoch", "total_flos") or name.startswith("train_")
                or name.endswith(_SPEED_SUFFIXES) or isinstance(value, bool)):
            continue
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _rows_per_rank(loader: Any, args: Any) -> int | None:
    """This rank's share of the rows of an epoch: the dataset's rows over the ranks (``None``
    without a dataset length, or when the last short batch is dropped and every step is
    whole)."""
    try:
        rows = len(loader.dataset)
    except (AttributeError, TypeError):
        return None
    if getattr(args, "dataloader_drop_last", False):
        return None
    return math.ceil(rows / max(int(getattr(args, "world_size", 1) or 1), 1))


class _ProgressHooks:
    """The hooks of the ``TrainerCallback`` a ``Trainer`` is given (see the module's
    docstring); :func:`_callback_class` makes them one, with ``transformers``' class as its
    base."""

    def __init__(self) -> None:
        self.steps_done = 0
        self.logged: dict[str, float] = {}
        self.samples_per_step = 0
        #: This rank's share of the dataset's rows in an epoch (None: not known).
        self.rows_per_rank: int | None = None
        #: Its training steps are done and the epoch waits for its evaluation, if one is due.
        self.open_epoch = False
        #: A preemption notice asked for the save under way: the attempt ends after it.
        self.preempted = False

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_epoch()
        self.steps_done = 0
        epochs = math.ceil(args.num_train_epochs) if args.max_steps <= 0 else None
        steps = (math.ceil(state.max_steps / epochs) if epochs and state.max_steps else None)
        self.samples_per_step = (args.per_device_train_batch_size *
                                 args.gradient_accumulation_steps)
        self.rows_per_rank = _rows_per_rank(kwargs.get("train_dataloader"), args)
        progress.start_epoch(int(state.epoch or 0) + 1, epochs, steps,
                             self.samples_per_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
        self.steps_done += 1
        # the logged values go as metrics, by name (one named "total" would be taken for the
        # epoch's steps: Trainer logs none so named)
        progress.report(self.steps_done,
                        **self.logged)  # type: ignore[arg-type]  # metrics, by name
        if preemption.preempting():
            control.should_save = self.preempted = True

    def on_save(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
        if self.preempted:
            preemption.after_save(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **_kwargs: Any) -> None:
        self.logged.update(_numbers(logs))
        if logs and state.is_local_process_zero:  # what its printer would have printed
            said = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in logs.items()}
            rank_events.emit(RunLogEvent(kind=RUN_LOG, lines=[str(said)]))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
        # an evaluation due at the epoch's end (set by the Trainer's flow callback, which
        # runs first) is part of the epoch, as Keras' validation is: it ends the epoch
        self.open_epoch = True
        if not control.should_evaluate:
            self._end_epoch()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **_kwargs: Any) -> None:
        self.logged.update(_numbers(metrics))
        self._end_epoch()

    def on_train_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
        self._end_epoch()

    def _end_epoch(self) -> None:
        if self.open_epoch:
            self.open_epoch = False
            samples = self.steps_done * self.samples_per_step
            if self.rows_per_rank is not None:  # the last batch may be short
                samples = min(samples, self.rows_per_rank)
            progress.end_epoch(samples=samples or None, **self.logged)



def _callback_class(base: type) -> type:
    """``HorovodMagicsProgress``: the hooks of :class:`_ProgressHooks` on ``base``
    (``transformers``' ``TrainerCallback``, imported only with it)."""
    return type("HorovodMagicsProgress", (_ProgressHooks, base), {})


#: Said once when a Trainer asked for FSDP trains without it (Accelerate shards only on GPUs).
FSDP_ON_CPU = ("the Trainer was given fsdp= (or an fsdp_config), and trains without FSDP here: "
               "Accelerate shards a model only on GPUs, so on these CPU ranks it trains with "
               "DDP, every rank holding the whole model and its optimizer state. It runs as "
               "FSDP on GPU ranks; to shard on CPU ranks, use torch's fully_shard in your own "
               "loop (hvd_magics.checkpoint saves its shards)")


def _say_fsdp_not_used(trainer: Any) -> None:
    """A Trainer told to use FSDP that Accelerate runs without it: said once, as a warning
    (the job goes on: DDP trains the same model, without sharding its memory)."""
    asked = bool(getattr(trainer.args, "fsdp", None))
    if asked and not getattr(trainer, "is_fsdp_enabled", True):
        warn_at_users_line(FSDP_ON_CPU)  # the line making the Trainer


def _add_callback(trainer: Any) -> None:
    from transformers import trainer_callback

    _say_fsdp_not_used(trainer)

    if not _CALLBACK:
        _CALLBACK.append(_callback_class(trainer_callback.TrainerCallback))
    trainer.add_callback(_CALLBACK[0]())
    # its bar and printed logs: the dashboard's rows and charts show them (the logs reach the
    # run's log file through the callback above)
    for printer in (trainer_callback.ProgressCallback, trainer_callback.PrinterCallback):
        trainer.remove_callback(printer)


def _resume_from_output_dir(trainer: Any, args: tuple, kwargs: dict[str, Any]
                            ) -> dict[str, Any]:
    """On a later attempt, a ``train()`` told nothing of where to resume resumes from the newest
    checkpoint in ``output_dir`` (what the attempt before saved), if any."""
    if attempt() and not args and kwargs.get("resume_from_checkpoint") is None:
        from transformers.trainer_utils import get_last_checkpoint

        folder = getattr(trainer.args, "output_dir", None)
        try:
            last = get_last_checkpoint(folder) if folder and os.path.isdir(folder) else None
        except OSError:
            last = None
        if last is not None:
            return {**kwargs, "resume_from_checkpoint": last}
    return kwargs


def patch_trainer(module: Any) -> None:
    """Give every ``transformers.Trainer`` the progress callback, once; a later attempt's
    ``train()`` resumes."""
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", _add_callback, _PATCHED)
        with_kwargs(trainer, "train", _resume_from_output_dir, _PATCHED)


def _guard_alone(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", refusing(
            lambda made: alone_message("Hugging Face's Trainer", made.args.world_size),
            RunsAloneError), ALONE_MARK)


def install() -> None:
    """Patch ``transformers.Trainer`` now if it is already imported, and whenever it is later:
    its progress, and in a job of several ranks the guard."""
    after_import((_TRAINER_MODULE,), patch_trainer)
    if in_a_job() and job_size() > 1:
        after_import((_TRAINER_MODULE,), _guard_alone)
