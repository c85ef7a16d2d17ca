"""HorovodEstimator: an MLlib Estimator that trains a tf_keras or PyTorch network with Horovod on
a Spark DataFrame, each rank on its shard, and returns a :class:`HorovodModel`."""
from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import asdict
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable

from hvd_magics.errors import DataRefused, EstimatorInputError
from hvd_magics.estimator.input_checks import (check_boolean, check_model_dir, check_params,
                                               column_kinds)
from hvd_magics.estimator.model import HorovodModel
from hvd_magics.estimator.params import OBJECT_PARAMS, EstimatorParams, add_accessors
from hvd_magics.estimator.persistence import BlobReader, BlobWriter
from hvd_magics.protocol import KERAS, TORCH
from hvd_magics.rank.fits.estimator_fit import framework_of
from hvd_magics.common.fit_spec import FitSpec, OptimizerRecipe

#: What a fit's ranks import while the data arrives, per framework. PyTorch's ``torch._dynamo``
#: is what rank 0's ``torch.export`` of ``model.pt2`` needs at the end: 1.5 s to import.
FIT_IMPORTS: dict[str, tuple[str, ...]] = {TORCH: ("torch", "horovod.torch", "torch._dynamo"),
                                           KERAS: ("tensorflow", "tf_keras",
                                                   "horovod.tensorflow.keras")}

_MODEL_FIX = ("Fix: pass a function that builds the model (model=build_model), so that each rank "
              "builds its own")


def rank_imports(model: Any) -> tuple[str, ...]:
    """The modules the ranks of a fit of ``model`` import early: its framework's, known from the
    model or, for a function that builds one, from the names its code uses (a guess that only
    decides what is imported early, never what runs)."""
    framework = framework_of(model)
    code = getattr(model, "__code__", None)
    if framework is None and code is not None:
        names = set(code.co_names) | {n for c in code.co_consts if hasattr(c, "co_names")
                                      for n in c.co_names}
        framework = TORCH if "torch" in names else (
            KERAS if names & {"tf_keras", "tensorflow", "keras", "tf"} else None)
    return FIT_IMPORTS.get(framework, ()) if framework is not None else ()


