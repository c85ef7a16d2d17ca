"""The function every rank of a :class:`~hvd_magics.estimator.HorovodEstimator` fit runs.

:func:`fit_on_rank` builds the model, finds the framework (tf_keras or PyTorch) and hands over to
:mod:`hvd_magics.rank.fits.fit_keras` or :mod:`hvd_magics.rank.fits.fit_torch`. Both train the same
way: rank 0 reads the latest checkpoint of the model directory (or takes its freshly built model)
and every rank starts from that state; epochs run by
:func:`~hvd_magics.common.checkpoints.epoch_plan` over the rank's shard; validation metrics are
averaged over the ranks every epoch; rank 0 writes checkpoints, event files and the final model, and
sends back the model for ``transform``.
"""
from __future__ import annotations

import os
from typing import Any

from hvd_magics.protocol import KERAS, TORCH
from hvd_magics.rank.fits.fit_common import FitResult
from hvd_magics.common.fit_spec import FitSpec


def framework_of(model: Any) -> str | None:
    """``"keras"`` for a tf_keras model, ``"torch"`` for a torch module, else ``None``."""
    for kind in type(model).__mro__:
        root = kind.__module__.split(".")[0]
        if root == "torch" and kind.__name__ == "Module":
            return TORCH
        if root in ("tf_keras", "keras") and kind.__name__ == "Model":
            return KERAS
    return None


def build_model(model: Any) -> tuple[Any, str]:
    """The model (calling ``model`` when it is a function that builds one) and its framework.

    Raises
    ------
    TypeError
        For anything but a tf_keras model or a torch module, and for a Keras 3 model.
    """
    built = model() if framework_of(model) is None and callable(model) else model
    framework = framework_of(built)
    if framework is None:
        raise TypeError(f"the estimator's model must be a tf_keras Model or a torch.nn.Module, "
                        f"or a function that returns one; got {type(built).__name__}")
    if framework == KERAS and type(built).__module__.split(".")[0] == "keras":
        raise TypeError("the model is a Keras 3 model; Horovod's Keras optimizer needs Keras 2. "
                        "Fix: build it with tf_keras (import tf_keras as keras) or with tf.keras "
                        "under TF_USE_LEGACY_KERAS=1 (the ranks' default)")
    return built, framework


def fit_on_rank(spec: FitSpec, train: Any, val: Any = None) -> FitResult | None:
    """Train on this rank's shards; rank 0 returns what the driver's model needs."""
    model, framework = build_model(spec.model)
    if spec.model_dir:
        os.makedirs(spec.model_dir, exist_ok=True)
    if framework == KERAS:
        from hvd_magics.rank.fits.fit_keras import fit_keras

        return fit_keras(spec, model, train, val)
    from hvd_magics.rank.fits.fit_torch import fit_torch

    return fit_torch(spec, model, train, val)
