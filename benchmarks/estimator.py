"""HorovodEstimator: transform throughput against the peers' ways to score, and the fit overhead.

Transform (one warm local[2] SparkSession, ``--rows`` rows of 784 float features in memory,
every candidate writing every row to Spark's ``noop`` sink, alternating order, ``--runs`` times):
  ours              HorovodModel.transform, prediction column only (as the limit writes)
  ours_full         HorovodModel.transform with MLlib's classifier columns (prediction,
                    probability and rawPrediction vectors)
  row_at_a_time     a pandas UDF that calls the model once per row, as horovod.spark's
                    KerasModel/TorchModel transform does (model loaded once per worker too);
                    timed on ``--row-rows`` rows, its rate in rows/s
  predict_batch_udf pyspark.ml.functions.predict_batch_udf, written by hand (the careful limit)
The model is the same PyTorch MLP (784-256-10) for all. The same again for the same MLP in
tf_keras (Keras 2, what HorovodEstimator fits): ``keras_ours``, ``keras_row_at_a_time`` (one
``predict_on_batch`` call per row, as horovod.spark's KerasModel transform does) and
``keras_predict_batch_udf``.

Fit: the same PyTorch training (2 ranks, the same shards, model, optimizer, batch size and
epochs) through HorovodEstimator.fit and through HorovodRunner with a hand-written loop over
``Shard.to_torch``; the ratio of their wall times (the estimator adds its input checks, the
validation-free epoch metrics, a checkpoint and event file per epoch and the saved model).

Usage: .venv/bin/python benchmarks/estimator.py [--rows 100000] [--runs 3] [--no-fit | --no-transform]
Last lines: estimator_fit ... ; estimator_transform_keras ours=<rows/s> ...;
estimator_transform ours=<rows/s> row_at_a_time=<rows/s> predict_batch_udf=<rows/s> ...
"""
from __future__ import annotations

import argparse
import inspect
import io
import os
import statistics
import sys
import tempfile
import time

import pandas as pd

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pairs import in_turn, ratio_text, local_session  # noqa: E402  (benchmarks/pairs.py)

FEATURES = 784


def build_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def make_frame(spark, rows: int):
    """``rows`` rows: ``features`` array<float> (784), ``label`` int, cached in memory."""
    from pyspark.sql import functions as F

    frame = (spark.range(rows).repartition(2)
             .withColumn("features", F.transform(F.sequence(F.lit(1), F.lit(FEATURES)),
                                                  lambda i: F.rand(7).cast("float")))
             .withColumn("label", (F.col("id") % 10).cast("int")).drop("id").cache())
    frame.count()
    return frame


def model_bytes(module) -> bytes:
    import cloudpickle
    import torch

    buffer = io.BytesIO()
    torch.save(module, buffer, pickle_module=cloudpickle)
    return buffer.getvalue()


def build_keras_model():
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential([tf_keras.Input((FEATURES,)),
                                tf_keras.layers.Dense(256, activation="relu"),
                                tf_keras.layers.Dense(10, activation="softmax")])


def keras_bytes(model) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as handle:
            return handle.read()


def keras_row_at_a_time_udf(blob: bytes):
    """Score one row per ``predict_on_batch`` call, as horovod.spark's KerasModel does."""
    from pyspark.sql.functions import pandas_udf

    cache: dict = {}

    @pandas_udf("double")
    def predict(features: pd.Series) -> pd.Series:
        import numpy as np

        from hvd_magics.task.predict import model_from_bytes

        if "model" not in cache:
            cache["model"] = model_from_bytes("keras", blob)
        model = cache["model"]
        return pd.Series([float(np.argmax(model.predict_on_batch(
            np.asarray(row, dtype=np.float32)[None, :]))) for row in features])

    return predict


def keras_batch_udf(blob: bytes):
    """The careful user's predict_batch_udf for the tf_keras model (the limit)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import DoubleType

    def make_predict_fn():
        import numpy as np
        import tensorflow as tf

        from hvd_magics.task.predict import model_from_bytes

        model = model_from_bytes("keras", blob)
        call = tf.function(lambda x: model(x, training=False))

        def predict(inputs):
            return np.argmax(call(inputs).numpy(), axis=1).astype(np.float64)

        return predict

    return predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=4096,
                             input_tensor_shapes=[[FEATURES]])


def row_at_a_time_udf(blob: bytes):
    """Score one row per model call, as horovod.spark's KerasModel/TorchModel transform does."""
    from pyspark.sql.functions import pandas_udf

    cache: dict = {}

    @pandas_udf("double")
    def predict(features: pd.Series) -> pd.Series:
        import numpy as np
        import torch

        if "model" not in cache:
            torch.set_num_threads(1)
            cache["model"] = torch.load(io.BytesIO(blob), weights_only=False).eval()
        model = cache["model"]
        out = []
        with torch.no_grad():
            for row in features:
                x = torch.from_numpy(np.asarray(row, dtype=np.float32)).unsqueeze(0)
                out.append(float(model(x).argmax(1)))
        return pd.Series(out)

    return predict


def batch_udf(blob: bytes):
    """The careful user's predict_batch_udf (the limit)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import DoubleType

    def make_predict_fn():
        import torch

        torch.set_num_threads(1)
        model = torch.load(io.BytesIO(blob), weights_only=False).eval()

        def predict(inputs):
            with torch.inference_mode():
                return model(torch.from_numpy(inputs)).argmax(1).double().numpy()

        return predict

    return predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=4096,
                             input_tensor_shapes=[[FEATURES]])


def timed(frame) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def plain_fit(train, epochs: int = 2, batch_size: int = 64):
    """The estimator's training, hand-written over the shard (what a %%horovod cell would do)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), 0.001 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loader = train.to_torch("features", "label", batch_size=batch_size, shuffle=True, seed=0)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return hvd.rank()


