"""Inference in Spark tasks for :meth:`HorovodModel.transform
<hvd_magics.estimator.HorovodModel.transform>`: an Arrow UDF over batches of rows.

The model is loaded once per Python worker (Spark reuses its Python workers, and this module stays
loaded in them): :data:`_LOADED` keeps it by the digest of its bytes. Each Arrow batch becomes one
or a few framework calls on whole arrays; no row goes through Python one at a time.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

import numpy as np

from hvd_magics.protocol import (ENV_LEGACY_KERAS, ENV_TF_LOG_LEVEL, KERAS, OUTPUT_EXP,
                                 OUTPUT_SIGMOID, OUTPUT_SOFTMAX)
from hvd_magics.task.threads import task_cpus
from hvd_magics.task.worker_heap import freeze_once

#: Output fields of the UDF's struct (the model adds them as columns under its param names).
PREDICTION, PROBABILITY, RAW = "prediction", "probability", "raw"

#: Model digest -> a function from input arrays to the model's output (one per Python worker).
_LOADED: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {}


@dataclass
class PredictConfig:
    """What the UDF needs: the model's bytes and how to read its inputs and outputs."""

    key: str
    framework: str
    blob: bytes
    columns: list[str]
    input_names: list[str] | None
    output: str | None  # how a classifier's output becomes probabilities; None: not one
    fields: list[str] = field(default_factory=lambda: [PREDICTION])
    batch_size: int = 4096


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: TensorFlow's C++ start-up lines (which no log level
    silences) would otherwise reach the notebook from every Python worker."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """TensorFlow's C++ log level 3 while it is first imported (it keeps the level it read), not
    left in the Python worker's environment: a reused worker passes its environment on to the
    ranks of the next job it runs, whose TensorFlow would be silenced (and whose zygote would be
    another)."""
    if ENV_TF_LOG_LEVEL in os.environ:
        yield
        return
    os.environ[ENV_TF_LOG_LEVEL] = "3"
    try:
        yield
    finally:
        os.environ.pop(ENV_TF_LOG_LEVEL, None)


def model_from_bytes(framework: str, blob: bytes, compile: bool = False) -> Any:
    """The network from a fit's bytes: a tf_keras model from ``.keras`` bytes (TensorFlow's
    start-up lines kept off stderr), or a torch module from ``torch.save`` bytes."""
    if framework == KERAS:
        os.environ.setdefault(ENV_LEGACY_KERAS, "1")
        with _quiet_stderr(), quiet_tensorflow(), tempfile.TemporaryDirectory() as folder:
            import tf_keras

            path = os.path.join(folder, "model.keras")
            with open(path, "wb") as handle:
                handle.write(blob)
            return tf_keras.models.load_model(path, compile=compile)
    import torch

    return torch.load(io.BytesIO(blob), weights_only=False, map_location="cpu")


def _keras_predictor(model: Any, config: PredictConfig) -> Callable[[list[np.ndarray]], np.ndarray]:
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def call(inputs: Any) -> Any:
        return model(inputs, training=False)

    def predict(arrays: list[np.ndarray]) -> np.ndarray:
        if config.input_names:
            inputs: Any = dict(zip(config.input_names, arrays))
        else:
            inputs = arrays[0] if len(arrays) == 1 else tuple(arrays)
        return np.asarray(call(inputs))

    return predict


def _torch_predictor(model: Any, config: PredictConfig) -> Callable[[list[np.ndarray]], np.ndarray]:
    import torch
    from pyspark import TaskContext

    torch.set_num_threads(task_cpus(TaskContext.get()))
    model.eval()

    def predict(arrays: list[np.ndarray]) -> np.ndarray:
        with warnings.catch_warnings():  # read-only views of Arrow buffers: nothing writes them
            warnings.simplefilter("ignore", UserWarning)
            tensors = [torch.from_numpy(a) for a in arrays]
        with torch.inference_mode():
            out = model(**dict(zip(config.input_names, tensors))) if config.input_names \
                else model(*tensors)
        return out.numpy()

    return predict


def predictor(model: Any, config: PredictConfig) -> Callable[[list[np.ndarray]], np.ndarray]:
    """A function from the input arrays (in ``config.columns`` order) to ``model``'s output."""
    return (_keras_predictor if config.framework == KERAS else _torch_predictor)(model, config)


