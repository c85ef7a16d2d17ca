"""Keras reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when ``tf_keras`` or ``keras`` is imported, its
``Model.fit`` gains a callback that reports epochs, steps and metrics through
:mod:`hvd_magics.rank.progress`. The callback keeps Keras from converting batch logs to numpy
(``_supports_tf_logs``) and converts only the few it sends. Set ``HVD_MAGICS_KERAS_PROGRESS=0``
in the ranks' environment to turn it off.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from hvd_magics.protocol import ENV_KERAS_PROGRESS
from hvd_magics.rank import progress
from hvd_magics.rank.import_hooks import after_import

_KERAS_MODULES = ("tf_keras", "keras")
_PATCHED = "_hvd_magics_progress"
_CALLBACK = "_hvd_magics_progress_callback"


def _batch_size(args: tuple, kwargs: dict[str, Any]) -> int | None:
    size = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
    if size is None:
        x = kwargs.get("x", args[0] if args else None)
        if hasattr(x, "shape") and not hasattr(x, "element_spec"):
            size = 32  # Keras's default for array input
    return size


def _callback_class(base: type) -> type:
    class HorovodMagicsProgress(base):  # type: ignore[misc, valid-type]
        _supports_tf_logs = True

        def __init__(self, batch_size: int | None, epochs: int | None = None,
                     steps: int | None = None, offset: int = 0) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.epochs, self.steps = epochs, steps  # when not those of this fit call
            self.offset = offset  # epochs done before this fit call (an elastic job's reset)
            self.steps_done = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.steps_done = 0
            epochs = self.epochs or self.params.get("epochs")
            progress.start_epoch(self.offset + epoch + 1,
                                 self.offset + epochs if epochs and not self.epochs else epochs,
                                 self.steps or self.params.get("steps"), self.batch_size)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps_done = batch + 1
            progress.report(batch + 1, **(logs or {}))

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            samples = self.steps_done * self.batch_size if self.batch_size else None
            progress.end_epoch(samples=samples, **(logs or {}))

    return HorovodMagicsProgress


def _elastic_epochs_done(callbacks: list[Any]) -> int:
    """Epochs an elastic job finished before this ``fit`` call: Horovod's examples call
    ``fit(epochs=epochs - state.epoch)`` after a reset, so Keras counts from 1 again while
    ``UpdateEpochStateCallback(state)`` knows the epochs done."""
    for callback in callbacks:
        if type(callback).__name__.startswith("UpdateEpochStateCallback"):
            try:
                return int(callback.state.epoch)
            except (AttributeError, TypeError, ValueError):
                return 0
    return 0


def patch_keras(module: Any) -> None:
    """Give ``module.Model.fit`` (tf_keras or keras) the progress callback, once."""
    model = getattr(module, "Model", None)
    callbacks = getattr(module, "callbacks", None)
    if model is None or callbacks is None or getattr(model.fit, _PATCHED, False):
        return
    callback_class = _callback_class(callbacks.Callback)
    setattr(module, _CALLBACK, callback_class)
    original = model.fit

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = list(kwargs.get("callbacks") or (args[5] if len(args) > 5 else None) or [])
        if not any(isinstance(c, callback_class) for c in given):
            offset = 0 if kwargs.get("initial_epoch") else _elastic_epochs_done(given)
            given.append(callback_class(_batch_size(args, kwargs), offset=offset))
        if len(args) > 5:
            args = args[:5] + (given,) + args[6:]
        else:
            kwargs["callbacks"] = given
        return original(self, *args, **kwargs)

    setattr(fit, _PATCHED, True)
    model.fit = fit


def progress_callback(module: Any, batch_size: int | None, epochs: int | None = None,
                      steps: int | None = None) -> Any:
    """The progress callback for ``module`` (tf_keras or keras), for a ``fit`` call that runs part
    of a longer training (``epochs`` and ``steps`` per epoch in all); ``None`` when progress
    reporting is off."""
    kind = getattr(module, _CALLBACK, None)
    return kind(batch_size, epochs, steps) if kind is not None else None


def install() -> None:
    """Patch Keras now if it is already imported, and whenever it is imported later."""
    if os.environ.get(ENV_KERAS_PROGRESS, "1") == "0":
        return
    after_import(_KERAS_MODULES, patch_keras)
