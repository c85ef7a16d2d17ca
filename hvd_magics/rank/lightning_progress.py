"""Lightning reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when Lightning's ``Trainer`` is imported
(``pytorch_lightning`` or ``lightning.pytorch``), every ``Trainer`` made gains a callback that
reports each training epoch (its number, of ``max_epochs``, and its batches), the steps with the
latest loss, and at the epoch's end every metric the module logged (``self.log``: training and
validation) through :mod:`hvd_magics.rank.progress`: the dashboard's rows, epoch timing and
charts; Lightning's own progress bar gives way to them. The loss stays a tensor until a report leaves the rank (a few times a second), so no
step waits for the device.
"""
from __future__ import annotations

import math
from typing import Any

from hvd_magics.rank import progress
from hvd_magics.rank.import_hooks import after_call, after_import

_TRAINER_MODULES = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")
_PATCHED = "_hvd_magics_progress"
#: Per Lightning package, its callback class (made once, on the first Trainer).
_CALLBACKS: dict[str, type] = {}


def _loss(outputs: Any) -> Any:
    """The training step's loss, detached (``None`` when the step returned none)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach() if hasattr(loss, "detach") else loss


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
    class HorovodMagicsProgress(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.samples = 0

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


def install() -> None:
    """Patch Lightning's Trainer now if it is already imported, and whenever it is later."""
    after_import(_TRAINER_MODULES, patch_trainer)
