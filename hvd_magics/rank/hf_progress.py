"""Hugging Face's ``Trainer`` reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when ``transformers.trainer`` is imported,
every ``Trainer`` made gains a ``TrainerCallback`` that reports each training epoch (its number,
of ``num_train_epochs``, and its optimizer steps), the steps with the latest logged values
(loss, learning rate, gradient norm), and at the epoch's end those values and the last
evaluation's (``eval_*``) through :mod:`hvd_magics.rank.progress`: the dashboard's rows, epoch
timing and charts. It reads only what the ``Trainer`` logs (its ``logging_steps``): nothing is
computed for it.
"""
from __future__ import annotations

import math
from typing import Any

from hvd_magics.rank import progress
from hvd_magics.rank.import_hooks import after_call, after_import

_TRAINER_MODULE = "transformers.trainer"
_PATCHED = "_hvd_magics_progress"
_CALLBACK: list[type] = []


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    """The numeric values of a ``Trainer`` log (its ``epoch`` and run totals left out)."""
    out: dict[str, float] = {}
    for name, value in (logs or {}).items():
        if name == "epoch" or name.startswith("train_") or isinstance(value, bool):
            continue
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _callback_class(base: type) -> type:
    class HorovodMagicsProgress(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.steps_done = 0
            self.logged: dict[str, float] = {}
            self.samples_per_step = 0

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
            self.steps_done = 0
            epochs = math.ceil(args.num_train_epochs) if args.max_steps <= 0 else None
            steps = (math.ceil(state.max_steps / epochs) if epochs and state.max_steps else None)
            self.samples_per_step = (args.per_device_train_batch_size *
                                     args.gradient_accumulation_steps)
            progress.start_epoch(int(state.epoch or 0) + 1, epochs, steps,
                                 self.samples_per_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
            self.steps_done += 1
            progress.report(self.steps_done, **self.logged)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **_kwargs: Any) -> None:
            self.logged.update(_numbers(logs))

        def on_epoch_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
            progress.end_epoch(samples=self.steps_done * self.samples_per_step or None,
                               **self.logged)

    return HorovodMagicsProgress


def _add_callback(trainer: Any) -> None:
    if not _CALLBACK:
        from transformers.trainer_callback import TrainerCallback

        _CALLBACK.append(_callback_class(TrainerCallback))
    trainer.add_callback(_CALLBACK[0]())


def patch_trainer(module: Any) -> None:
    """Give every ``transformers.Trainer`` the progress callback, once."""
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", _add_callback, _PATCHED)


def install() -> None:
    """Patch ``transformers.Trainer`` now if it is already imported, and whenever it is later."""
    after_import((_TRAINER_MODULE,), patch_trainer)
