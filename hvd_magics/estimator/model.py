"""HorovodModel: the Transformer a :class:`HorovodEstimator` fit returns; ``transform`` runs the
model in Spark tasks (:mod:`hvd_magics.task.predict`), so inference is distributed too."""
from __future__ import annotations

import hashlib
from typing import Any
from collections.abc import Iterator

import pyarrow as pa
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from hvd_magics.estimator.input_checks import column_kinds
from hvd_magics.estimator.params import ModelParams, add_accessors
from hvd_magics.estimator.persistence import BlobReader, BlobWriter
from hvd_magics.launch.package_shipping import ship_package
from hvd_magics.launch.spark_session import is_connect, local_workers_use_this_python
from hvd_magics.protocol import KERAS
from hvd_magics.task.predict import (PREDICTION, PROBABILITY, RAW, PredictConfig,
                                     model_from_bytes, predict_batches)

_OUT = "__hvd_magics_out"
#: What a fit tells of the model (attributes, saved with it), and their values when not told.
_FACTS: dict[str, Any] = {"output": None, "output_size": 1, "history": [], "model_dir": None,
                          "position": {}, "resumed_from": None, "optimizer_step": 0,
                          "steps_per_epoch": 0}


class HorovodModel(Model, ModelParams, MLReadable, MLWritable):
    """A fitted network as an MLlib Model: ``transform(df)`` adds ``predictionCol`` (and, for a
    classifier, ``probabilityCol`` and ``rawPredictionCol`` as vectors, as MLlib's classifiers
    do) to every row.

    The model is loaded once per Spark Python worker and applied to whole Arrow batches.

    Attributes
    ----------
    framework : {"keras", "torch"}
    history : list of dict
        Per epoch of every fit that led here: ``epoch``, ``global_step``, the training metrics
        and the validation metrics (``val_*``), averaged over the ranks.
    run_record : RunRecord or None
        The fit's job record (epoch timing, hosts, log); ``None`` after ``load``.
    model_dir : str or None
        Where the fit wrote checkpoints, event files and the saved model.
    optimizer_step : int
        The optimizer's step counter at the end of the fit (it carries on across resumes).
    position, resumed_from : dict
        Where training stood at the end, and where this fit started (``None``: from scratch):
        ``epoch``, ``step`` (in that epoch), ``global_step``.
    steps_per_epoch, output, output_size
        Steps per epoch of the fit; how a classifier's output becomes probabilities (``None``:
        not a classifier); the width of the output.
    """

    def __init__(self, framework: str = KERAS, model_bytes: bytes = b"",
                 facts: dict[str, Any] | None = None, run_record: Any = None) -> None:
        super().__init__()
        self.framework = framework
        self.model_bytes = model_bytes
        for name, default in _FACTS.items():
            setattr(self, name, (facts or {}).get(name, default))
        self.run_record = run_record

    @property
    def is_classifier(self) -> bool:
        return self.output is not None

    def _facts(self) -> dict[str, Any]:
        return {"framework": self.framework, **{name: getattr(self, name) for name in _FACTS}}

    def __repr__(self) -> str:
        kind = "classifier" if self.is_classifier else "regressor"
        epochs = self.position.get("epoch", len(self.history))
        return (f"HorovodModel({self.framework} {kind}, {epochs} epochs, "
                f"{self.optimizer_step} optimizer steps, model_dir={self.model_dir!r})")

    # -- transform ---------------------------------------------------------------------------------

    def _fields(self) -> list[str]:
        fields = [PREDICTION]
        if self.is_classifier:
            fields += [PROBABILITY] if self.getProbabilityCol() else []
            fields += [RAW] if self.getRawPredictionCol() else []
        return fields

    def _return_type(self, fields: list[str]) -> str:
        kinds = {PREDICTION: "double", PROBABILITY: "array<double>", RAW: "array<double>"}
        if not self.is_classifier and self.output_size > 1:
            kinds[PREDICTION] = "array<float>"
        return ", ".join(f"{name} {kinds[name]}" for name in fields)

    def predict_config(self) -> PredictConfig:
        """How the model reads its input columns and writes its outputs."""
        columns, names = self.feature_columns()
        return PredictConfig(hashlib.sha256(self.model_bytes).hexdigest()[:16], self.framework,
                             self.model_bytes, columns, names, self.output, self._fields(),
                             self.getOrDefault(self.inferenceBatchSize))

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import array_to_vector, vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.functions import arrow_udf

        config = self.predict_config()
        columns, fields = config.columns, config.fields
        kinds = column_kinds(dataset, columns, {c: "featuresCol" for c in columns})
        inputs = [vector_to_array(F.col(c), "float32") if kinds[c] == "vector"
                  else F.col(c).cast("array<float>") if kinds[c] == "array"
                  else F.col(c).cast("float") for c in columns]
        udf = arrow_udf(_udf_function(config, len(columns)), self._return_type(fields))
        spark = dataset.sparkSession
        ship_package(spark)  # the UDF calls hvd_magics.task.predict on the executors
        from hvd_magics.job.session import SESSION

        # with the notebook's environment shipped, the UDF runs in it, as the ranks do
        shipped = SESSION.environment.udf_python(spark) if SESSION.environment else None
        with local_workers_use_this_python(None if is_connect(spark) else spark.sparkContext,
                                           shipped):
            out = dataset.withColumn(_OUT, udf(*inputs))
        columns_out = {self.getPredictionCol(): F.col(f"{_OUT}.{PREDICTION}")}
        if PROBABILITY in fields:
            columns_out[self.getProbabilityCol()] = array_to_vector(F.col(f"{_OUT}.{PROBABILITY}"))
        if RAW in fields:
            columns_out[self.getRawPredictionCol()] = array_to_vector(F.col(f"{_OUT}.{RAW}"))
        return out.withColumns(columns_out).drop(_OUT)

    # -- the model outside Spark -------------------------------------------------------------------

    def get_model(self) -> Any:
        """The trained network in this process: a tf_keras Model (compiled) or a torch module."""
        return model_from_bytes(self.framework, self.model_bytes, compile=True)

    # -- persistence -------------------------------------------------------------------------------

    def write(self) -> BlobWriter:
        """An MLWriter: ``model.write().overwrite().save(path)`` (or ``model.save(path)``)."""
        return BlobWriter(self, (), lambda: ({"model": self.model_bytes},
                                             {"hvd_magics": self._facts()}))

    @classmethod
    def read(cls) -> BlobReader:
        """An MLReader: ``HorovodModel.load(path)``."""
        def build(metadata: dict[str, Any], blobs: dict[str, bytes]) -> HorovodModel:
            facts = metadata.get("hvd_magics", {})
            return cls(facts.get("framework", KERAS), blobs["model"], facts)

        return BlobReader(build, ())


add_accessors(HorovodModel, ModelParams())


def _udf_function(config: PredictConfig, inputs: int) -> Any:
    """The Arrow UDF's Python function (typed: ``arrow_udf`` reads its kind from the hints, which
    it resolves in this module's globals)."""

    if inputs == 1:
        def one(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
            return predict_batches(batches, config)

        return one

    def several(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        return predict_batches(batches, config)

    return several
