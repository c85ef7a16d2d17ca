"""Networks the estimator tests train (pickled by value, like tests.jobs)."""
from __future__ import annotations


def torch_mlp(inputs: int = 64, classes: int = 10, dropout: float = 0.0):
    """A function that builds a small PyTorch classifier (logits out), with dropout (random
    draws at every training step) when ``dropout`` is above 0."""
    def build():
        import torch

        torch.manual_seed(0)
        hidden = [torch.nn.Linear(inputs, 64), torch.nn.ReLU()]
        hidden += [torch.nn.Dropout(dropout)] if dropout else []
        return torch.nn.Sequential(*hidden, torch.nn.Linear(64, classes))

    return build


def torch_mlp_lost_once(kill_at_call: int, **kwargs):
    """As :func:`torch_mlp`, but on the job's first attempt rank 1 SIGKILLs itself at its
    ``kill_at_call``-th forward pass (as a lost executor takes it); later attempts train it
    untouched."""
    build_mlp = torch_mlp(**kwargs)

    def build():
        import os
        import signal

        from hvd_magics import checkpoint

        model = build_mlp()
        if checkpoint.attempt() == 0 and os.environ.get("HVD_MAGICS_RANK") == "1":
            calls = []

            def lose_the_rank(_module, _inputs):
                calls.append(1)
                if len(calls) == kill_at_call:
                    os.kill(os.getpid(), signal.SIGKILL)

            model.register_forward_pre_hook(lose_the_rank)
        return model

    return build


def torch_mlp_on_spot(folder: str, mark_at_call: int, step_s: float = 0.05, **kwargs):
    """As :func:`torch_mlp`, but each training forward pass takes ``step_s`` longer and is
    written down (the attempt, a line in ``folder/forwards-<rank>``), and on the job's first
    attempt rank 1 writes its pid to ``folder/rank1`` at its ``mark_at_call``-th (the test
    decommissions its worker then)."""
    build_mlp = torch_mlp(**kwargs)

    def build():
        import os
        import time

        from hvd_magics import checkpoint

        model = build_mlp()
        rank, attempt, calls = os.environ.get("HVD_MAGICS_RANK"), checkpoint.attempt(), []

        def on_forward(module, _inputs):
            if not module.training:
                return
            calls.append(1)
            with open(os.path.join(folder, f"forwards-{rank}"), "a") as out:
                out.write(f"{attempt}\n")
            if attempt == 0 and rank == "1" and len(calls) == mark_at_call:
                with open(os.path.join(folder, "rank1.partial"), "w") as out:
                    out.write(str(os.getpid()))
                os.replace(os.path.join(folder, "rank1.partial"), os.path.join(folder, "rank1"))
            time.sleep(step_s)

        model.register_forward_pre_hook(on_forward)
        return model

    return build


def keras_mlp(inputs: int = 64, classes: int = 10, dropout: float = 0.0):
    """A function that builds a small tf_keras classifier (softmax out), with dropout when
    ``dropout`` is above 0."""
    def build():
        import tf_keras as keras

        keras.utils.set_random_seed(0)
        hidden = [keras.layers.Dense(64, activation="relu")]
        hidden += [keras.layers.Dropout(dropout)] if dropout else []
        return keras.Sequential([keras.layers.Input((inputs,)), *hidden,
                                 keras.layers.Dense(classes, activation="softmax")])

    return build


def event_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file in ``folder``, read by TensorFlow."""
    import glob
    import os

    from hvd_magics.task.predict import quiet_tensorflow

    with quiet_tensorflow():  # not left in this process: its next jobs' ranks would get it
        import tensorflow as tf

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(str(folder), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def keras_decaying_adam():
    """Adam whose learning rate decays with the optimizer's step (a schedule)."""
    import tf_keras as keras

    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10,
                                                           decay_rate=0.9)
    return keras.optimizers.Adam(learning_rate=schedule)


def model_weights(fitted) -> list:
    """The weights of a fitted HorovodModel's model, as numpy arrays."""
    import numpy as np

    model = fitted.get_model()
    if hasattr(model, "get_weights"):
        return [np.asarray(w) for w in model.get_weights()]
    return [t.detach().numpy().copy() for t in model.state_dict().values()]
