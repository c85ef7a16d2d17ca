"""One rank of a tf_keras :class:`~hvd_magics.estimator.HorovodEstimator` fit (see
:mod:`hvd_magics.rank.fits.estimator_fit` for the common plan).

Each epoch (or the rest of one, after a resume) is one ``model.fit`` call over a ``tf.data``
pipeline that gathers the epoch's batches from the shard in the order
:meth:`~hvd_magics.rank.api.shard.Shard.epoch_order` gives, so a resumed fit sees the batches it has
not seen yet. Horovod's ``DistributedOptimizer`` averages the gradients and its
``MetricAverageCallback`` the epoch's metrics.
"""
from __future__ import annotations

import importlib
import pickle
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from hvd_magics.protocol import KERAS
from hvd_magics.common.checkpoints import Position
from hvd_magics.rank.fits.fit_common import (FitBook, FitResult, classifier_output, inputs_of,
                                        labels_of, scaled_learning_rate, start_state, step_seed)
from hvd_magics.common.fit_spec import DEFAULT_LEARNING_RATE, FitSpec
from hvd_magics.rank.integrations.keras import progress_callback


def keras_optimizer(spec: FitSpec, keras: Any, size: int) -> Any:
    """The optimizer of ``spec`` (not yet distributed), its learning rate set and scaled."""
    recipe = spec.optimizer
    if recipe.kind == "name":
        optimizer = keras.optimizers.deserialize(
            {"class_name": str(recipe.value), "config": {}}, use_legacy_optimizer=False)
    elif recipe.kind == "keras_config":
        optimizer = keras.optimizers.deserialize(recipe.value, use_legacy_optimizer=False)
    elif recipe.kind == "class":
        optimizer = recipe.value(**recipe.options)
    else:  # "factory"
        optimizer = recipe.value()
    rate = optimizer.learning_rate
    schedule = keras.optimizers.schedules.LearningRateSchedule
    if isinstance(getattr(optimizer, "_learning_rate", None), schedule) or (
            not hasattr(rate, "numpy") and not isinstance(rate, (int, float))):
        return optimizer  # a schedule (its learning rate reads as a tensor): used as it is
    default = float(rate) if recipe.kind != "name" else DEFAULT_LEARNING_RATE
    optimizer.learning_rate = scaled_learning_rate(spec, size, default)
    return optimizer


def _variables(optimizer: Any) -> list[Any]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _build(optimizer: Any, variables: list[Any]) -> None:
    if hasattr(optimizer, "build"):
        optimizer.build(variables)
    else:  # a legacy optimizer
        optimizer._create_all_weights(variables)  # noqa: SLF001 - its only public way is a step


def _state(model: Any, optimizer: Any, position: Position,
           history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"weights": model.get_weights(), "optimizer": [v.numpy() for v in _variables(optimizer)],
            "position": asdict(position), "history": history}


