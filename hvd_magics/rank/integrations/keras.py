"""Keras reports its progress with no change to the user's code.

A rank installs an import hook (:func:`install`); when ``tf_keras`` or ``keras`` is imported, its
``Model.fit`` gains a callback that reports epochs, steps and metrics through
:mod:`hvd_magics.rank.api.progress`. The callback keeps Keras from converting batch logs to numpy
(``_supports_tf_logs``) and converts only the few it sends. Set ``HVD_MAGICS_KERAS_PROGRESS=0``
in the ranks' environment to turn it off.

The same patch keeps Horovod's first broadcast out of Keras's check of slow callbacks:
``BroadcastGlobalVariablesCallback`` broadcasts the weights at the end of the first batch (waiting
for every peer's first batch), and tf_keras averages the batch-end hooks over the first batches,
so every Keras job that used it, the README's included, printed ``Callback method
`on_train_batch_end` is slow compared to the batch time ... Check your callbacks.`` on each rank.
The broadcast's time is taken off the hook time Keras measured; a user's own slow callback is
still reported.

On a preemption notice (:mod:`hvd_magics.rank.api.preemption`) in a Horovod job, the callback asks
``checkpoint.preempting()`` after each training batch, on every rank: from the call it turns True,
rank 0 writes the model's and the optimizer's variables and where the ``fit`` was (epoch, batch) in
the job's checkpoint folder, ``keras_on_notice/step-<global step>`` (under a temporary name renamed
into place), and the attempt ends (``Preempted``). The next attempt's ``fit``, when not told where
to start (``initial_epoch``), restores the newest one and starts at the next batch of that epoch,
its input advanced past the batches done (tf_keras's own ``BackupAndRestore`` starts that epoch's
input from its first batch again), so no step is redone.

Under ``tf.distribute`` (the tf engine) the same, every worker writing (the others into a
folder of their own, removed): a variable synchronised on read is read by a collective. Keras 3's
``fit`` does not save on the notice (it cannot resume inside an epoch; nor does it train under
Horovod's API or several ``tf.distribute`` workers).

On the tf engine, a ``fit`` whose model was built outside a ``MultiWorkerMirroredStrategy`` of
the job's workers (it would train each worker alone) is refused with the fix.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hvd_magics.protocol import ENGINE_HOROVOD, ENGINE_TF
from hvd_magics.rank.api import preemption, progress
from hvd_magics.rank.api.checkpoint import newest_saved_on_notice, notice_folder, notice_step
from hvd_magics.rank.integrations.keras_kept import (keeps_steps, keep_step, kept_step_to_resume,
                                                     restore_kept)
from hvd_magics.rank.guards.import_hooks import after_call, after_import, before_call, refusing
from hvd_magics.rank.integrations.guards import (ALONE_FIX, ALONE_MARK, RunsAloneError, job_size,
                                                 mine_alone)
from hvd_magics.rank.rank_job import rank_job

_KERAS_MODULES = ("tf_keras", "keras")
_PATCHED = "_hvd_magics_progress"
_CALLBACK = "_hvd_magics_progress_callback"
_TIMED = "_hvd_magics_broadcast_timed"
#: Seconds Horovod's broadcast callbacks spent in the batch hook Keras is calling now.
_broadcast_s = [0.0]
#: The folder of the job's checkpoint folder that holds the checkpoints saved on a notice.
SAVED_ON_NOTICE = "keras_on_notice"  # beside a BackupAndRestore folder "keras" (docs/restarts.md)


def _saves_on_notice() -> bool:
    """Whether a ``fit`` here saves on a preemption notice: a Horovod job's ranks or a
    ``tf.distribute`` job's workers (every one holds the same variables)."""
    return rank_job().engine in (ENGINE_HOROVOD, ENGINE_TF)