def bench_fit(spark, frame, runs: int) -> str:
    from hvd_magics import HorovodRunner
    from hvd_magics.estimator import HorovodEstimator
    from hvd_magics.job.runner import default_views

    views = lambda: default_views(show_output=False)  # noqa: E731 - same views for both
    times: dict[str, list[float]] = {"estimator": [], "plain": []}

    def estimator() -> None:
        HorovodEstimator(model=build_model, loss="cross_entropy", learningRate=0.001,
                         batchSize=64, epochs=2, np=2, featuresCol="features",
                         modelDir=tempfile.mkdtemp()).fit(frame)

    def plain() -> None:
        from hvd_magics.launch.payload import serialize_job

        runner = HorovodRunner(np=2)
        # its leading imports are imported early, as a %%horovod cell's are
        runner.run_payload(serialize_job(plain_fit, {"train": frame}), views=views(),
                           source=inspect.getsource(plain_fit))

    for run in range(runs + 1):
        for name, call in in_turn(run, [("estimator", estimator), ("plain", plain)]):
            started = time.perf_counter()
            call()
            if run:  # the first round warms up both
                times[name].append(time.perf_counter() - started)
    return (f"estimator_fit estimator_s={statistics.median(times['estimator']):.2f} "
            f"plain_s={statistics.median(times['plain']):.2f} "
            + ratio_text("overhead_ratio", times["estimator"], times["plain"]))


def bench_transform(spark, frame, row_frame, runs: int, keras_row_frame=None) -> str:
    from hvd_magics.estimator import HorovodModel

    blob = model_bytes(build_model())
    facts = {"output": "softmax", "output_size": 10}
    lean = HorovodModel("torch", blob, facts).setFeaturesCol("features") \
        .setProbabilityCol("").setRawPredictionCol("")
    full = HorovodModel("torch", blob, facts).setFeaturesCol("features")
    limit = batch_udf(blob)
    per_row = row_at_a_time_udf(blob)
    rows, row_rows = frame.count(), row_frame.count()
    keras_candidates = {}
    if keras_row_frame is not None:
        kblob = keras_bytes(build_keras_model())
        keras_lean = HorovodModel("keras", kblob, {"output": "probability", "output_size": 10}) \
            .setFeaturesCol("features").setProbabilityCol("").setRawPredictionCol("")
        keras_limit = keras_batch_udf(kblob)
        keras_per_row = keras_row_at_a_time_udf(kblob)
        keras_rows = keras_row_frame.count()
        keras_candidates = {
            "keras_ours": lambda: rows / timed(keras_lean.transform(frame)),
            "keras_predict_batch_udf": lambda: rows / timed(frame.withColumn(
                "prediction", keras_limit("features"))),
            "keras_row_at_a_time": lambda: keras_rows / timed(keras_row_frame.withColumn(
                "prediction", keras_per_row("features"))),
        }
    candidates = {**keras_candidates,
        "ours": lambda: rows / timed(lean.transform(frame)),
        "ours_full": lambda: rows / timed(full.transform(frame)),
        "predict_batch_udf": lambda: rows / timed(frame.withColumn("prediction",
                                                                    limit("features"))),
        "row_at_a_time": lambda: row_rows / timed(row_frame.withColumn("prediction",
                                                                        per_row("features"))),
    }
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for run in range(runs + 1):
        for name in in_turn(run, list(candidates)):
            rate = candidates[name]()
            if run:  # the first round loads every model into the Python workers
                rates[name].append(rate)
    med = {name: statistics.median(values) for name, values in rates.items()}
    vs_row = [a / b for a, b in zip(rates["ours"], rates["row_at_a_time"])]
    if keras_candidates:
        keras_vs_row = [a / b for a, b in zip(rates["keras_ours"], rates["keras_row_at_a_time"])]
        print(f"estimator_transform_keras ours={med['keras_ours']:.0f} "
              f"row_at_a_time={med['keras_row_at_a_time']:.0f} "
              f"predict_batch_udf={med['keras_predict_batch_udf']:.0f} "
              f"ratio_vs_row_at_a_time={statistics.median(keras_vs_row):.1f} "
              + ratio_text("ratio_vs_limit", rates["keras_ours"],
                           rates["keras_predict_batch_udf"]), flush=True)
    return (f"estimator_transform ours={med['ours']:.0f} row_at_a_time={med['row_at_a_time']:.0f} "
            f"predict_batch_udf={med['predict_batch_udf']:.0f} ours_full={med['ours_full']:.0f} "
            f"ratio_vs_row_at_a_time={statistics.median(vs_row):.1f} "
            + ratio_text("ratio_vs_limit", rates["ours"], rates["predict_batch_udf"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--row-rows", type=int, default=10_000)
    parser.add_argument("--fit-rows", type=int, default=20_000)
    parser.add_argument("--keras-row-rows", type=int, default=2_000,
                        help="rows for the tf_keras row-at-a-time peer (about 1 ms a row)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-fit", action="store_true", help="only the transform")
    parser.add_argument("--no-transform", action="store_true", help="only the fit")
    args = parser.parse_args()
    spark = local_session("estimator", driver_memory="6g")
    frame = make_frame(spark, args.rows)
    row_frame = frame.limit(args.row_rows).cache()
    keras_row_frame = frame.limit(args.keras_row_rows).cache()
    fit_frame = frame.limit(args.fit_rows).cache()
    row_frame.count(), fit_frame.count(), keras_row_frame.count()
    if not args.no_fit:
        print(bench_fit(spark, fit_frame, args.runs), flush=True)
    if not args.no_transform:
        print(bench_transform(spark, frame, row_frame, args.runs, keras_row_frame), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
