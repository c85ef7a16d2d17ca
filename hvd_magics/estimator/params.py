"""The MLlib params of :class:`HorovodEstimator` and :class:`HorovodModel` (sparkdl's names where
it had one: ``featureMapping``, ``modelDir``, ``batchSize``, ``maxSteps``,
``saveCheckpointsSecs``, ``isValidationCol``)."""
from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasLabelCol, HasPredictionCol,
                                     HasProbabilityCol, HasRawPredictionCol, HasSeed)

from hvd_magics.option_table import estimator_defaults

#: The default seed: the same in every process (MLlib's default, a hash of the class name, changes
#: from one Python process to the next, which would change the order of a resumed fit's rows).
DEFAULT_SEED = 20181210
#: Params whose values are Python objects: saved pickled, not in the JSON metadata.
OBJECT_PARAMS = ("model", "optimizer", "loss", "metrics")


def _optional(convert: Any) -> Any:
    return lambda value: None if value is None else convert(value)


def _fixed_np(value: Any) -> int | None:
    """``np``: a whole number of ranks; an elastic range is refused with where it belongs."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) or (isinstance(value, str) and ":" in value):
        raise TypeError(f"HorovodEstimator runs a fixed number of ranks, so np={value!r} (an "
                        "elastic range) is not for it; give a whole number such as np=2. Elastic "
                        "jobs are %%horovod np=MIN:MAX and HorovodRunner(np=(MIN, MAX)).")
    return TypeConverters.toInt(value)


def _mapping(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = {str(column): str(column) for column in value}
    if not isinstance(value, dict) or not value:
        raise TypeError("featureMapping must be a non-empty dict {column: model input name} "
                        f"or a list of columns; got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


class HasOutputCols(HasFeaturesCol, HasPredictionCol, HasProbabilityCol, HasRawPredictionCol):
    """The input and output columns shared by the estimator and its model."""

    featureMapping: Param[dict[str, str]] = Param(
        Params._dummy(), "featureMapping",
        "several feature columns: {column: the model's input name} (Keras input names, or "
        "keyword arguments of a torch module's forward); overrides featuresCol",
        typeConverter=_mapping)

    def getFeatureMapping(self) -> dict[str, str] | None:
        return self.getOrDefault(self.featureMapping)

    def feature_columns(self) -> tuple[list[str], list[str] | None]:
        """The feature columns in input order, and the model's input names (``None``: one
        positional input)."""
        mapping = self.getFeatureMapping()
        if mapping:
            return list(mapping), list(mapping.values())
        return [self.getFeaturesCol()], None


class EstimatorParams(HasOutputCols, HasLabelCol, HasSeed):
    """Every param of :class:`HorovodEstimator`."""

    model: Param[Any] = Param(Params._dummy(), "model",
                              "a tf_keras Model or a torch.nn.Module, or a function that builds "
                              "one on each rank (preferred: no framework on the driver)")
    optimizer: Param[Any] = Param(Params._dummy(), "optimizer",
                                  "a name ('adam', 'sgd', ...), an optimizer (Keras instance or "
                                  "class; torch class, instance, or function of the parameters)")
    learningRate: Param[float] = Param(Params._dummy(), "learningRate",
                                       "learning rate on one rank (default: the optimizer's, "
                                       "or 0.001 for a name)",
                                       typeConverter=_optional(TypeConverters.toFloat))
    scaleLearningRate: Param[bool] = Param(Params._dummy(), "scaleLearningRate",
                                           "multiply the learning rate by the number of ranks",
                                           typeConverter=TypeConverters.toBoolean)
    loss: Param[Any] = Param(Params._dummy(), "loss",
                             "the loss: a name ('sparse_categorical_crossentropy', "
                             "'cross_entropy', 'mse', ...), a loss object or a function")
    metrics: Param[list[Any]] = Param(Params._dummy(), "metrics",
                                      "metrics per epoch (Keras: anything compile takes; torch: "
                                      "'accuracy', 'mae', 'mse')")
    classifier: Param[bool] = Param(Params._dummy(), "classifier",
                                    "write the class index and probabilities (default: when "
                                    "the loss is a classification loss)",
                                    typeConverter=_optional(TypeConverters.toBoolean))
    batchSize: Param[int] = Param(Params._dummy(), "batchSize", "rows per batch on each rank",
                                  typeConverter=TypeConverters.toInt)
    epochs: Param[int] = Param(Params._dummy(), "epochs",
                               "epochs in all (a resumed fit stops there too)",
                               typeConverter=TypeConverters.toInt)
    maxSteps: Param[int] = Param(Params._dummy(), "maxSteps",
                                 "optimizer steps in all, if fewer than the epochs make",
                                 typeConverter=_optional(TypeConverters.toInt))
    validationFraction: Param[float] = Param(Params._dummy(), "validationFraction",
                                             "fraction of rows held out for validation",
                                             typeConverter=TypeConverters.toFloat)
    isValidationCol: Param[str] = Param(Params._dummy(), "isValidationCol",
                                        "a boolean column: true for validation rows",
                                        typeConverter=_optional(TypeConverters.toString))
    np: Param[int] = Param(Params._dummy(), "np",
                           "ranks: tasks of one Spark barrier stage (default: every task slot)",
                           typeConverter=_fixed_np)
    modelDir: Param[str] = Param(Params._dummy(), "modelDir",
                                 "checkpoints, event files and the saved model; a fit with the "
                                 "same modelDir resumes (default: a new folder per fit)",
                                 typeConverter=_optional(TypeConverters.toString))
    saveCheckpointsSecs: Param[float] = Param(Params._dummy(), "saveCheckpointsSecs",
                                              "also checkpoint inside an epoch this often "
                                              "(checkpoints are always written at epoch ends)",
                                              typeConverter=_optional(TypeConverters.toFloat))
    keepCheckpoints: Param[int] = Param(Params._dummy(), "keepCheckpoints",
                                        "how many checkpoints to keep",
                                        typeConverter=TypeConverters.toInt)
    shuffle: Param[bool] = Param(Params._dummy(), "shuffle", "shuffle each epoch's rows",
                                 typeConverter=TypeConverters.toBoolean)
    startTimeout: Param[float] = Param(Params._dummy(), "startTimeout",
                                       "seconds for every rank to start",
                                       typeConverter=TypeConverters.toFloat)
    restarts: Param[int] = Param(Params._dummy(), "restarts",
                                 "after a lost rank or executor, start the fit again this many "
                                 "times at most; it resumes from modelDir's last checkpoint",
                                 typeConverter=TypeConverters.toInt)
    mlflow: Param[Any] = Param(Params._dummy(), "mlflow",
                               "record the fit in MLflow: True, an experiment name, False "
                               "(default: as HorovodRunner decides)")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(optimizer="adam", learningRate=None, scaleLearningRate=True,
                         metrics=[], classifier=None, batchSize=32, epochs=1, maxSteps=None,
                         validationFraction=0.0, isValidationCol=None, modelDir=None,
                         saveCheckpointsSecs=None, keepCheckpoints=3, shuffle=True,
                         featureMapping=None, model=None, loss=None, seed=DEFAULT_SEED,
                         # np, startTimeout, restarts, mlflow: declared with the job's options
                         **estimator_defaults())


class ModelParams(HasOutputCols):
    """Every param of :class:`HorovodModel`."""

    inferenceBatchSize: Param[int] = Param(Params._dummy(), "inferenceBatchSize",
                                           "rows per model call in transform",
                                           typeConverter=TypeConverters.toInt)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inferenceBatchSize=4096, featureMapping=None)


def add_accessors(cls: type, params: Params) -> None:
    """Give ``cls`` MLlib's ``setEpochs(4)`` / ``getEpochs()`` methods for every param of
    ``params`` it does not have yet."""
    for param in params.params:
        suffix = param.name[0].upper() + param.name[1:]
        for prefix, make in (("set", lambda n: lambda self, value: self._set(**{n: value})),
                             ("get", lambda n: lambda self: self.getOrDefault(n))):
            if not hasattr(cls, prefix + suffix):
                setattr(cls, prefix + suffix, make(param.name))
