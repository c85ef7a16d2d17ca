"""What MLflow tracking costs a job: wall time with and without it, side by side in one run.

The job is the main example's training (a Keras MLP with Horovod's DistributedOptimizer on
scikit-learn's digits, 8 epochs, 2 ranks as Spark tasks on one warm local[2] session). Tracking
goes to a real `mlflow server` on loopback (SQLite backend, local artifacts) that this script
starts. The wall time is HorovodRunner.run's, so it includes waiting for MLflow at the end.

Usage: .venv/bin/python benchmarks/mlflow_overhead.py [--runs 4]
Last line: mlflow_overhead tracked=<s> untracked=<s> ratio=<x> ratio_min=<x> ratio_max=<x>
(ratio: tracked / untracked, the median of per-pair ratios in alternating order; goal <= 1.05)
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from pairs import in_turn, ratio_text, local_session  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def train_digits(epochs: int = 8):
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    from sklearn.datasets import load_digits

    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")[hvd.rank()::hvd.size()]
    y = digits.target[hvd.rank()::hvd.size()]
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.002 * hvd.size())),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    return history.history["accuracy"][-1]


def start_server(folder: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--artifacts-destination", f"{folder}/artifacts", "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # without the server's job runner and its seven huey consumers (GenAI jobs): their start
        # took 14 CPU seconds from the runs being measured
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return server, uri
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()

    import mlflow
    from hvd_magics import HorovodRunner, last_run

    spark = local_session("mlflow_overhead")
    server, uri = start_server(tempfile.mkdtemp(prefix="mlflow-bench-"))
    mlflow.set_tracking_uri(uri)
    try:
        candidates = {"tracked": lambda: HorovodRunner(np=2, mlflow="bench").run(train_digits),
                      "untracked": lambda: HorovodRunner(np=2, mlflow=False).run(train_digits)}
        for run in candidates.values():  # warm up
            run()
        walls: dict[str, list[float]] = {name: [] for name in candidates}
        for run in range(args.runs):
            for name in in_turn(run, list(candidates)):
                began = time.perf_counter()
                accuracy = candidates[name]()
                walls[name].append(time.perf_counter() - began)
                tracked = last_run().mlflow if name == "tracked" else ""
                print(f"run {run} {name:9s} {walls[name][-1]:6.2f} s, accuracy {accuracy:.3f} "
                      f"{tracked}", flush=True)
                if name == "tracked":
                    assert last_run().mlflow_run_id, "the tracked run was not recorded"
        print("mlflow_overhead " + " ".join(f"{n}={statistics.median(v):.2f}"
                                            for n, v in walls.items())
              + " " + ratio_text("ratio", walls["tracked"], walls["untracked"]))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        spark.stop()


if __name__ == "__main__":
    main()
