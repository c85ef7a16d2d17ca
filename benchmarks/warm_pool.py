"""A warm pool against a cold job: a trivial function and a trivial %%horovod cell, side by side;
then a Keras epoch and a DataFrame cell, each as the pool's next cell against the same cell cold.

On one local SparkSession (``local[4]``, so a pool of 2 and a cold job of 2 both find their
slots, and a DataFrame can be dealt beside the pool), interleaved, ``--runs`` times each
(medians and per-pair ratios):
  pool.run            HorovodPool(np=2).run(trivial)        cold.run     HorovodRunner(np=2).run
  pool cell           %%horovod (the pool's)  trivial cell  cold cell    %%horovod np=2 --cold
The same on the driver (np=-2). The trivial function initialises Horovod (once, on a pool) and
allreduces one number; the cell does the same through the magic with its text view.

Then on Spark, ``--keras-runs`` times each, interleaved:
  keras cell   one epoch of the MNIST MLP (784-128-10, tf_keras through horovod.tensorflow.keras,
               batch 128) on MNIST-shaped data the cell generates (60,000 rows over 2 ranks:
               nothing can be downloaded here; an epoch's time depends on the shapes, not the
               pixels), model built in the cell; the pool's cell against the same cell cold.
  data cell    a cell that reads a DataFrame of ``--rows`` rows x 64 floats: on the pool its
               first run deals it (printed on its own) and later runs reuse the shards; also on
               the pool after ``forget_shards()`` (dealt again each time); cold, it is dealt
               every time.

Usage: .venv/bin/python benchmarks/warm_pool.py [--runs 7] [--keras-runs 3] [--rows 200000]
Last line: warm_pool run_s=<s> cell_s=<s> ratio=<warm/cold> (Spark), the same for the driver,
keras_cell and data_cell ratios
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from contextlib import redirect_stdout

from pairs import in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

CELL = ("import horovod.torch as hvd\nimport torch\nhvd.init()\n"
        "hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()")


KERAS_CELL = """
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.random((60000 // hvd.size(), 784), dtype=np.float32)
y = rng.integers(0, 10, len(x))
model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001)),
              loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=128, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy()[0])