def _restore(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    variables = _variables(optimizer)
    if len(variables) != len(state["optimizer"]):
        raise ValueError(f"the checkpoint holds {len(state['optimizer'])} optimizer variables but "
                         f"this model's optimizer has {len(variables)}: it was written for "
                         "another model or optimizer. Fix: use a new modelDir")
    model.set_weights(state["weights"])
    for variable, value in zip(variables, state["optimizer"]):
        variable.assign(value)


def step_generators(model: Any) -> list[Any]:
    """The random generators of the model's layers that draw while training (dropout, noise),
    each a ``tf.random.Generator`` whose state the fit sets at every step.

    tf_keras makes them TF1-style stateful ops by default, whose state lives inside the traced
    train function (a resumed fit would start it afresh); they are switched to
    ``tf.random.Generator`` (tf_keras' own "stateful" kind) before the first step.
    """
    generators = []
    for layer in model.submodules:
        rng = getattr(layer, "_random_generator", None)
        if rng is None or not hasattr(rng, "_rng_type"):
            continue
        if getattr(rng, "_generator", None) is None:
            rng._rng_type, rng._built = rng.RNG_STATEFUL, False  # noqa: SLF001 - see above
            rng._maybe_init()  # noqa: SLF001
        if getattr(rng, "_generator", None) is not None:
            generators.append(rng._generator)  # noqa: SLF001
    return generators


def fit_keras(spec: FitSpec, model: Any, train: Any, val: Any) -> FitResult | None:
    """Train ``model`` (a tf_keras model) on this rank's ``train`` shard (``val``: the
    validation shard, or ``None``) as ``spec`` says, one ``model.fit`` call per epoch.

    Returns
    -------
    FitResult or None
        Rank 0's result; ``None`` on the other ranks.
    """
    import horovod.tensorflow.keras as hvd

    keras: Any = importlib.import_module(type(model).__module__.split(".")[0])
    hvd.init()
    output_kind = classifier_output(spec.loss, spec.classifier)
    optimizer, plain_config = _compile(spec, keras, model, hvd)
    book = _book(spec, model, optimizer, hvd.rank())
    data = _KerasData(spec, train, val, output_kind is not None)
    steps = train.steps_per_epoch(spec.batch_size, spec.remainder)
    callbacks = _epoch_callbacks(spec, keras, hvd, optimizer, step_generators(model), book, steps)
    for epoch, first, count in book.plan(steps):
        fitted = model.fit(data.epoch(epoch, first, count), epochs=epoch + 1,
                           initial_epoch=epoch, steps_per_epoch=count, validation_data=data.val,
                           callbacks=callbacks(epoch, first), verbose=0)
        logs = {name: float(values[-1]) for name, values in fitted.history.items()}
        book.end_epoch(epoch, first, count, steps, int(optimizer.iterations.numpy()), logs)
    if not book.close():
        return None
    optimizer_step = int(optimizer.iterations.numpy())
    _compile_plain(spec, keras, model, optimizer, plain_config)
    blob = _save_final(model, spec.model_dir)
    example = model(data.model_inputs([x[:2] for x in data.xs]), training=False)
    output_size = int(np.prod(example.shape[1:]))
    return book.result(KERAS, blob, output_kind, output_size, steps, optimizer_step)


def _compile(spec: FitSpec, keras: Any, model: Any, hvd: Any) -> tuple[Any, dict[str, Any]]:
    """Compile ``model`` with Horovod's ``DistributedOptimizer`` around the spec's optimizer and
    build its variables; the optimizer that steps, and the plain one's serialized config."""
    optimizer = keras_optimizer(spec, keras, hvd.size())
    plain_config = keras.optimizers.serialize(optimizer)
    model.compile(hvd.DistributedOptimizer(optimizer), loss=spec.loss, metrics=list(spec.metrics))
    optimizer = model.optimizer
    _build(optimizer, model.trainable_variables)
    return optimizer, plain_config


def _book(spec: FitSpec, model: Any, optimizer: Any, rank: int) -> FitBook:
    """Every rank restored to rank 0's start state (its latest checkpoint, else the fresh
    model); the fit's book, which writes checkpoints as pickles."""
    import horovod.tensorflow as hvd_tf

    def load(path: Path) -> dict[str, Any]:
        with open(path, "rb") as handle:
            return pickle.load(handle)

    def write(path: Path, at: Position, history: list[dict[str, Any]]) -> None:
        with open(path, "wb") as handle:
            pickle.dump(_state(model, optimizer, at, history), handle, protocol=4)

    state, found = start_state(
        spec, rank, lambda: _state(model, optimizer, Position(), []), load,
        lambda value: hvd_tf.broadcast_object(value, root_rank=0, name="hvd_magics_start_state"))
    _restore(model, optimizer, state)
    return FitBook(spec, rank, state, found, write, "pkl")


class _KerasData:
    """The shard's inputs and labels as tensors, each epoch's batches as a ``tf.data``
    pipeline, and the validation set's (``val``: ``None`` without one)."""

    def __init__(self, spec: FitSpec, train: Any, val: Any, classifier: bool) -> None:
        import tensorflow as tf

        self.spec, self.train = spec, train
        self.xs = [tf.constant(x) for x in inputs_of(train, spec)]
        self.ys = tf.constant(labels_of(train, spec, classifier))
        self.val = None
        if val is not None:
            val_inputs = self.model_inputs(inputs_of(val, spec))
            self.val = tf.data.Dataset.from_tensor_slices(
                (val_inputs, labels_of(val, spec, classifier))).batch(spec.batch_size)

    def model_inputs(self, parts: list[Any]) -> Any:
        """``parts`` as the model takes them: by name, alone, or as a tuple."""
        if self.spec.input_names:
            return dict(zip(self.spec.input_names, parts))
        return parts[0] if len(parts) == 1 else tuple(parts)

    def epoch(self, epoch: int, first: int, count: int) -> Any:
        """The ``count`` batches of ``epoch`` from its ``first`` on, in the shard's order."""
        import tensorflow as tf

        spec, size = self.spec, self.spec.batch_size
        order = self.train.epoch_order(size, spec.shuffle, spec.seed + epoch, spec.remainder)
        order = order[first * size:(first + count) * size]
        return tf.data.Dataset.from_tensor_slices(order).batch(size).map(
            lambda rows: (self.model_inputs([tf.gather(x, rows) for x in self.xs]),
                          tf.gather(self.ys, rows))
        ).prefetch(2)


def _epoch_callbacks(spec: FitSpec, keras: Any, hvd: Any, optimizer: Any, generators: list[Any],
                     book: FitBook, steps: int) -> Callable[[int, int], list[Any]]:
    """``callbacks(epoch, first)``: the callbacks of one ``model.fit`` call, for the epoch
    ``epoch`` from its step ``first`` on."""

    class _SeedEachStep(keras.callbacks.Callback):
        """Each step draws from a state set by the fit's seed, the rank and the step (the
        optimizer's step counter is read once per ``fit`` call, not at every step)."""

        def on_train_begin(self, logs: Any = None) -> None:
            self.first_step, self.rank = int(optimizer.iterations.numpy()), hvd.rank()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            for index, generator in enumerate(generators):
                generator.reset_from_seed(step_seed(spec.seed + index, self.rank,
                                                    self.first_step + batch))

    class _AfterEachStep(keras.callbacks.Callback):
        """Every rank, after each step: rank 0's timed checkpoint, and the save on a
        preemption notice (:meth:`FitBook.after_step`)."""

        def __init__(self, epoch: int, first: int) -> None:
            super().__init__()
            self.epoch, self.first = epoch, first

        def on_train_begin(self, logs: Any = None) -> None:
            self.start = int(optimizer.iterations.numpy())  # read once, not every step

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            book.after_step(self.epoch, self.first + batch + 1, steps, self.start + batch + 1)

    def callbacks(epoch: int, first: int) -> list[Any]:
        chosen = [hvd.callbacks.MetricAverageCallback()]
        chosen += [_SeedEachStep()] if generators else []
        if spec.model_dir:
            chosen.append(_AfterEachStep(epoch, first))
        shown = progress_callback(keras, spec.batch_size, spec.epochs, steps)
        return chosen + ([shown] if shown is not None else [])

    return callbacks


def _compile_plain(spec: FitSpec, keras: Any, model: Any, optimizer: Any,
                   plain_config: dict[str, Any]) -> None:
    """Compile ``model`` again with a plain optimizer of the same settings and state (not
    Horovod's wrapper), so that the saved model loads anywhere and training can go on from it."""
    values = [v.numpy() for v in _variables(optimizer)]
    plain = keras.optimizers.deserialize(plain_config, use_legacy_optimizer=False)
    model.compile(plain, loss=spec.loss, metrics=list(spec.metrics))
    _build(plain, model.trainable_variables)
    if len(_variables(plain)) == len(values):
        for variable, value in zip(_variables(plain), values):
            variable.assign(value)


def _save_final(model: Any, model_dir: str | None) -> bytes:
    """``model.keras`` in the model directory; its bytes for ``transform``."""
    if model_dir:
        path = Path(model_dir) / "model.keras"
        model.save(path)
        return path.read_bytes()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.keras"
        model.save(path)
        return path.read_bytes()
