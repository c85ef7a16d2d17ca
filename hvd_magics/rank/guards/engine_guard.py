"""A call that starts another engine than the rank's fails at once, with one line that names the
engine the rank runs on and the fix (not a hang while it waits for peers that never come, nor
ranks that each train alone).

The rank's engine is ``HVD_MAGICS_ENGINE``; :func:`install` patches, whenever they are imported,
Horovod's ``init`` (``horovod.torch``, ``horovod.tensorflow``, ``horovod.tensorflow.keras``,
``horovod.keras``), ``torch.distributed.init_process_group`` and
``tf.distribute.MultiWorkerMirroredStrategy``, except those of the rank's own engine. On the
Horovod engine it also refuses a Keras 3 ``fit`` with Horovod's Keras callbacks or optimizer at
once (:func:`guard_keras_3`), which Horovod 0.28 cannot train; on the tf engine, a Keras 3 ``fit``
under a MultiWorkerMirroredStrategy of several workers, which Keras 3 cannot train; on any engine,
a Keras 3 ``fit`` on the torch or JAX backend in a job of several ranks, which would train each
rank alone.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

from hvd_magics.protocol import ENGINE_HOROVOD, ENGINE_TF, ENGINE_TORCH
from hvd_magics.rank.guards.import_hooks import after_import, before_call, refusing
from hvd_magics.rank.rank_job import rank_job

#: How a user picks each engine: the magic's option and the Python keyword.
_HOW = {ENGINE_HOROVOD: "%%horovod without --engine (engine='horovod')",
        ENGINE_TORCH: "%%horovod --engine torch (engine='torch')",
        ENGINE_TF: "%%horovod --engine tf (engine='tf')"}
#: What each engine's ranks call to start it.
_STARTS = {ENGINE_HOROVOD: "hvd.init()",
           ENGINE_TORCH: "torch.distributed.init_process_group()",
           ENGINE_TF: "tf.distribute.MultiWorkerMirroredStrategy()"}
_HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras",
                    "horovod.keras")
_TORCH_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_TF_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
_GUARDED = "_hvd_magics_engine_guard"


class WrongEngineError(RuntimeError):
    """The rank's code starts another engine than the one its job runs on."""


class KerasVersionError(TypeError):
    """A Keras 3 model is trained where Keras 3 cannot train: with Horovod's Keras API (which
    needs Keras 2, tf_keras) or with ``fit`` under a multi-worker strategy."""


#: What a Keras 3 ``fit`` with Horovod's callbacks or optimizer fails with.
KERAS_3_MESSAGE = ("Horovod's Keras API (horovod.tensorflow.keras callbacks and "
                   "DistributedOptimizer) trains Keras 2 models only. Fix: build the model "
                   "inside the cell with tf.keras (Keras 2 on the ranks) or with tf_keras "
                   "(import tf_keras as keras), or keep Keras 3 in a custom loop with "
                   "hvd.DistributedGradientTape (docs/magic.md, 'Keras').")
#: What a Keras 3 ``fit`` under a MultiWorkerMirroredStrategy of several workers fails with.
KERAS_3_MULTI_WORKER_MESSAGE = (
    "Keras 3's Model.fit does not train under a MultiWorkerMirroredStrategy of more than one "
    "worker (it fails with 'Attempt to convert a value (PerReplica...)': "
    "keras-team/keras#20585). Fix: build the model in the strategy's scope with tf.keras "
    "(Keras 2 on the ranks) or tf_keras (import tf_keras as keras), or keep Keras 3 in a "
    "custom loop of strategy.run steps.")


#: What a Keras 3 ``fit`` on a backend that no engine distributes fails with.
KERAS_3_BACKEND_MESSAGE = (
    "Keras 3's Model.fit on the {backend} backend would train each of the job's {size} ranks "
    "alone: Keras 3 distributes fit only on TensorFlow (tf.distribute) or with "
    "jax.distributed, which no engine of hvd_magics starts. Fix: on the torch backend wrap the "
    "model in torch.nn.parallel.DistributedDataParallel and train it in a loop (--engine "
    "torch), or build it with tf.keras (Keras 2 on the ranks) and fit it under Horovod or "
    "--engine tf.")


def _from_horovod(value: Any) -> bool:
    return type(value).__module__.startswith("horovod.")


