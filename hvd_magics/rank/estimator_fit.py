"""The function every rank of a :class:`~hvd_magics.estimator.HorovodEstimator` fit runs.

:func:`fit_on_rank` builds the model, finds the framework (tf_keras or PyTorch) and hands over to
:mod:`hvd_magics.rank.fit_keras` or :mod:`hvd_magics.rank.fit_torch`. Both train the same way:
rank 0 reads the latest checkpoint of the model directory (or takes its freshly built model) and
every rank starts from that state; epochs run by :func:`~hvd_magics.rank.checkpoints.epoch_plan`
over the rank's shard; validation metrics are averaged over the ranks every epoch; rank 0 writes
checkpoints, event files and the final model, and sends back the model for ``transform``.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from hvd_magics.protocol import KERAS, TORCH
from hvd_magics.rank.fit_spec import FitSpec

#: Output of a classifier's model, and how ``transform`` turns it into probabilities.
SOFTMAX, SIGMOID, EXP, PROBABILITY = "softmax", "sigmoid", "exp", "probability"

_CLASSIFICATION_LOSSES = {
    # name (a string loss, or a loss class's name, lower case) -> output unless from_logits
    "sparse_categorical_crossentropy": PROBABILITY, "sparsecategoricalcrossentropy": PROBABILITY,
    "categorical_crossentropy": PROBABILITY, "categoricalcrossentropy": PROBABILITY,
    "binary_crossentropy": PROBABILITY, "binarycrossentropy": PROBABILITY,
    "cross_entropy": SOFTMAX, "crossentropyloss": SOFTMAX,
    "nll": EXP, "nll_loss": EXP, "nllloss": EXP,
    "bce": PROBABILITY, "bceloss": PROBABILITY,
    "bce_with_logits": SIGMOID, "bcewithlogitsloss": SIGMOID,
}


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


def classifier_output(loss: Any, classifier: bool | None) -> str | None:
    """How ``transform`` gets probabilities from the model's output (``None``: not a classifier),
    from the loss (its name, its class and ``from_logits``) unless ``classifier`` says."""
    name = loss if isinstance(loss, str) else type(loss).__name__
    if not isinstance(loss, str) and getattr(loss, "__name__", None):
        name = loss.__name__  # a loss function
    kind = _CLASSIFICATION_LOSSES.get(str(name).lower())
    config = getattr(loss, "get_config", lambda: {})()
    if kind == PROBABILITY and isinstance(config, dict) and config.get("from_logits"):
        kind = SIGMOID if "binary" in str(name).lower() else SOFTMAX
    if classifier is False:
        return None
    return kind or (PROBABILITY if classifier else None)


def inputs_of(shard: Any, spec: FitSpec) -> list[np.ndarray]:
    """The model inputs of ``shard``'s rows: one 2-D float32 array per feature column."""
    return [shard.feature_matrix(column) for column in spec.features]


def labels_of(shard: Any, spec: FitSpec, classifier: bool) -> np.ndarray:
    labels = shard.to_numpy(spec.label)
    if classifier and labels.dtype.kind in "fiub" and labels.ndim == 1:
        if labels.dtype.kind == "f" and not np.all(np.mod(labels, 1) == 0):
            return labels.astype(np.float32)
        return labels.astype(np.int64)
    return labels.astype(np.float32) if labels.dtype.kind in "fiub" else labels


def scaled_learning_rate(spec: FitSpec, size: int, default: float) -> float:
    rate = spec.learning_rate if spec.learning_rate is not None else default
    return rate * size if spec.scale_learning_rate else rate


def step_seed(seed: int, rank: int, global_step: int) -> int:
    """The random seed of one rank's training step: what a step draws (dropout) depends only on
    the fit's seed, the rank and the step, so a resumed fit draws what the uninterrupted one
    did."""
    return (seed * 1_000_003 + global_step * 1_009 + rank) % (2 ** 31 - 1)


def fit_on_rank(spec: FitSpec, train: Any, val: Any = None) -> dict[str, Any] | None:
    """Train on this rank's shards; rank 0 returns what the driver's model needs."""
    model, framework = build_model(spec.model)
    if spec.model_dir:
        os.makedirs(spec.model_dir, exist_ok=True)
    if framework == KERAS:
        from hvd_magics.rank.fit_keras import fit_keras

        return fit_keras(spec, model, train, val)
    from hvd_magics.rank.fit_torch import fit_torch

    return fit_torch(spec, model, train, val)