class HorovodEstimator(Estimator, EstimatorParams, MLReadable, MLWritable):
    """Train a deep network with Horovod on a Spark DataFrame, as an MLlib Estimator.

    ``fit(df)`` runs ``np`` ranks as one Spark barrier stage (with the same live dashboard as
    ``%%horovod``); each rank trains on its shard of ``df``. It returns a :class:`HorovodModel`
    whose ``transform`` adds predictions in Spark tasks. Usable as a ``Pipeline`` stage; the
    estimator, the model and a fitted ``PipelineModel`` save and load with MLlib's API.

    Parameters
    ----------
    model : tf_keras Model, torch.nn.Module or callable
        The network, or (preferred) a function that builds it on each rank. Keras models must be
        tf_keras (Keras 2): Horovod's Keras optimizer does not support Keras 3.
    optimizer : str, optimizer, class or callable, default "adam"
        A name; a Keras optimizer instance or class; a torch.optim class, an instance built on
        the model's parameters (its class and settings are used), or a function of the
        parameters that returns one.
    learningRate : float, optional
        Learning rate on one rank (default: the optimizer's own, 0.001 for a name).
    scaleLearningRate : bool, default True
        Multiply the learning rate by the number of ranks (Horovod's advice).
    loss : str, loss object or callable
        Keras: anything ``compile`` takes. PyTorch: ``"cross_entropy"``, ``"nll"``, ``"mse"``,
        ``"mae"``, ``"bce"``, ``"bce_with_logits"``, ``"huber"``, a ``torch.nn`` loss module or
        a function ``(output, label) -> loss``.
    metrics : list, default []
        Keras: anything ``compile`` takes. PyTorch: ``"accuracy"``, ``"mae"``, ``"mse"``.
    featuresCol, featureMapping, labelCol : str, dict, str
        One feature column (a vector, an array of numbers, or a number), or several as
        ``{column: model input name}``; the label column.
    predictionCol, probabilityCol, rawPredictionCol : str
        Output columns of the model's ``transform`` (empty string: not written).
    classifier : bool, optional
        Classifier outputs (class index as ``predictionCol``, probabilities as a vector). By
        default: when the loss is a classification loss.
    batchSize, epochs, maxSteps : int
        Rows per batch on each rank; epochs in all; optimizer steps in all (optional).
    validationFraction, isValidationCol : float, str
        Hold out a random fraction of rows, or the rows where a boolean column is true; their
        loss and metrics are computed every epoch, averaged over the ranks.
    np : int, optional
        Ranks (Spark tasks of one barrier stage); default: every task slot of the cluster.
    modelDir : str, optional
        A folder every rank reaches (on a cluster: shared storage): checkpoints (rank 0, each
        epoch and every ``saveCheckpointsSecs``), TensorBoard event files (``events/train``,
        ``events/validation``) and the final model: ``model.keras`` (Keras,
        ``tf_keras.models.load_model``) or ``model.pt`` (PyTorch, ``torch.load(path,
        weights_only=False)``), ``state_dict.pt`` and, when ``torch.export`` captures it,
        ``model.pt2`` (``torch.export.load(path).module()``, no model code needed). A fit
        with a ``modelDir`` that holds a checkpoint resumes from it (weights, optimizer state,
        step counter) up to ``epochs`` / ``maxSteps`` in all. Default: a new local folder per
        fit.
    saveCheckpointsSecs : float, optional
        Also checkpoint inside an epoch this often.
    keepCheckpoints : int, default 3
    shuffle : bool, default True
        A new order each epoch, from ``seed`` and the epoch.
    seed : int
    startTimeout : float, default 120
        Seconds for every rank to start after the data reached the tasks.
    restarts : int, default 0
        As ``HorovodRunner(restarts=...)``: after a lost rank or executor the fit starts again
        (up to this many times) and resumes from ``modelDir``'s last checkpoint (with
        ``saveCheckpointsSecs``, from inside the epoch). Not with ``pool``.
    mlflow : bool or str, optional
        As ``HorovodRunner(mlflow=...)``; the fitted model is logged with its MLflow flavour.
    pool : HorovodPool, optional
        Fit on the warm ranks of this pool (:class:`hvd_magics.HorovodPool`, on Spark) instead
        of new ones: no start-up, and the DataFrame's shards the pool already holds (same plan)
        are not dealt again. ``np`` defaults to the pool's. Not a param: not saved.

    Examples
    --------
    >>> est = HorovodEstimator(model=build, loss="sparse_categorical_crossentropy",
    ...                        metrics=["accuracy"], epochs=4, np=2, modelDir="/dbfs/m")
    >>> fitted = est.fit(train_df)                               # doctest: +SKIP
    >>> fitted.transform(test_df).select("prediction").show()    # doctest: +SKIP
    """

    def __init__(self, pool: Any = None, **params: Any) -> None:
        super().__init__()
        self.pool = pool
        self.setParams(**params)

    def setPool(self, pool: Any) -> HorovodEstimator:
        """Fit on this warm pool's ranks (``None``: on new ranks)."""
        self.pool = pool
        return self

    def setParams(self, **params: Any) -> HorovodEstimator:
        """Set any params by name."""
        for name in params:
            if not self.hasParam(name):
                close = difflib.get_close_matches(name, [p.name for p in self.params], 1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"HorovodEstimator has no param {name!r}.{hint}")
        return self._set(**params)

    # -- fit ---------------------------------------------------------------------------------------

    def _fit(self, dataset: Any) -> HorovodModel:
        from hvd_magics.job.restarts import ResumeFix
        from hvd_magics.job.runner import HorovodRunner
        from hvd_magics.launch.payload import serialize_job
        from hvd_magics.rank.fits.estimator_fit import fit_on_rank

        get = self.getOrDefault
        columns, names = self.feature_columns()
        label, validation = self.getLabelCol(), get(self.isValidationCol)
        check_params(get(self.batchSize), get(self.epochs), get(self.maxSteps),
                     get(self.validationFraction), validation, get(self.np))
        role = {c: ("featureMapping column" if names else "featuresCol") for c in columns}
        role[label] = "labelCol"
        column_kinds(dataset, columns + [label], role)
        if validation:
            check_boolean(dataset, validation)
        model_dir = get(self.modelDir) or _fresh_model_dir()
        check_model_dir(model_dir)
        spec = self._spec(columns, names, model_dir)
        frames = self._split(dataset, columns + [label])
        runner = HorovodRunner(np=self._ranks(dataset), start_timeout=get(self.startTimeout),
                               mlflow=get(self.mlflow), pool=self.pool,
                               restarts=get(self.restarts),
                               checkpoint_dir=model_dir if get(self.restarts) else None)
        runner.resume_fix = ResumeFix(
            f"Fit again with modelDir={model_dir!r} to resume from it (a fit resumes from its "
            "modelDir's last checkpoint)", "set restarts=N (setRestarts) to resume by itself")
        payload = serialize_job(fit_on_rank, {"spec": spec, **frames}, names=frames)
        for source in payload.sources:  # counted as the rows reach the tasks: no query of ours
            source.no_nulls = role
        try:
            record = runner.run_payload(payload, preimport=rank_imports(get(self.model)))
        except DataRefused as exc:  # nulls, or fewer rows than ranks: before any rank trained
            raise EstimatorInputError(exc.summary) from None
        result = record.value  # a hvd_magics.rank.fits.fit_common.FitResult
        model = self._copy_to_model(HorovodModel(result.framework, result.model,
                                                 {**asdict(result), "model_dir": model_dir},
                                                 record))
        if getattr(record, "mlflow_run_id", None):
            from hvd_magics.estimator.mlflow_model import example_inputs, log_fitted_model

            log_fitted_model(model, example_inputs(frames["train"], columns, names))
        return model

    def _copy_to_model(self, to: HorovodModel) -> HorovodModel:
        """Only the params both have (the model's columns), as MLlib's estimators do."""
        for param in self.params:
            if to.hasParam(param.name) and self.isSet(param):
                to._set(**{param.name: self.getOrDefault(param)})
        return to

    def _spec(self, columns: list[str], names: list[str] | None, model_dir: str) -> FitSpec:
        from hvd_magics.launch.payload import why_not_shippable

        get = self.getOrDefault
        model, loss = get(self.model), get(self.loss)
        if model is None:
            raise EstimatorInputError("set the estimator's model: a tf_keras Model, a torch "
                                      "module, or a function that builds one")
        if loss is None:
            raise EstimatorInputError("set the estimator's loss (for example "
                                      "'sparse_categorical_crossentropy' or 'cross_entropy')")
        problem = why_not_shippable(model)
        if problem is not None:
            raise EstimatorInputError(f"the model cannot be pickled for the ranks: {problem}. "
                                      f"{_MODEL_FIX}")
        return FitSpec(
            model=model, optimizer=optimizer_recipe(get(self.optimizer)),
            learning_rate=get(self.learningRate), scale_learning_rate=get(self.scaleLearningRate),
            loss=loss, metrics=list(get(self.metrics) or []), features=columns, input_names=names,
            label=self.getLabelCol(), batch_size=get(self.batchSize), epochs=get(self.epochs),
            max_steps=get(self.maxSteps), shuffle=get(self.shuffle), seed=get(self.seed) % 2**32,
            model_dir=model_dir, checkpoint_secs=get(self.saveCheckpointsSecs),
            keep_checkpoints=get(self.keepCheckpoints), classifier=get(self.classifier))

    def _split(self, dataset: Any, columns: list[str]) -> dict[str, Any]:
        from pyspark.sql import functions as F

        get = self.getOrDefault
        validation, fraction = get(self.isValidationCol), get(self.validationFraction)
        if validation:
            flag = F.col(validation)
            return {"train": dataset.where(~flag).select(columns),
                    "val": dataset.where(flag).select(columns)}
        selected = dataset.select(columns)
        if fraction > 0:
            train, val = selected.randomSplit([1.0 - fraction, fraction], seed=get(self.seed))
            return {"train": train, "val": val}
        return {"train": selected}

    def _ranks(self, dataset: Any) -> int:
        from hvd_magics.launch.spark_slots import all_task_slots

        np = self.getOrDefault(self.np)
        if np is None and self.pool is not None:
            np = self.pool.np
        if np is None:
            np = all_task_slots(dataset.sparkSession)
            if np is None:
                raise EstimatorInputError("the number of task slots of this Spark Connect "
                                          "server is unknown. Fix: set np (np=2)")
        return np

    # -- persistence -------------------------------------------------------------------------------

    def write(self) -> BlobWriter:
        """An MLWriter: the JSON params in MLlib's metadata, the model, optimizer, loss and
        metrics pickled beside them."""
        import cloudpickle

        def content() -> tuple[dict[str, bytes], dict[str, Any]]:
            blobs = {}
            for name in OBJECT_PARAMS:
                if self.isSet(name):
                    value = self.getOrDefault(name)
                    try:
                        blobs[name] = cloudpickle.dumps(_shippable(name, value))
                    except Exception as exc:  # noqa: BLE001 - named, with the fix
                        raise EstimatorInputError(
                            f"the estimator's {name} cannot be saved: it cannot be pickled "
                            f"({type(exc).__name__}: {exc}). {_MODEL_FIX}") from None
            return blobs, {}

        return BlobWriter(self, OBJECT_PARAMS, content)

    @classmethod
    def read(cls) -> BlobReader:
        """An MLReader: ``HorovodEstimator.load(path)``."""
        import pickle

        def build(metadata: dict[str, Any], blobs: dict[str, bytes]) -> HorovodEstimator:
            return cls(**{name: pickle.loads(blob) for name, blob in blobs.items()})

        return BlobReader(build, OBJECT_PARAMS)


