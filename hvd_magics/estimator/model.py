"""HorovodModel: the Transformer a :class:`HorovodEstimator` fit returns; ``transform`` runs the
model in Spark tasks (:mod:`hvd_magics.task.predict`), so inference is distributed too."""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import Any, Iterator

import pyarrow as pa
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from hvd_magics.estimator.input_checks import column_kinds
from hvd_magics.estimator.params import ModelParams, add_accessors
from hvd_magics.estimator.persistence import BlobReader, BlobWriter
from hvd_magics.launch.spark_backend import is_connect, local_workers_use_this_python
from hvd_magics.task.predict import (KERAS, PREDICTION, PROBABILITY, RAW, PredictConfig,
                                     predict_batches)

_OUT = "__hvd_magics_out"


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
    """

    def __init__(self, framework: str = KERAS, model_bytes: bytes = b"",
                 facts: dict[str, Any] | None = None, run_record: Any = None) -> None:
        super().__init__()
        facts = dict(facts or {})
        self.framework = framework
        self.model_bytes = model_bytes
        self.output: str | None = facts.get("output")
        self.output_size: int = int(facts.get("output_size") or 1)
        self.history: list[dict[str, Any]] = list(facts.get("history") or [])
        self.model_dir: str | None = facts.get("model_dir")
        self.position: dict[str, int] = dict(facts.get("position") or {})
        self.resumed_from: dict[str, int] | None = facts.get("resumed_from")
        self.optimizer_step: int = int(facts.get("optimizer_step") or 0)
        self.steps_per_epoch: int = int(facts.get("steps_per_epoch") or 0)
        self.run_record = run_record

    @property
    def is_classifier(self) -> bool:
        return self.output is not None

    def _facts(self) -> dict[str, Any]:
        return {"framework": self.framework, "output": self.output,
                "output_size": self.output_size, "history": self.history,
                "model_dir": self.model_dir, "position": self.position,
                "resumed_from": self.resumed_from, "optimizer_step": self.optimizer_step,
                "steps_per_epoch": self.steps_per_epoch}

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

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import array_to_vector, vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.functions import arrow_udf

        columns, names = self.feature_columns()
        kinds = column_kinds(dataset, columns, {c: "featuresCol" for c in columns})
        inputs = [vector_to_array(F.col(c), "float32") if kinds[c] == "vector"
                  else F.col(c).cast("array<float>") if kinds[c] == "array"
                  else F.col(c).cast("float") for c in columns]
        fields = self._fields()
        config = PredictConfig(hashlib.sha256(self.model_bytes).hexdigest()[:16], self.framework,
                               self.model_bytes, columns, names, self.output, fields,
                               self.getOrDefault(self.inferenceBatchSize))
        udf = arrow_udf(_udf_function(config, len(columns)), self._return_type(fields))
        spark = dataset.sparkSession
        with local_workers_use_this_python(None if is_connect(spark) else spark.sparkContext):
            out = dataset.withColumn(_OUT, udf(*inputs))
        columns_out = {self.getPredictionCol(): F.col(f"{_OUT}.{PREDICTION}")}
        if PROBABILITY in fields:
            columns_out[self.getProbabilityCol()] = array_to_vector(F.col(f"{_OUT}.{PROBABILITY}"))
        if RAW in fields:
            columns_out[self.getRawPredictionCol()] = array_to_vector(F.col(f"{_OUT}.{RAW}"))
        return out.withColumns(columns_out).drop(_OUT)

    # -- the model outside Spark -------------------------------------------------------------------

    def get_model(self) -> Any:
        """The trained network in this process: a tf_keras Model or a torch module."""
        if self.framework == KERAS:
            os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
            import tf_keras

            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model.keras")
                with open(path, "wb") as handle:
                    handle.write(self.model_bytes)
                return tf_keras.models.load_model(path)
        import torch

        return torch.load(io.BytesIO(self.model_bytes), weights_only=False, map_location="cpu")

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