def _save_on_notice(model: Any, epoch: int, batch: int, step: int) -> None:
    """Every rank: rank 0 writes the variables and the position, then the attempt ends.

    Under ``tf.distribute`` every worker writes (the others into a folder of their own, then
    removed), as TensorFlow asks: reading a variable synchronised on read (a
    ``BatchNormalization``'s moving mean) is a collective of every worker, and rank 0 writing
    alone waited in it forever while the others had ended. A write that fails raises its own
    error (the attempt then ends as a failure, never as a saved step)."""
    if rank_job().first:
        folder = notice_folder(SAVED_ON_NOTICE)
        final, partial = folder / f"step-{step}", folder / f".step-{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _write_variables(model, partial)
        (partial / "position.json").write_text(json.dumps(
            {"epoch": epoch, "batch": batch, "step": step}))
        os.replace(partial, final)
    elif rank_job().engine == ENGINE_TF:
        scratch = Path(tempfile.mkdtemp())
        try:
            _write_variables(model, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    preemption.after_save(step)


def _write_variables(model: Any, folder: Path) -> None:
    """The model's and its optimizer's variables, into ``folder/state``."""
    import tensorflow as tf

    tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(folder / "state"))


class _ResumeAt:
    """Where a resumed ``fit`` starts, told to tf_keras as its ``BackupAndRestore`` tells it
    (``model._training_state``): the batch after the saved one."""

    def __init__(self, epoch: int, batch: int, step: int) -> None:
        self.epoch, self.batch, self.step = epoch, batch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: int | None,
                                              initial_epoch: int, mode: Any = None) -> tuple:
        if steps_per_epoch is not None and self.batch + 1 >= steps_per_epoch:
            return self.epoch + 1, 0
        return self.epoch, self.batch + 1


def _resume_saved(model: Any) -> _ResumeAt | None:
    """On a later attempt, restore the newest checkpoint saved on a notice, or the step kept
    in the hosts' memory when that is newer (:mod:`hvd_magics.rank.integrations.keras_kept`),
    into ``model``; where to start."""
    saved = newest_saved_on_notice(SAVED_ON_NOTICE)
    if kept_step_to_resume(notice_step(saved) if saved else None) is not None:
        return _ResumeAt(*restore_kept(model))
    if saved is None:
        return None
    import tensorflow as tf

    position = json.loads((saved / "position.json").read_text())
    optimizer = model.optimizer
    if model.built and callable(getattr(optimizer, "build", None)) and \
            not getattr(optimizer, "_built", False):
        optimizer.build(model.trainable_variables)  # its slots exist to be restored into
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(
        str(saved / "state")).expect_partial()
    return _ResumeAt(int(position["epoch"]), int(position["batch"]), int(position["step"]))


def _skip_done_batches(module: Any) -> None:
    """tf_keras's ``DataHandler.enumerate_epochs``: a ``fit`` resumed by :class:`_ResumeAt`
    draws the batches its epoch had done from the input before training on the next one."""
    adapter = sys.modules.get(f"{module.__name__}.src.engine.data_adapter")
    handler = getattr(adapter, "DataHandler", None)
    if handler is None or getattr(handler.enumerate_epochs, _PATCHED, False):
        return
    original = handler.enumerate_epochs

    @functools.wraps(original)
    def enumerate_epochs(self: Any) -> Any:
        resumed = isinstance(getattr(getattr(self, "_model", None), "_training_state", None),
                             _ResumeAt)
        skip = int(getattr(self, "_initial_step", 0) or 0) if resumed else 0
        for epoch, iterator in original(self):
            for _ in range(skip):
                next(iterator)
            skip = 0
            yield epoch, iterator

    setattr(enumerate_epochs, _PATCHED, True)
    handler.enumerate_epochs = enumerate_epochs


def _batch_size(args: tuple, kwargs: dict[str, Any]) -> int | None:
    size = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
    if size is None:
        x = kwargs.get("x", args[0] if args else None)
        if hasattr(x, "shape") and not hasattr(x, "element_spec"):
            size = 32  # Keras's default for array input
    return size


