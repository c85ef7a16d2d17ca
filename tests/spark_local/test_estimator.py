"""HorovodEstimator on a local Spark: fit on shards, transform in Spark tasks, checkpoints and
resume, event files, the saved model, MLlib persistence, and what it refuses."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from hvd_magics import last_run
from hvd_magics.errors import EstimatorInputError
from hvd_magics.estimator import HorovodEstimator, HorovodModel
from tests.estimator_models import event_scalars, keras_mlp, torch_mlp
from tests.frames import digits_frames


def _accuracy(frame) -> float:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(frame)


def _predictions(frame) -> np.ndarray:
    rows = frame.orderBy("id").select("prediction", "probability").collect()
    return np.array([[r["prediction"], *r["probability"].toArray()] for r in rows])


def test_a_torch_estimator_trains_on_shards_and_transform_predicts(local_spark, tmp_path):
    from pyspark.ml.linalg import VectorUDT

    train, val = digits_frames(local_spark)
    estimator = HorovodEstimator(model=torch_mlp(), loss="cross_entropy", metrics=["accuracy"],
                                 learningRate=0.003, batchSize=32, epochs=3, np=2,
                                 featuresCol="pixels", validationFraction=0.2,
                                 modelDir=str(tmp_path / "m"))
    model = estimator.fit(train)
    assert isinstance(model, HorovodModel) and model.framework == "torch"
    assert [h["epoch"] for h in model.history] == [1, 2, 3]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(model.history[-1])
    assert model.history[-1]["val_accuracy"] >= 0.9, model.history
    assert len(model.run_record.epochs) == 3  # the epoch timing of the job
    scored = model.transform(val)
    assert isinstance(scored.schema["probability"].dataType, VectorUDT)
    assert set(scored.columns) >= {"pixels", "label", "prediction", "probability",
                                   "rawPrediction"}
    assert scored.count() == val.count()
    assert _accuracy(scored) >= 0.9
    # the exported program loads outside Spark (no model code needed) and predicts as
    # transform does
    import torch

    exported = torch.export.load(str(tmp_path / "m" / "model.pt2")).module()
    rows = scored.limit(20).collect()
    logits = exported(torch.tensor([r["pixels"] for r in rows])).detach().numpy()
    assert logits.argmax(1).tolist() == [int(r["prediction"]) for r in rows]
    assert {"model.pt", "state_dict.pt"} <= set(os.listdir(tmp_path / "m"))


def test_a_keras_fit_stopped_after_two_of_four_epochs_resumes(local_spark, tmp_path):
    import tf_keras

    train, val = digits_frames(local_spark)
    folder = tmp_path / "keras"
    estimator = HorovodEstimator(model=keras_mlp(), loss="sparse_categorical_crossentropy",
                                 metrics=["accuracy"], learningRate=0.003, batchSize=32,
                                 epochs=4, np=2, featuresCol="pixels",
                                 isValidationCol="is_val", modelDir=str(folder))
    from pyspark.sql import functions as F

    both = train.withColumn("is_val", F.lit(False)).unionByName(
        val.withColumn("is_val", F.lit(True)))
    # the first fit stops after its second of four epochs; the second goes on to the fourth
    stopped = estimator.copy().setEpochs(2).fit(both)
    steps = stopped.steps_per_epoch
    assert [h["epoch"] for h in stopped.history] == [1, 2]
    assert stopped.optimizer_step == 2 * steps
    resumed = estimator.fit(both)
    assert resumed.resumed_from == {"epoch": 2, "step": 0, "global_step": 2 * steps}
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    assert resumed.optimizer_step == 4 * steps  # Adam's step counter carried on
    assert [h["global_step"] for h in resumed.history] == [steps, 2 * steps, 3 * steps,
                                                           4 * steps]
    assert resumed.history[-1]["val_accuracy"] >= 0.9
    assert len(resumed.run_record.epochs) == 2  # this job ran epochs 3 and 4 only
    # event files: one point per epoch, both fits, training and validation
    train_events = event_scalars(folder / "events" / "train")
    val_events = event_scalars(folder / "events" / "validation")
    assert [step for step, _ in train_events["epoch_loss"]] == [1, 2, 3, 4]
    assert [step for step, _ in val_events["epoch_accuracy"]] == [1, 2, 3, 4]
    assert val_events["epoch_accuracy"][-1][1] == pytest.approx(
        resumed.history[-1]["val_accuracy"], rel=1e-5)
    # the saved model loads outside Spark and predicts as transform does
    saved = tf_keras.models.load_model(folder / "model.keras")
    rows = resumed.transform(val).limit(20).collect()
    outputs = saved.predict(np.array([r["pixels"] for r in rows]), verbose=0)
    assert outputs.argmax(1).tolist() == [int(r["prediction"]) for r in rows]
    assert np.allclose(outputs, [r["probability"].toArray() for r in rows], atol=1e-5)
    # a third fit has nothing left to do: it returns the model as the checkpoint left it
    again = estimator.fit(both)
    assert again.optimizer_step == 4 * steps and len(again.history) == 4


def test_estimator_model_and_pipeline_save_and_load(local_spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer
    from pyspark.sql import functions as F

    train, val = digits_frames(local_spark)
    val = val.withColumn("id", F.monotonically_increasing_id())
    estimator = HorovodEstimator(model=torch_mlp(), loss="cross_entropy", epochs=2, np=2,
                                 learningRate=0.003, featuresCol="features",
                                 optimizer="adam", metrics=["accuracy"])
    estimator.save(str(tmp_path / "estimator"))
    loaded = HorovodEstimator.load(str(tmp_path / "estimator"))
    assert loaded.uid == estimator.uid
    assert (loaded.getEpochs(), loaded.getLoss(), loaded.getFeaturesCol()) == (2, "cross_entropy",
                                                                              "features")
    assert callable(loaded.getModel()) and loaded.getModelDir() is None
    # a Pipeline with a JVM stage before ours: fit, save, load, same predictions
    stages = [SQLTransformer(statement="SELECT *, pixels AS features FROM __THIS__"), loaded]
    fitted = Pipeline(stages=stages).fit(train)
    expected = _predictions(fitted.transform(val))
    assert _accuracy(fitted.transform(val)) >= 0.85
    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(again.stages[-1], HorovodModel)
    assert np.allclose(_predictions(again.transform(val)), expected, atol=1e-6)
    model = fitted.stages[-1]
    model.write().overwrite().save(str(tmp_path / "model"))
    alone = HorovodModel.load(str(tmp_path / "model"))
    assert alone.framework == "torch" and alone.history == model.history
    scored = alone.transform(val.withColumn("features", F.col("pixels")))
    assert np.allclose(_predictions(scored), expected, atol=1e-6)


def _unpicklable_model():
    import threading

    lock = threading.Lock()

    def build():
        return lock  # never called: the model is refused first

    return build


@pytest.mark.parametrize("change, message", [
    ({"featuresCol": "nope"}, "featuresCol 'nope' is not a column"),
    ({"featuresCol": "name"}, "featuresCol 'name' has type string, which cannot become a tensor"),
    ({"model": _unpicklable_model()}, "the model cannot be pickled"),
    ({"model": None}, "set the estimator's model"),
    ({"validationFraction": 1.5}, "validationFraction must be in [0, 1)"),
    ({"isValidationCol": "label"}, "isValidationCol 'label' has type int; it must be boolean"),
])
def test_bad_input_is_refused_before_any_rank_starts(local_spark, change, message):
    from pyspark.sql import functions as F

    train, _ = digits_frames(local_spark)
    frame = (train.withColumn("name", F.lit("x"))
             .withColumn("maybe", F.when(F.col("label") == 3, None).otherwise(F.col("label")))
             .limit(200))
    params = {"model": torch_mlp(), "loss": "cross_entropy", "np": 2, "featuresCol": "pixels",
              **change}
    with pytest.raises(EstimatorInputError) as error:
        HorovodEstimator(**params).fit(frame)
    assert re.search(message if "\\d" in message else re.escape(message), str(error.value))
    assert last_run() is None  # no job was started


def test_nulls_in_a_column_it_trains_on_are_refused_before_any_rank_trains(local_spark,
                                                                          tmp_path):
    """The barrier tasks count the nulls as the rows arrive (the estimator runs no query of
    its own over the data), over the training and the validation rows together."""
    from pyspark.sql import functions as F

    train, _ = digits_frames(local_spark)
    frame = train.withColumn("maybe", F.when(F.col("label") == 3, None)
                             .otherwise(F.col("label")))
    nulls = frame.where(F.col("maybe").isNull()).count()
    assert nulls > 0
    model_dir = tmp_path / "m"
    with pytest.raises(EstimatorInputError, match=rf"^labelCol 'maybe' has {nulls} null values\. "
                       r"Fix: drop those rows \(df\.na\.drop\(subset=\['maybe'\]\)\)"):
        HorovodEstimator(model=torch_mlp(), loss="cross_entropy", np=2, featuresCol="pixels",
                         labelCol="maybe", validationFraction=0.2,
                         modelDir=str(model_dir)).fit(frame)
    record = last_run()
    assert record.status == "failed" and not record.pids  # no rank got the job
    assert list(model_dir.iterdir()) == []


def test_a_misspelt_param_is_named():
    with pytest.raises(TypeError, match="no param 'epoch'. Did you mean 'epochs'"):
        HorovodEstimator(epoch=3)


@pytest.mark.parametrize("elastic", ["1:2", (1, 2)])
def test_an_elastic_np_is_refused_with_where_it_belongs(elastic):
    with pytest.raises(TypeError, match=r"fixed number of ranks.*HorovodRunner\(np=\(MIN, MAX\)\)"):
        HorovodEstimator(np=elastic)
    assert HorovodEstimator(np=3).getOrDefault("np") == 3


def test_a_model_dir_that_is_a_file_or_unwritable_is_refused_before_start(local_spark,
                                                                          tmp_path):
    """An existing file as modelDir started the job and failed both ranks with a bare
    FileExistsError from makedirs."""
    train, _ = digits_frames(local_spark)
    afile = tmp_path / "model.txt"
    afile.write_text("not a folder")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    params = {"model": torch_mlp(), "loss": "cross_entropy", "np": 2, "featuresCol": "pixels"}
    with pytest.raises(EstimatorInputError, match=r"modelDir '.*model.txt' is an existing file, "
                                                  r"not a folder. Fix: set modelDir to a folder"):
        HorovodEstimator(modelDir=str(afile), **params).fit(train.limit(100))
    assert last_run() is None
    if os.geteuid() == 0:  # root writes anywhere; a file in the way of the path still fails
        unwritable = str(afile / "sub")
    else:
        unwritable = str(locked / "sub")
    with pytest.raises(EstimatorInputError, match=r"modelDir '.*sub' cannot be written "
                                                  r"\(\w+Error: .*\)\. Fix: set modelDir to a "
                                                  r"folder this user can write"):
        HorovodEstimator(modelDir=unwritable, **params).fit(train.limit(100))
    assert last_run() is None


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_a_fit_stopped_mid_epoch_and_resumed_is_the_same_fit(local_spark, tmp_path, framework):
    """Resume reached the same step count, but the weights differed by up to 0.61 from an
    uninterrupted fit: Horovod's torch DistributedOptimizer kept the optimizer state apart
    from the one saved and restored, and dropout drew other numbers after a resume."""
    from tests.estimator_models import keras_decaying_adam, model_weights

    train, _ = digits_frames(local_spark)
    if framework == "torch":
        params = {"model": torch_mlp(dropout=0.3), "loss": "cross_entropy", "optimizer": "adam",
                  "learningRate": 0.01}
    else:
        params = {"model": keras_mlp(dropout=0.3), "loss": "sparse_categorical_crossentropy",
                  "optimizer": keras_decaying_adam()}
    estimator = HorovodEstimator(**params, batchSize=32, epochs=3, np=2, featuresCol="pixels",
                                 shuffle=True, seed=5)
    whole = estimator.copy().setModelDir(str(tmp_path / "whole")).fit(train)
    steps = whole.steps_per_epoch
    stop_at = steps + steps // 2  # inside the second epoch
    stopped = estimator.copy().setModelDir(str(tmp_path / "resumed")).setMaxSteps(
        stop_at).fit(train)
    assert stopped.position == {"epoch": 1, "step": steps // 2, "global_step": stop_at}
    resumed = estimator.copy().setModelDir(str(tmp_path / "resumed")).fit(train)
    assert resumed.resumed_from["global_step"] == stop_at
    assert resumed.optimizer_step == whole.optimizer_step == 3 * steps
    for a, b in zip(model_weights(whole), model_weights(resumed), strict=True):
        assert np.array_equal(a, b), float(np.abs(a - b).max())
    if framework == "torch":  # a rank lost in the second epoch: restarted, the same fit
        from tests.estimator_models import torch_mlp_lost_once

        lost = estimator.copy().setModelDir(str(tmp_path / "lost")).setRestarts(1).setModel(
            torch_mlp_lost_once(steps + steps // 2, dropout=0.3)).fit(train)
        assert len(lost.run_record.attempts) == 2 and "rank 1" in lost.run_record.attempts[0]
        assert lost.resumed_from["global_step"] == steps  # the first epoch's checkpoint
        for a, b in zip(model_weights(whole), model_weights(lost), strict=True):
            assert np.array_equal(a, b), float(np.abs(a - b).max())


def test_an_estimator_fits_on_a_warm_pool_and_a_second_fit_reuses_its_shards(local_spark,
                                                                           tmp_path, capfd):
    from pyspark.sql import functions as F

    from hvd_magics import HorovodPool

    train, val = digits_frames(local_spark)
    with HorovodPool(np=1) as pool:  # local[2]: one slot held, one to deal and to transform
        params = dict(model=torch_mlp(), loss="cross_entropy", metrics=["accuracy"],
                      learningRate=0.003, batchSize=32, featuresCol="pixels", pool=pool)
        first = HorovodEstimator(epochs=2, modelDir=str(tmp_path / "a"), **params).fit(train)
        assert first.run_record.where.endswith("(warm pool)") and first.run_record.np == 1
        assert "dealt 'train' to the pool's 1 rank" in capfd.readouterr().err
        second = HorovodEstimator(epochs=3, modelDir=str(tmp_path / "b"), **params).fit(train)
        assert [h["epoch"] for h in second.history] == [1, 2, 3]
        assert "the shards of 'train' dealt earlier were reused" in \
            capfd.readouterr().err
        assert _accuracy(second.transform(val)) >= 0.85
        with pytest.raises(ValueError, match="np=2 is not the warm pool's np=1"):
            HorovodEstimator(np=2, epochs=1, **params).fit(train)
        with_nulls = train.withColumn("pixels", F.when(F.col("label") == 3, None)
                                      .otherwise(F.col("pixels")))
        nulls = with_nulls.where(F.col("pixels").isNull()).count()
        for _ in ("dealt", "kept"):  # the second fit finds the shards the pool kept
            with pytest.raises(EstimatorInputError,
                               match=f"featuresCol 'pixels' has {nulls} null values"):
                HorovodEstimator(epochs=1, **params).fit(with_nulls)
        assert _accuracy(second.transform(val)) >= 0.85  # the pool still serves
