"""Apply the small changes Horovod 0.28.1 needs to build against TF 2.21 and PyTorch 2.13.

Run inside an unpacked ``horovod-0.28.1`` source tree. Each change is an exact text replacement;
if the text is not found (another Horovod version), the script stops and says which file.

1. ``horovod/torch/CMakeLists.txt`` forces C++14, but PyTorch 2.x headers need C++17.
2. With the torch target at C++17, linking it against Horovod's C++14 ``libgloo.a`` fails
   (``multiple definition of gloo::rendezvous::Store::kDefaultTimeout``: a ``static constexpr``
   member is inline in C++17). Horovod already builds a C++17 Gloo (``compatible17_gloo``) for a
   C++17 TensorFlow, so the torch target links that one when the ABIs match.
3. ``horovod/tensorflow/CMakeLists.txt`` compiles ``xla_mpi_ops.cc``, which includes XLA headers
   (highwayhash, farmhash) that the TensorFlow wheel does not ship. Those ops only serve
   XLA-compiled Horovod ops (``HOROVOD_ENABLE_XLA_OPS``), off by default, so the file is dropped.
4. ``horovod/tensorflow/keras/__init__.py`` and ``callbacks.py`` take their backend ``K`` from
   ``import keras``, which is Keras 3 since TF 2.16, while ``tf.keras`` (what the module wraps,
   ``from tensorflow import keras``) is Keras 2 under ``TF_USE_LEGACY_KERAS=1``. Keras 3's backend has
   no ``constant``/``get_session``/``set_value``, so ``MetricAverageCallback``,
   ``LearningRateWarmupCallback`` and ``hvd.load_model`` failed (``module 'keras.backend' has no
   attribute 'constant'``). The backend is now taken from the same ``tf.keras`` the module wraps.
5. ``horovod/_keras/callbacks.py``: ``LearningRateWarmupCallback`` (and the schedule callback)
   correct the momentum with ``backend.set_value(optimizer.momentum, ...)``. In the Keras 2.11+
   optimizers (tf_keras's default ``SGD``) ``momentum`` is a plain float, not a variable, so the
   callback failed with ``'float' object has no attribute 'dtype'``. The correction is now made
   only where ``momentum`` is a variable (the legacy optimizers); a float momentum is left alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

CHANGES = [
    (
        "horovod/torch/CMakeLists.txt",
        "set(CMAKE_CXX_STANDARD 14)",
        "set(CMAKE_CXX_STANDARD 17)  # hvd_magics: PyTorch 2.x needs C++17",
    ),
    (
        "horovod/torch/CMakeLists.txt",
        "    if (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
        "    if (Pytorch_CXX11 AND Tensorflow_CXX11 AND Tensorflow_CXX17)\n"
        "        # hvd_magics: the C++17 torch target must link the C++17 Gloo\n"
        "        list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)\n"
        "    elseif (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
    ),
    (
        "horovod/tensorflow/CMakeLists.txt",
        'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")',
        "# hvd_magics: xla_mpi_ops.cc dropped (XLA headers missing from the TF wheel)",
    ),
    (
        "horovod/_keras/callbacks.py",
        "        if hasattr(self.model.optimizer, 'momentum') and self.momentum_correction:",
        "        # hvd_magics: Keras 2.11+ optimizers hold momentum as a float, not a variable\n"
        "        if (hasattr(self.model.optimizer, 'momentum') and self.momentum_correction\n"
        "                and hasattr(self.model.optimizer.momentum, 'dtype')):",
    ),
    (
        "horovod/tensorflow/keras/__init__.py",
        "    from keras import backend as K",
        "    K = keras.backend  # hvd_magics: the backend of tf.keras (Keras 2 under TF_USE_LEGACY_KERAS=1)",
    ),
    (
        "horovod/tensorflow/keras/callbacks.py",
        "    from keras import backend as K",
        "    K = keras.backend  # hvd_magics: the backend of tf.keras (Keras 2 under TF_USE_LEGACY_KERAS=1)",
    ),
]


def main(tree: Path) -> None:
    for rel, old, new in CHANGES:
        path = tree / rel
        text = path.read_text()
        if new in text:
            continue  # already applied
        if text.count(old) != 1:
            sys.exit(f"patch_horovod: expected text not found once in {path}: {old!r}")
        path.write_text(text.replace(old, new))
        print(f"patch_horovod: patched {rel}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