def _callback_class(base: type) -> type:
    class HorovodMagicsProgress(base):
        _supports_tf_logs = True

        def __init__(self, batch_size: int | None, epochs: int | None = None,
                     steps: int | None = None, offset: int = 0, saves: bool = False,
                     first_step: int = 0) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.epochs, self.steps = epochs, steps  # when not those of this fit call
            self.offset = offset  # epochs done before this fit call (an elastic job's reset)
            self.steps_done = 0
            self.saves = saves  # on a preemption notice (a user's fit in a Horovod job)
            self.global_step = first_step  # batches trained, in this attempt and before
            self.keeps = saves and keeps_steps()  # every step kept in the hosts' memory
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.steps_done, self.epoch = 0, epoch
            epochs = self.epochs or self.params.get("epochs")
            progress.start_epoch(self.offset + epoch + 1,
                                 self.offset + epochs if epochs and not self.epochs else epochs,
                                 self.steps or self.params.get("steps"), self.batch_size)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps_done = batch + 1
            self.global_step += 1
            progress.report(batch + 1, **(logs or {}))
            if self.saves and preemption.preempting():
                _save_on_notice(self.model, self.epoch, batch, self.global_step)
            if self.keeps:
                keep_step(self.model, self.epoch, batch, self.global_step)

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


def _time_broadcast(callback: Any) -> None:
    """Count the time ``callback`` (Horovod's ``BroadcastGlobalVariablesCallback``) spends in its
    one broadcast, for :func:`_patch_timing_check` to take off."""
    if not hasattr(callback, "broadcast_done") or getattr(callback, _TIMED, False):
        return
    hook = callback.on_batch_end

    def on_batch_end(batch: int, logs: Any = None) -> None:
        start = time.time()
        try:
            hook(batch, logs)
        finally:
            _broadcast_s[0] += time.time() - start

    callback.on_batch_end = on_batch_end
    setattr(callback, _TIMED, True)


def _patch_timing_check(callbacks: Any) -> None:
    """Take the broadcast's time off the batch hook time tf_keras's ``CallbackList`` measured
    (its ``_hook_times``; Keras 3 has no such check and nothing is patched there)."""
    callback_list = getattr(callbacks, "CallbackList", None)
    helper = getattr(callback_list, "_call_batch_hook_helper", None)
    if callback_list is None or helper is None or getattr(helper, _PATCHED, False):
        return

    @functools.wraps(helper)
    def call_batch_hooks(self: Any, hook_name: str, batch: int, logs: Any) -> None:
        _broadcast_s[0] = 0.0
        helper(self, hook_name, batch, logs)
        times = getattr(self, "_hook_times", {}).get(hook_name) if _broadcast_s[0] else None
        if times:
            times[-1] = max(0.0, times[-1] - _broadcast_s[0])

    setattr(call_batch_hooks, _PATCHED, True)
    callback_list._call_batch_hook_helper = call_batch_hooks  # noqa: SLF001


