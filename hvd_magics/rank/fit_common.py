"""What the Keras and PyTorch loops of a :class:`~hvd_magics.estimator.HorovodEstimator` fit
share: how a classifier's output becomes probabilities, the shard's inputs and labels, the
learning rate, the seed of each step, and the result rank 0 sends back (:class:`FitResult`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_magics.protocol import (OUTPUT_EXP, OUTPUT_PROBABILITY, OUTPUT_SIGMOID,
                                 OUTPUT_SOFTMAX)
from hvd_magics.rank.fit_spec import FitSpec

SOFTMAX, SIGMOID, EXP, PROBABILITY = OUTPUT_SOFTMAX, OUTPUT_SIGMOID, OUTPUT_EXP, OUTPUT_PROBABILITY

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


@dataclass
class FitResult:
    """What rank 0 of a fit sends back: the trained model and what the driver's model tells of
    it (see :class:`~hvd_magics.estimator.HorovodModel`)."""

    framework: str  # protocol.KERAS or protocol.TORCH
    model: bytes  # model.keras, or the torch module saved with cloudpickle
    output: str | None  # how a classifier's output becomes probabilities; None: not one
    output_size: int
    history: list[dict[str, Any]]
    position: dict[str, int]
    resumed_from: dict[str, int] | None
    steps_per_epoch: int
    optimizer_step: int


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
