"""Write the example notebooks from the cell sources below (outputs stay out of git).

Run after editing a notebook's cells here: python scripts/make_notebooks.py
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "example_notebooks"


def md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.strip("\n")}


def code(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": text.strip("\n")}


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


if __name__ == "__main__":
    write("mnist-tensorflow-keras.ipynb", MNIST)
    print("wrote", HERE)
