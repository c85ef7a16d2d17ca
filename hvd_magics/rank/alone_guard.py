"""A library that believes its rank runs alone, while the job has several ranks, joins the job
or fails at once with the fix: never N ranks that each train a model of their own while the
job reports N ranks and succeeds.

:func:`install` patches, whenever they are imported:

- Accelerate's ``PartialState`` (under ``Accelerator()``, Hugging Face's ``Trainer`` and
  ``notebook_launcher``-style code): on CPU ranks Accelerate joins torchrun's process group only
  when told it runs on CPU (``Accelerator(cpu=True)``, ``ACCELERATE_USE_CPU``, which ``accelerate
  launch`` sets); a default ``Accelerator()`` saw ``WORLD_SIZE=2`` and ran with
  ``distributed_type`` ``NO``. A rank of a torch job whose Accelerate finds no accelerator now
  joins the job on CPU, as ``accelerate launch`` would; one that still counts other processes
  than the job's ranks (another engine: no process group to join) is refused.
- Hugging Face's ``Trainer`` and Lightning's ``Trainer`` whose world size is not the job's (a
  Horovod or tf job: they join only a ``torch.distributed`` group);
- a Keras ``fit`` on the tf engine whose model was built outside a
  ``MultiWorkerMirroredStrategy`` of the job's workers.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

from hvd_magics.protocol import ENGINE_TF, ENGINE_TORCH, ENV_ENGINE, ENV_SIZE
from hvd_magics.rank.import_hooks import after_call, after_import, before_call, refusing

_ACCELERATE_STATE = "accelerate.state"
_HF_TRAINER = "transformers.trainer"
_LIGHTNING_TRAINERS = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")
_KERAS_MODULES = ("tf_keras", "keras")
_GUARDED = "_hvd_magics_alone_guard"


class RunsAloneError(RuntimeError):
    """A library in a rank would train it alone while the job has several ranks."""


def job_size() -> int:
    """The job's ranks (1 outside a rank of ours)."""
    return int(os.environ.get(ENV_SIZE, "1"))


def _engine_fix(library: str) -> str:
    engine = os.environ.get(ENV_ENGINE)
    if engine != ENGINE_TORCH:
        return (f"{library} joins a torch.distributed group, which only the torch engine's ranks "
                f"have. Fix: run the cell with --engine torch (engine='torch').")
    return (f"Fix: let {library} join the job's torch.distributed group (leave its device and "
            f"process settings at their defaults).")


def alone_message(library: str, processes: int) -> str | None:
    """Why ``library``, which counts ``processes`` processes, cannot run as this rank, or
    ``None`` when it counts the job's ranks."""
    size = job_size()
    if processes == size or size <= 1:
        return None
    return (f"{library} runs this rank as {processes} process{'es' if processes != 1 else ''} "
            f"of its own while the job has {size} ranks: each rank would train a model of its "
            f"own on its own data. {_engine_fix(library)}")


def _cpu_when_alone(prepare: Any) -> Any:
    """Accelerate's ``PartialState._prepare_backend``, choosing torch's Gloo on CPU (as
    ``cpu=True`` does) where it found no accelerator in a torch job of several ranks."""
    @functools.wraps(prepare)
    def prepare_backend(self: Any, cpu: bool = False, *args: Any, **kwargs: Any) -> Any:
        backend, distributed = prepare(self, cpu, *args, **kwargs)
        if (not cpu and str(distributed).endswith(".NO") and job_size() > 1
                and os.environ.get(ENV_ENGINE) == ENGINE_TORCH):
            self._cpu = True  # noqa: SLF001 - what PartialState(cpu=True) sets
            backend, distributed = prepare(self, True, *args, **kwargs)
        return backend, distributed

    setattr(prepare_backend, _GUARDED, True)
    return prepare_backend


def _guard_accelerate(module: Any) -> None:
    state = getattr(module, "PartialState", None)
    if state is None or getattr(state._prepare_backend, _GUARDED, False):  # noqa: SLF001
        return
    state._prepare_backend = _cpu_when_alone(state._prepare_backend)  # noqa: SLF001
    after_call(state, "__init__", refusing(
        lambda made: alone_message(_accelerate_user(), made.num_processes), RunsAloneError),
        _GUARDED)


def _accelerate_user() -> str:
    """Whom Accelerate's state is made for: Hugging Face's ``Trainer`` when its frames are on
    the stack (it runs on Accelerate), else Accelerate itself."""
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("transformers."):
            return "Hugging Face's Trainer (on Accelerate)"
        frame = frame.f_back
    return "Accelerate"


def _guard_hf(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", refusing(
            lambda made: alone_message("Hugging Face's Trainer", made.args.world_size),
            RunsAloneError), _GUARDED)


def _guard_lightning(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", refusing(
            lambda made: alone_message("Lightning's Trainer", made.world_size), RunsAloneError),
            _GUARDED)


def keras_message(model: Any, *_args: Any, **_kwargs: Any) -> str | None:
    """Why a Keras ``model.fit`` on a tf job's worker would train it alone, or ``None``."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1))
    size = job_size()
    if replicas >= size or size <= 1:
        return None
    return (f"Keras trains this worker's model alone ({replicas} replica"
            f"{'s' if replicas != 1 else ''}) while the job has {size} workers: the model was "
            f"built outside tf.distribute.MultiWorkerMirroredStrategy().scope(). Fix: strategy = "
            f"tf.distribute.MultiWorkerMirroredStrategy(), then build and compile the model "
            f"inside `with strategy.scope():`.")


def _guard_keras(module: Any) -> None:
    model = getattr(module, "Model", None)
    if model is not None and "tensorflow" in sys.modules:
        before_call(model, "fit", refusing(keras_message, RunsAloneError), _GUARDED)


def install() -> None:
    """Guard the libraries (nothing outside a rank of ours, or in a job of one rank)."""
    if os.environ.get(ENV_ENGINE) is None or job_size() <= 1:
        return
    after_import((_ACCELERATE_STATE,), _guard_accelerate)
    after_import((_HF_TRAINER,), _guard_hf)
    if os.environ.get(ENV_ENGINE) != ENGINE_TORCH:
        after_import(_LIGHTNING_TRAINERS, _guard_lightning)
    if os.environ.get(ENV_ENGINE) == ENGINE_TF:
        after_import(_KERAS_MODULES, _guard_keras)
