"""Networks the estimator tests train (pickled by value, like tests.jobs)."""
from __future__ import annotations


def torch_mlp(inputs: int = 64, classes: int = 10):
    """A function that builds a small PyTorch classifier (logits out)."""
    def build():
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(inputs, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, classes))

    return build


def keras_mlp(inputs: int = 64, classes: int = 10):
    """A function that builds a small tf_keras classifier (softmax out)."""
    def build():
        import tf_keras as keras

        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.layers.Input((inputs,)),
                                 keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(classes, activation="softmax")])

    return build


def event_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file in ``folder``, read by TensorFlow."""
    import glob
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(str(folder), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found
