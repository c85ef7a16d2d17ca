"""The arrays transform hands the model, and the columns it makes of the outputs."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from hvd_magics.rank.fits.fit_common import classifier_output
from hvd_magics.task.predict import PredictConfig, column_matrix, output_struct, probabilities


def test_list_and_number_columns_become_2d_float_arrays():
    lists = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32())).slice(1)
    assert column_matrix(lists, "x").tolist() == [[3.0, 4.0], [5.0, 6.0]]
    assert column_matrix(pa.array([1, 2]), "n").tolist() == [[1.0], [2.0]]
    with pytest.raises(ValueError, match="column 'x' has 1 null"):
        column_matrix(pa.array([[1.0], None]), "x")
    with pytest.raises(ValueError, match="rows of column 'x' have different lengths"):
        column_matrix(pa.array([[1.0], [1.0, 2.0]]), "x")


def test_classifier_outputs_become_probabilities_and_a_class_index():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    probs = probabilities(logits, "softmax")
    assert np.allclose(probs.sum(1), 1.0) and probs.argmax(1).tolist() == [0, 1]
    assert np.allclose(probabilities(np.array([[0.2], [0.9]]), "probability"),
                       [[0.8, 0.2], [0.1, 0.9]])
    config = PredictConfig("k", "torch", b"", ["x"], None, "softmax",
                           ["prediction", "probability", "raw"])
    struct = output_struct(logits, config)
    assert struct.field("prediction").to_pylist() == [0.0, 1.0]
    assert struct.field("raw").to_pylist() == logits.tolist()
    regression = output_struct(np.array([[1.5], [2.5]]), PredictConfig("k", "torch", b"", ["x"],
                                                                        None, None))
    assert regression.field("prediction").to_pylist() == [1.5, 2.5]


@pytest.mark.parametrize("loss, classifier, expected", [
    ("sparse_categorical_crossentropy", None, "probability"),
    ("cross_entropy", None, "softmax"),
    ("bce_with_logits", None, "sigmoid"),
    ("nll", None, "exp"),
    ("mse", None, None),
    ("mse", True, "probability"),
    ("cross_entropy", False, None),
])
def test_the_loss_says_whether_and_how_a_model_classifies(loss, classifier, expected):
    assert classifier_output(loss, classifier) == expected


def test_a_keras_loss_from_logits_means_softmax():
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert classifier_output(loss, None) == "softmax"
    assert classifier_output(tf_keras.losses.BinaryCrossentropy(from_logits=True), None) == \
        "sigmoid"


def test_tensorflows_quiet_level_is_not_left_in_a_reused_python_worker(monkeypatch):
    """A Python worker that loaded a Keras model for a prediction kept TF_CPP_MIN_LOG_LEVEL=3 in
    its environment, and the next training job it ran gave its ranks that (their TensorFlow's
    C++ lines silenced, and a zygote of their own)."""
    from hvd_magics.task.predict import quiet_tensorflow

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    with quiet_tensorflow():
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"  # while TensorFlow is imported
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # the user's own level stays theirs
    with quiet_tensorflow():
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_a_spark_worker_freezes_what_it_loaded_once_out_of_its_collectors_sight():
    """Spark collects garbage after every task of a reused worker: a loaded model's objects
    (and the modules) were walked again each time. They are frozen once, when first loaded."""
    import subprocess
    import sys

    code = ("import gc\nfrom hvd_magics.task.worker_heap import freeze_once\n"
            "freeze_once('model'); frozen = gc.get_freeze_count()\n"
            "later = [[] for _ in range(1000)]\n"
            "freeze_once('model')\n"
            "print(frozen > 0, gc.get_freeze_count() == frozen)")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert said.stdout.split() == ["True", "True"], said.stderr[-2000:]