def optimizer_recipe(value: Any) -> OptimizerRecipe:
    """How each rank builds the ``optimizer`` param's optimizer.

    Raises
    ------
    EstimatorInputError
        For a value that is no optimizer, name, class or function.
    """
    if isinstance(value, OptimizerRecipe):
        return value
    if isinstance(value, str):
        return OptimizerRecipe("name", value)
    if isinstance(value, type):
        return OptimizerRecipe("class", value)
    root = type(value).__module__.split(".")[0]
    if root in ("tf_keras", "keras") and hasattr(value, "get_config"):
        module = importlib.import_module(root)
        return OptimizerRecipe("keras_config", module.optimizers.serialize(value))
    if root == "torch" and hasattr(value, "param_groups"):
        return OptimizerRecipe("class", type(value), dict(value.defaults))
    if callable(value):
        return OptimizerRecipe("factory", value)
    raise EstimatorInputError(f"optimizer must be a name ('adam'), an optimizer, its class or a "
                              f"function that builds one; got {type(value).__name__}")


def _fresh_model_dir() -> str:
    """A new folder under the temporary directory: the model directory of a fit without one."""
    import tempfile

    root = os.path.join(tempfile.gettempdir(), "hvd_magics", "models")
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix="fit-", dir=root)


def _shippable(name: str, value: Any) -> Any:
    return optimizer_recipe(value) if name == "optimizer" else value


add_accessors(HorovodEstimator, EstimatorParams())
