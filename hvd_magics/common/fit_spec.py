"""What a :class:`~hvd_magics.estimator.HorovodEstimator` fit asks of every rank (shared by the
driver, which fills it in, and the ranks, which train by it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The learning rate of an optimizer given by name, unless the learningRate param says.
DEFAULT_LEARNING_RATE = 0.001


@dataclass
class OptimizerRecipe:
    """An optimizer to build on a rank: a name (``"adam"``), a class, a function of the model's
    parameters, or a framework's serialized config (a Keras optimizer given as an instance)."""

    kind: str  # "name" | "class" | "factory" | "keras_config" | "torch_instance"
    value: Any
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class FitSpec:
    """Everything a rank needs to train one fit, besides the data (its shards)."""

    model: Any  # a model, or a function that builds one
    optimizer: OptimizerRecipe
    learning_rate: float | None
    scale_learning_rate: bool
    loss: Any
    metrics: list[Any]
    features: list[str]  # the shard columns, in the order of the model's inputs
    input_names: list[str] | None  # the model's input names (several feature columns)
    label: str
    batch_size: int
    epochs: int
    max_steps: int | None
    shuffle: bool
    seed: int
    model_dir: str | None
    checkpoint_secs: float | None
    keep_checkpoints: int
    classifier: bool | None
    remainder: str = "repeat"