def loaded(config: PredictConfig) -> Callable[[list[np.ndarray]], np.ndarray]:
    """The model of ``config``, loaded at its first use in this Python worker."""
    if config.key not in _LOADED:
        _LOADED[config.key] = predictor(model_from_bytes(config.framework, config.blob), config)
        freeze_once(config.key)  # Spark's collection after each task: not the model again
    return _LOADED[config.key]


def column_matrix(array: Any, name: str) -> np.ndarray:
    """A 2-D float32 array from an Arrow column of fixed-length lists or of numbers.

    Raises
    ------
    ValueError
        For nulls, or lists of different lengths, naming the column.
    """
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.null_count:
        raise ValueError(f"column {name!r} has {array.null_count} null values in a batch; "
                         f"drop them before transform (df.na.drop(subset=[{name!r}]))")
    rows = len(array)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        offsets = np.asarray(array.offsets)
        widths = np.diff(offsets)
        if rows and not np.all(widths == widths[0]):
            raise ValueError(f"rows of column {name!r} have different lengths "
                             f"({widths.min()} to {widths.max()}); the model needs one length")
        values = array.values.slice(offsets[0], offsets[-1] - offsets[0]) if rows else array.values
        width = int(widths[0]) if rows else 0
        return values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(
            rows, width)
    return array.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(rows, 1)


def probabilities(raw: np.ndarray, output: str) -> np.ndarray:
    """Class probabilities from a classifier's raw output (one column: binary)."""
    if output == OUTPUT_SOFTMAX:
        shifted = np.exp(raw - raw.max(axis=1, keepdims=True))
        probs = shifted / shifted.sum(axis=1, keepdims=True)
    elif output == OUTPUT_SIGMOID:
        probs = 1.0 / (1.0 + np.exp(-raw))
    elif output == OUTPUT_EXP:
        probs = np.exp(raw)
    else:
        probs = raw
    if probs.shape[1] == 1:
        probs = np.concatenate([1.0 - probs, probs], axis=1)
    return probs


def _lists(matrix: np.ndarray, kind: Any) -> Any:
    import pyarrow as pa

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1).astype(kind)))


def output_struct(raw: np.ndarray, config: PredictConfig) -> Any:
    """The UDF's struct of the fields ``config.fields`` for one batch of model outputs."""
    import pyarrow as pa

    raw = raw.reshape(len(raw), -1)
    if config.output is None:
        prediction = pa.array(raw[:, 0].astype(np.float64)) if raw.shape[1] == 1 \
            else _lists(raw, np.float32)
        columns = {PREDICTION: prediction}
    else:
        probs = probabilities(raw.astype(np.float64), config.output)
        columns = {PREDICTION: pa.array(probs.argmax(axis=1).astype(np.float64))}
        if PROBABILITY in config.fields:
            columns[PROBABILITY] = _lists(probs, np.float64)
        if RAW in config.fields:
            columns[RAW] = _lists(raw, np.float64)
    return pa.StructArray.from_arrays([columns[name] for name in config.fields],
                                      names=list(config.fields))


def predict_batches(batches: Iterator[Any], config: PredictConfig) -> Iterator[Any]:
    """The UDF's body: each batch of input columns (one Arrow array, or a tuple of them) to the
    struct of outputs, ``config.batch_size`` rows per model call at most."""
    predict = loaded(config)
    for batch in batches:
        columns = batch if isinstance(batch, tuple) else (batch,)
        arrays = [column_matrix(a, n) for a, n in zip(columns, config.columns)]
        rows = len(arrays[0])
        outputs = [predict([a[start:start + config.batch_size] for a in arrays])
                   for start in range(0, rows, config.batch_size)] or [np.zeros((0, 1))]
        yield output_struct(np.concatenate(outputs) if len(outputs) > 1 else outputs[0], config)