"""

DATA_CELL = ("import horovod.torch as hvd\nimport torch\nhvd.init()\n"
             "hvd.allreduce(torch.tensor([float(sum(frame.rows_per_rank) == ROWS)]), "
             "op=hvd.Sum).item()")


#: A cell that reads a 40 MB notebook array (sent once to a pool, then by digest while unchanged).
VALUE_CELL = "2.0 if BIG.shape == (5_000_000,) else 0.0"


def trivial():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


def timed(fn) -> float:
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        value = fn()
    assert value == 2.0, value  # a wrong number is never a figure
    return time.perf_counter() - start


def on_pool(ip, np: int, runs: int, candidates: dict, first: dict) -> dict[str, list[float]]:
    """Start a pool of ``np``; time each of ``first`` once (a pool's first cells import and deal
    what later ones reuse), then every candidate ``runs`` times, in turn; stop the pool."""
    times: dict[str, list[float]] = {name: [] for name in [*first, *candidates]}
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("hvd_pool", f"start np={np}")
    try:
        for name, fn in first.items():
            times[name].append(timed(fn))
        for run in range(runs):
            for name in in_turn(run, list(candidates)):
                times[name].append(timed(candidates[name]))
    finally:
        ip.run_line_magic("hvd_pool", "stop")
    return times


def measure(np: int, runs: int, ip) -> dict[str, list[float]]:
    """The trivial function and cell, on a pool of ``np`` against cold, interleaved."""
    import numpy as np_

    from hvd_magics import HorovodRunner
    from hvd_magics.job.session import SESSION

    ip.user_ns["BIG"] = np_.random.default_rng(0).random(5_000_000)

    def changed_value():
        ip.user_ns["BIG"][0] += 1.0  # the notebook changed it: it travels again
        return ip.run_cell_magic("horovod", "", VALUE_CELL)

    return on_pool(ip, np, runs, {
        "warm_value": lambda: ip.run_cell_magic("horovod", "", VALUE_CELL),
        "warm_value_changed": changed_value,
        "warm_run": lambda: SESSION.pool.run(trivial),
        "cold_run": lambda: HorovodRunner(np=np).run(trivial),
        "warm_cell": lambda: ip.run_cell_magic("horovod", "", CELL),
        "cold_cell": lambda: ip.run_cell_magic("horovod", f"np={np} --cold", CELL),
    }, {"first_run": lambda: SESSION.pool.run(trivial)})  # imports torch and Horovod


def measure_cells(runs: int, rows: int, ip) -> dict[str, list[float]]:
    """The Keras epoch cell and the DataFrame cell, on a pool of 2 against cold, interleaved."""
    from pyspark.sql import functions as F

    spark = local_session("warm_pool", master="local[4]")
    ip.user_ns["frame"] = (spark.range(0, rows, 1, 4)
                           .select("id", F.array(*[(F.col("id") % 97 + i).cast("float")
                                                   for i in range(64)]).alias("x")))
    ip.user_ns["ROWS"] = rows
    from hvd_magics.job.session import SESSION

    def redeal():
        SESSION.pool.forget_shards()
        return ip.run_cell_magic("horovod", "", DATA_CELL)

    return on_pool(ip, 2, runs, {
        "warm_keras": lambda: ip.run_cell_magic("horovod", "", KERAS_CELL),
        "cold_keras": lambda: ip.run_cell_magic("horovod", "np=2 --cold", KERAS_CELL),
        "warm_data": lambda: ip.run_cell_magic("horovod", "", DATA_CELL),
        "warm_deal": redeal,
        "cold_data": lambda: ip.run_cell_magic("horovod", "np=2 --cold", DATA_CELL),
    }, {"first_keras": lambda: ip.run_cell_magic("horovod", "", KERAS_CELL),  # TF imported
        "first_data": lambda: ip.run_cell_magic("horovod", "", DATA_CELL)})  # dealt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keras-runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magics")
    local_session("warm_pool", master="local[4]")
    lines = []
    for label, np in (("spark", 2), ("driver", -2)):
        t = measure(np, args.runs, ip)
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"{label}: pool.run {med['warm_run']:.3f} s, cold run {med['cold_run']:.3f} s; "
              f"pool cell {med['warm_cell']:.3f} s, cold cell {med['cold_cell']:.3f} s "
              f"(medians of {args.runs}); a cell reading a 40 MB array: unchanged "
              f"{med['warm_value']:.3f} s, changed {med['warm_value_changed']:.3f} s")
        lines.append(f"{label}_run_s={med['warm_run']:.3f} {label}_cell_s={med['warm_cell']:.3f} "
                     + ratio_text(f"{label}_run_ratio", t["warm_run"], t["cold_run"]) + " "
                     + ratio_text(f"{label}_cell_ratio", t["warm_cell"], t["cold_cell"]) + " "
                     + ratio_text(f"{label}_value_ratio", t["warm_value"],
                                  t["warm_value_changed"]))
    t = measure_cells(args.keras_runs, args.rows, ip)
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"keras epoch cell: pool {med['warm_keras']:.2f} s, cold {med['cold_keras']:.2f} s; "
          f"DataFrame cell ({args.rows:,} rows x 64 floats): pool's first (deals it) "
          f"{med['first_data']:.2f} s, pool's next (reuses the shards) {med['warm_data']:.2f} s, "
          f"pool's after %hvd_pool forget (deals it again) {med['warm_deal']:.2f} s, "
          f"cold {med['cold_data']:.2f} s (medians of {args.keras_runs})")
    lines.append(ratio_text("keras_cell_ratio", t["warm_keras"], t["cold_keras"]) + " "
                 + ratio_text("data_cell_ratio", t["warm_data"], t["cold_data"]) + " "
                 + ratio_text("data_deal_ratio", t["warm_deal"], t["cold_data"]))
    print("warm_pool " + " ".join(lines))


if __name__ == "__main__":
    main()