def patch_keras(module: Any) -> None:
    """Give ``module.Model.fit`` (tf_keras or keras) the progress callback, once."""
    model = getattr(module, "Model", None)
    callbacks = getattr(module, "callbacks", None)
    if model is None or callbacks is None or getattr(model.fit, _PATCHED, False):
        return
    callback_class = _callback_class(callbacks.Callback)
    setattr(module, _CALLBACK, callback_class)
    _patch_timing_check(callbacks)
    _skip_done_batches(module)
    original = model.fit

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = list(kwargs.get("callbacks") or (args[5] if len(args) > 5 else None) or [])
        for callback in given:
            _time_broadcast(callback)
        # tf_keras only: Keras 3's fit would restore the variables and not where it was (it
        # has no _training_state), training again the steps done
        saves = _saves_on_notice() and module.__name__ == "tf_keras"
        told = "initial_epoch" in kwargs or len(args) > 11  # fit's 12th argument
        resume = _resume_saved(self) if saves and not told else None
        if not any(isinstance(c, callback_class) for c in given):
            offset = 0 if kwargs.get("initial_epoch") else _elastic_epochs_done(given)
            given.append(callback_class(_batch_size(args, kwargs), offset=offset, saves=saves,
                                        first_step=resume.step if resume else 0))
        if len(args) > 5:
            args = args[:5] + (given,) + args[6:]
        else:
            kwargs["callbacks"] = given
        if resume is None:
            return original(self, *args, **kwargs)
        self._training_state = resume
        try:
            return original(self, *args, **kwargs)
        finally:
            if getattr(self, "_training_state", None) is resume:
                self._training_state = None

    setattr(fit, _PATCHED, True)
    model.fit = fit


def progress_callback(module: Any, batch_size: int | None, epochs: int | None = None,
                      steps: int | None = None) -> Any:
    """The progress callback for ``module`` (tf_keras or keras), for a ``fit`` call that runs part
    of a longer training (``epochs`` and ``steps`` per epoch in all); ``None`` when progress
    reporting is off."""
    kind = getattr(module, _CALLBACK, None)
    return kind(batch_size, epochs, steps) if kind is not None else None


#: Whether this worker made a ``MultiWorkerMirroredStrategy`` (then a model it fits outside
#: the strategy's scope is its own on purpose: a probe, a small model of its own).
_STRATEGY_MADE = "_hvd_magics_strategy_made"


def keras_message(model: Any, *_args: Any, **_kwargs: Any) -> str | None:
    """Why a Keras ``model.fit`` on a tf job's worker would train the job's model alone (no
    ``MultiWorkerMirroredStrategy`` made in this worker at all), or ``None``: a model fitted
    outside the strategy of a worker that made one, or inside :func:`alone`, is its own."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1))
    size = job_size()
    if replicas >= size or size <= 1 or mine_alone() or _strategy_made():
        return None
    return (f"Keras trains this worker's model alone ({replicas} replica"
            f"{'s' if replicas != 1 else ''}) while the job has {size} workers: the model was "
            f"built outside tf.distribute.MultiWorkerMirroredStrategy().scope(), and this worker "
            f"made no such strategy. Fix: strategy = "
            f"tf.distribute.MultiWorkerMirroredStrategy(), then build and compile the model "
            f"inside `with strategy.scope():`. {ALONE_FIX}")


#: Where TensorFlow defines ``MultiWorkerMirroredStrategy``.
_STRATEGY_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"


def _mark_strategy(strategy: Any) -> None:  # noqa: ARG001 - made: the mark is the module's
    setattr(sys.modules[_STRATEGY_MODULE], _STRATEGY_MADE, True)


def _strategy_made() -> bool:
    return getattr(sys.modules.get(_STRATEGY_MODULE), _STRATEGY_MADE, False)


def _watch_strategies(module: Any) -> None:
    after_call(module.CollectiveAllReduceStrategy, "__init__", _mark_strategy, _STRATEGY_MADE)


def _guard_alone(module: Any) -> None:
    model = getattr(module, "Model", None)
    if model is not None and "tensorflow" in sys.modules:
        before_call(model, "fit", refusing(keras_message, RunsAloneError), ALONE_MARK)


def install() -> None:
    """Patch Keras now if it is already imported, and whenever it is imported later: its
    progress (not with ``HVD_MAGICS_KERAS_PROGRESS=0``), and on a tf job of several workers the
    guard."""
    if rank_job().keras_progress:
        after_import(_KERAS_MODULES, patch_keras)
    if rank_job().engine == ENGINE_TF and job_size() > 1:
        after_import((_STRATEGY_MODULE,), _watch_strategies)
        after_import(_KERAS_MODULES, _guard_alone)