def _keras_3_refusal(engine: str, model: Any, args: tuple, kwargs: dict) -> str | None:
    """Why Keras 3's ``model.fit(*args, **kwargs)`` cannot train on a rank of ``engine``
    (``None`` when it can)."""
    backend = _keras_backend()
    size = rank_job().size
    if backend in ("torch", "jax") and size > 1 and not _jax_distributed(backend):
        return KERAS_3_BACKEND_MESSAGE.format(backend=backend, size=size)
    if engine == ENGINE_HOROVOD:
        callbacks = kwargs.get("callbacks") or (args[5] if len(args) > 5 else None) or []
        if any(_from_horovod(c) for c in callbacks) or \
                _from_horovod(getattr(model, "optimizer", None)):
            return f"the model is a Keras 3 model (the keras package), and {KERAS_3_MESSAGE}"
    elif engine == ENGINE_TF:
        strategy = getattr(model, "distribute_strategy", None)
        resolver = getattr(strategy, "cluster_resolver", None)
        if type(strategy).__name__ in ("MultiWorkerMirroredStrategy",
                                       "CollectiveAllReduceStrategy") and resolver is not None:
            spec = resolver.cluster_spec()
            if "worker" in spec.jobs and spec.num_tasks("worker") > 1:
                return f"the model is a Keras 3 model (the keras package). " \
                       f"{KERAS_3_MULTI_WORKER_MESSAGE}"
    return None


def _keras_backend() -> str:
    import sys

    keras = sys.modules.get("keras")
    try:
        return str(keras.backend.backend()) if keras is not None else ""
    except AttributeError:
        return ""


def _jax_distributed(backend: str) -> bool:
    """Whether JAX runs as several processes (``jax.distributed.initialize`` was called)."""
    if backend != "jax":
        return False
    import jax

    return int(jax.process_count()) > 1


def guard_keras_3(module: Any) -> None:
    """Make Keras 3's ``Model.fit`` fail at once, before any step, where it cannot train: with
    Horovod's Keras callbacks or optimizer (which fail on Keras 3 variables after the first
    batch), under a MultiWorkerMirroredStrategy of several workers, and on a backend no engine
    distributes (torch, JAX) in a job of several ranks."""
    model = getattr(module, "Model", None)
    if model is None:
        return
    engine = rank_job().engine or ""

    def refusal(self: Any, *args: Any, **kwargs: Any) -> str | None:
        return _keras_3_refusal(engine, self, args, kwargs)

    before_call(model, "fit", refusing(refusal, KerasVersionError), _GUARDED)


def wrong_engine_message(called: str, engine: str) -> str:
    """The one line a rank of ``engine`` fails with when its code starts ``called``."""
    return (f"{_STARTS[called]} was called, but this job runs on the {engine} engine, whose "
            f"ranks call {_STARTS[engine]}. Fix: run the cell with {_HOW[called]}, or use "
            f"{_STARTS[engine]} in it.")


def _refuse(original: Callable, called: str, engine: str) -> Callable:
    if getattr(original, _GUARDED, False):
        return original

    @functools.wraps(original)
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise WrongEngineError(wrong_engine_message(called, engine))

    setattr(refused, _GUARDED, True)
    return refused


def install() -> None:
    """Guard every engine but the rank's own (nothing outside a rank of ours)."""
    engine = rank_job().engine
    if engine not in _STARTS:
        return
    after_import(("keras",), guard_keras_3)
    if engine != ENGINE_HOROVOD:
        def guard_horovod(module: Any) -> None:
            if hasattr(module, "init"):
                module.init = _refuse(module.init, ENGINE_HOROVOD, engine)

        after_import(_HOROVOD_MODULES, guard_horovod)
    if engine != ENGINE_TORCH:
        def guard_torch(module: Any) -> None:
            if hasattr(module, "init_process_group"):
                module.init_process_group = _refuse(module.init_process_group, ENGINE_TORCH,
                                                    engine)

        after_import(_TORCH_MODULES, guard_torch)
    if engine != ENGINE_TF:
        def guard_tf(module: Any) -> None:
            strategy = getattr(module, "CollectiveAllReduceStrategy", None)
            if strategy is not None:
                strategy.__init__ = _refuse(strategy.__init__, ENGINE_TF, engine)

        after_import((_TF_MODULE,), guard_tf)
