"""What the ranks of an estimator's fit import while the data arrives (driver side, no Spark)."""
from hvd_magics.estimator.estimator import FIT_IMPORTS, rank_imports
from hvd_magics.protocol import KERAS, TORCH


def _torch_builder():
    import torch

    return torch.nn.Linear(2, 2)


def _keras_builder():
    import tf_keras as keras

    return keras.Sequential([keras.layers.Dense(1)])


def test_a_fit_preimports_its_framework_known_from_the_model_or_its_builder():
    import torch

    assert rank_imports(torch.nn.Linear(2, 2)) == FIT_IMPORTS[TORCH]
    assert "torch._dynamo" in FIT_IMPORTS[TORCH]  # rank 0 exports model.pt2 at the end
    assert rank_imports(_torch_builder) == FIT_IMPORTS[TORCH]
    assert rank_imports(_keras_builder) == FIT_IMPORTS[KERAS]
    assert rank_imports(lambda: object()) == ()
    assert rank_imports("not a model") == ()
