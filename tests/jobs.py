"""Functions the tests run as Horovod jobs (pickled by value, see conftest)."""
from __future__ import annotations


def torch_allreduce():
    """Each rank adds rank+1; rank 0 returns what every rank saw."""
    import os

    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    mine = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "sum": total, "pid": os.getpid(), "cwd": os.getcwd()}
    return hvd.allgather_object(mine)


def tf_allreduce():
    """Each rank contributes [rank, 1]; averaged and summed results from every rank."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    value = tf.constant([float(hvd.rank()), 1.0])
    summed = hvd.allreduce(value, op=hvd.Sum).numpy().tolist()
    averaged = hvd.allreduce(value, op=hvd.Average).numpy().tolist()
    return hvd.allgather_object({"rank": hvd.rank(), "sum": summed, "avg": averaged})


def keras_two_steps():
    """Train a tf.keras model two steps with Horovod's optimizer on different data per rank."""
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rng = np.random.default_rng(hvd.rank() + 10)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, size=64)
    tf.random.set_seed(hvd.rank())  # different initial weights: the broadcast must fix them
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1 * hvd.size()))
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = [w.tolist() for w in model.get_weights()]
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object({"rank": hvd.rank(), "weights": weights,
                                 "keras": tf.keras.__name__})


def fail_on_rank(bad_rank: int = 1, how: str = "raise"):
    """Rank ``bad_rank`` fails (``raise``, ``exit`` or ``kill``); the others block in an allreduce."""
    import os
    import signal
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    print(f"rank {hvd.rank()} before the failure", flush=True)
    if hvd.rank() == bad_rank:
        time.sleep(0.5)
        if how == "raise":
            def inner():
                raise ValueError(f"boom from rank {hvd.rank()}")
            inner()
        elif how == "exit":
            os._exit(3)
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.tensor([1.0]))
    time.sleep(600)  # a healthy rank would wait here; the job must not
    return "never"


def sleep_forever():
    """Start, say so, and sleep (for interrupt tests)."""
    import os
    import time

    print(f"sleeping pid={os.getpid()}", flush=True)
    time.sleep(600)


def print_lines(count: int = 5):
    """Print numbered lines; return the rank."""
    import os

    rank = int(os.environ["HOROVOD_RANK"])
    for i in range(count):
        print(f"line {i} of rank {rank}")
    return rank


def keras_epochs(epochs: int = 3):
    """A small tf.keras fit with verbose=2 (prints 'Epoch y/z' lines); no progress code added."""
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return hvd.rank()


def torch_tracked_loop(epochs: int = 2, steps: int = 20):
    """A custom loop that reports through hvd_magics.rank.api.progress.track."""
    import time

    from hvd_magics.rank.api import progress

    for epoch in range(1, epochs + 1):
        for step, _batch in enumerate(progress.track(range(steps), epoch=epoch, epochs=epochs,
                                                     batch_size=8)):
            time.sleep(0.01)
            progress.report(step + 1, loss=1.0 / (step + 1))
    return "ok"


def print_epoch_lines(epochs: int = 3):
    """Only prints Keras-style epoch lines (no structured progress)."""
    import time

    for epoch in range(1, epochs + 1):
        print(f"Epoch {epoch}/{epochs}", flush=True)
        time.sleep(0.3)
    return "printed"


def torch_allreduce_steps(steps: int = 20, fail: bool = False, name: str = "grad"):
    """Several allreduces named ``name_0``.. (so the timeline has activity); optionally die
    afterwards."""
    import os
    import signal

    import horovod.torch as hvd
    import torch

    hvd.init()
    for step in range(steps):
        hvd.allreduce(torch.ones(1000) * step, name=f"{name}_{step % 3}")
    if fail and hvd.rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return hvd.rank()


def timeline_paths():
    """Every rank's HOROVOD_TIMELINE, as rank 0 sees them."""
    import os

    import horovod.torch as hvd

    hvd.init()
    return hvd.allgather_object(os.environ.get("HOROVOD_TIMELINE"))


def keras3_gradient_tape():
    """Keras 3 (TF_USE_LEGACY_KERAS=0) trained 2 steps with hvd.DistributedGradientTape."""
    import numpy as np
    import tensorflow as tf
    import keras
    import horovod.tensorflow as hvd

    hvd.init()
    tf.random.set_seed(hvd.rank())  # different initial weights: the broadcast must fix them
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(0.1 * hvd.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(32, 8)).astype("float32"), rng.integers(0, 3, 32)
    # Keras 3 variables are not tf.Variables: broadcast values, not hvd.broadcast_variables().
    for var in model.variables:
        var.assign(hvd.broadcast(tf.convert_to_tensor(var), root_rank=0, name=var.path))
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        # ...and take gradients against the tf.Variables they wrap (DistributedGradientTape
        # needs .ref()).
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    weights = [v.numpy().tolist() for v in model.trainable_variables]
    return {"keras": keras.__version__, "weights": hvd.allgather_object(weights)}


def keras_horovod_callbacks():
    """Horovod's own Keras callbacks, as Horovod's synthetic Keras benchmark uses them."""
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, size=64)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(),
                                                          warmup_epochs=1, steps_per_epoch=2)]
    history = model.fit(x, y, batch_size=32, epochs=2, steps_per_epoch=2, verbose=0,
                        callbacks=callbacks)
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object({"loss": history.history["loss"],
                                    "lr": float(tf.keras.backend.get_value(opt.lr))})


def rank_return_value(size_mb: float):
    """Rank 0 returns about ``size_mb`` MB of bytes; every rank syncs with Horovod first."""
    import horovod.torch as hvd

    hvd.init()
    return bytes(int(size_mb * 1e6)) if hvd.rank() == 0 else None


def start_children():
    """Each rank starts a long-lived child (one that shares its stdout); returns their pids."""
    import subprocess

    import horovod.torch as hvd

    hvd.init()
    child = subprocess.Popen(["sleep", "600"])  # inherits the rank's stdout
    return hvd.allgather_object(child.pid)


def temporary_files():
    """Each rank runs a ``tf.function`` (TensorFlow's autograph writes a source file to the
    temporary folder, deleted only by an exit hook); rank 0 also keeps a file of its own there.
    Returns, per rank, the temporary folder, the autograph files seen and the kept file."""
    import glob
    import os
    import tempfile

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()

    @tf.function
    def absolute(x):
        if x > 0:
            return x
        return -x

    absolute(tf.constant(-1.0))
    folder = tempfile.gettempdir()
    generated = glob.glob(os.path.join(folder, "__autograph_generated_file*"))
    kept = None
    if hvd.rank() == 0:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
            fh.write("the user's own file")
        kept = fh.name
    return hvd.allgather_object((folder, generated, kept))


def start_children_and_wait(pid_file: str):
    """Each rank starts a child, writes its pid to ``pid_file``.<rank>, then waits forever."""
    import os
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "600"])
    rank = os.environ["HOROVOD_RANK"]
    with open(f"{pid_file}.{rank}.tmp", "w") as fh:
        fh.write(str(child.pid))
    os.rename(f"{pid_file}.{rank}.tmp", f"{pid_file}.{rank}")
    print(f"child {child.pid} started", flush=True)
    time.sleep(600)


def raise_unprintable():
    """Rank 1 raises an exception whose __str__ raises."""
    import os

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")

    if os.environ["HOROVOD_RANK"] == "1":
        raise Unprintable()
    return "ok"


def exit_on_rank(code):
    """Rank 1 calls sys.exit(code); rank 0 returns 'done'."""
    import os
    import sys

    if os.environ["HOROVOD_RANK"] == "1":
        sys.exit(code)
    return "done"


def linger_after_allreduce(linger_s: float = 1.0):
    """Allreduce, then rank 1 stays a while with Horovod up before returning (rank 0 does not)."""
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    for _ in range(5):
        hvd.allreduce(torch.ones(10))
    if hvd.rank() == 1:
        time.sleep(linger_s)
    return hvd.rank()


def carriage_return_progress(hold: str):
    """Draw a progress bar with carriage returns, then wait (without a newline) until ``hold``
    exists; end the line."""
    import os
    import sys
    import time

    for pct in (10, 20, 30):
        sys.stdout.write(f"\rprogress {pct}%")
        sys.stdout.flush()
    while not os.path.exists(hold):
        time.sleep(0.05)
    sys.stdout.write("\rprogress 100%\n")
    return "drawn"


def long_line(size_mb: int):
    """Print one line of ``size_mb`` MB."""
    import sys

    sys.stdout.write("x" * (size_mb * 1_000_000) + "\n")
    return size_mb


def long_line_under_signals(size_mb: int):
    """Print one line of ``size_mb`` MB while a thread sends the main thread a signal it handles
    in Python, every millisecond (as PyTorch's DataLoader handles SIGCHLD)."""
    import signal
    import sys
    import threading
    import time

    signal.signal(signal.SIGUSR1, lambda *_: None)
    main, done = threading.main_thread().ident, threading.Event()

    def signals() -> None:
        while not done.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.001)

    threading.Thread(target=signals, daemon=True).start()
    sys.stdout.write("y" * (size_mb * 1_000_000) + "\n")
    done.set()
    return size_mb


def cuda_visible_devices():
    """Every rank's CUDA_VISIBLE_DEVICES, as rank 0 sees them."""
    import horovod.torch as hvd
    import os

    hvd.init()
    return hvd.allgather_object(os.environ.get("CUDA_VISIBLE_DEVICES"))


def sleep_in_allreduce(pid_dir: str):
    """Write this rank's pid and its supervisor's to ``pid_dir``, then allreduce until killed."""
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    with open(os.path.join(pid_dir, f"rank{hvd.rank()}"), "w") as fh:
        fh.write(f"{os.getpid()}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        hvd.allreduce(torch.ones(10))
        time.sleep(0.05)
    return "never"


def shard_report(out: str, **frames):
    """Each rank writes what its DataFrame shards hold to ``out/<rank>.json``."""
    import json
    import os

    import horovod.torch as hvd

    hvd.init()
    report = {}
    for name, shard in frames.items():
        entry = {"ids": shard.to_numpy("id").tolist(), "repr": repr(shard),
                 "rows_per_rank": shard.rows_per_rank, "dtypes": shard.dtypes,
                 "steps": shard.steps_per_epoch(16), "rank": shard.rank, "size": shard.size}
        for column in ("vec", "arr"):
            if column in shard.columns:
                array = shard.to_numpy(column)
                entry[column] = {"shape": list(array.shape), "dtype": str(array.dtype),
                                 "rows": array.tolist()}
        if "name" in shard.columns:
            entry["name"] = shard.to_numpy("name").tolist()
        report[name] = entry
    with open(os.path.join(out, f"{hvd.rank()}.json"), "w") as f:
        json.dump(report, f)
    return report


def keras_digits(train, val, epochs: int = 8):
    """A tf.keras MLP trained on DataFrame shards; validation accuracy averaged over ranks."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    tf.random.set_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.003 * hvd.size())),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(train.to_tf_dataset("pixels", "label", batch_size=32, shuffle=True, seed=1),
                        validation_data=val.to_tf_dataset("pixels", "label", batch_size=64),
                        epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    return {"val_accuracy": history.history["val_accuracy"][-1],
            "steps": train.steps_per_epoch(32), "rows": train.rows_per_rank}


def torch_digits(train, val, epochs: int = 8):
    """A PyTorch MLP trained on DataFrame shards with a plain loop; accuracy over all ranks."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), 0.003 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = train.to_torch("pixels", "label", batch_size=32, shuffle=True, seed=1)
    steps = 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            steps += 1
    with torch.no_grad():  # every validation row once: this rank's own rows, in one go
        pred = model(torch.from_numpy(val.to_numpy("pixels"))).argmax(1)
    correct = int((pred == torch.from_numpy(val.to_numpy("label"))).sum())
    total = len(val)
    counts = hvd.allreduce(torch.tensor([float(correct), float(total)]), op=hvd.Sum)
    return {"accuracy": float(counts[0] / counts[1]), "steps": steps,
            "steps_per_epoch": len(loader)}


def rank_metrics(epochs: int = 2):
    """Each rank reports ``score = rank + epoch`` at each epoch's end (the mean over 2 ranks is
    ``epoch + 0.5``) and a last ``loss`` through ``report``."""
    import os

    from hvd_magics.rank.api import progress

    rank = int(os.environ["HOROVOD_RANK"])
    for epoch in range(1, epochs + 1):
        progress.start_epoch(epoch, epochs, steps=4, batch_size=8)
        progress.report(4, loss=10.0 * rank + epoch)
        progress.end_epoch(samples=32, score=rank + epoch)
    return "ok"


def port_at_import():
    """Its leading import is imported by the rank before the job arrives."""
    import tests.preimport_probe as probe
    import os

    return {"at_import": probe.PORT_AT_IMPORT, "now": os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]}


def elastic_torch(steps: int = 200, commit_every: int = 5, marks: str = ""):
    """An elastic PyTorch job (Horovod's own elastic API): ``steps`` SGD steps on one linear
    model, committing every ``commit_every`` steps.

    It leaves marks for the test that drives it in the folder ``marks``: each rank writes
    ``<its slot host>.pid`` (its pid) at its first commit, rank 0 writes ``size<N>`` after each
    re-forming into N ranks and ``resumed-<reset>`` (a time) at the first commit after it.
    While the file ``hold`` exists, each step sleeps 0.1 s, so the test decides how long the
    job lasts, never the step count. Returns what every rank ends with.
    """
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    seen = {"step": 0, "lost": [], "resets": 0, "pid_written": False, "resumed": False}

    def mark(name: str, text: str = "") -> None:
        if marks:
            with open(os.path.join(marks, name + ".tmp"), "w") as fh:
                fh.write(text)
            os.replace(os.path.join(marks, name + ".tmp"), os.path.join(marks, name))

    def on_reset() -> None:
        seen["resets"] += 1
        seen["lost"].append(seen["step"] - state.step)  # steps done since the last commit
        seen["resumed"] = False
        if hvd.rank() == 0:
            mark(f"size{hvd.size()}", str(time.time()))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        generator = torch.Generator().manual_seed(hvd.rank())
        while state.step < steps:
            x = torch.randn(16, 4, generator=generator)
            optimizer.zero_grad()
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            loss.backward()
            optimizer.step()
            state.step += 1
            seen["step"] = state.step
            if state.step % commit_every == 0:
                state.commit()
                if not seen["pid_written"]:
                    mark(os.environ["HOROVOD_HOSTNAME"] + ".pid", str(os.getpid()))
                    seen["pid_written"] = True
                if not seen["resumed"] and seen["resets"] and hvd.rank() == 0:
                    mark(f"resumed-{seen['resets']}", str(time.time()))
                seen["resumed"] = True
            if marks and os.path.exists(os.path.join(marks, "hold")):
                time.sleep(0.1)

    train(state)
    weights = [p.detach().numpy().ravel().tolist() for p in model.parameters()]
    return hvd.allgather_object({"rank": hvd.rank(), "size": hvd.size(), "step": state.step,
                                 "weights": weights, "lost": seen["lost"],
                                 "host": os.environ["HOROVOD_HOSTNAME"]})


def elastic_keras(epochs: int = 6, marks: str = ""):
    """An elastic tf_keras job with Horovod's ``TensorFlowKerasState`` and its callbacks; each
    rank writes ``<slot host>.pid`` in ``marks`` once its first epoch ended, and every epoch is
    slow enough (0.2 s a batch after the first) for a rank to be killed during the next."""
    import os
    import time

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05))
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  experimental_run_tf_function=False)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    class Marks(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            path = os.path.join(marks, os.environ["HOROVOD_HOSTNAME"] + ".pid")
            if marks and not os.path.exists(path):
                with open(path + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.replace(path + ".tmp", path)

        def on_train_batch_end(self, batch, logs=None):
            if state.epoch >= 1:
                time.sleep(0.2)

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, batch_size=32, steps_per_epoch=4, epochs=epochs - state.epoch,
                  verbose=0, callbacks=[hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
                                        hvd.elastic.UpdateBatchStateCallback(state),
                                        hvd.elastic.UpdateEpochStateCallback(state), Marks()])

    train(state)
    weights = [w.ravel().tolist() for w in model.get_weights()]
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object({"rank": hvd.rank(), "epoch": state.epoch,
                                    "weights": weights})


def uneven_sums(framework: str = "torch", user_join: bool = False, exit_early: bool = False):
    """Rank 1 runs 2 steps, rank 0 runs 4, each an allreduce Sum of 1.0 (the issue's cell).

    ``user_join``: rank 1 calls ``hvd.join()`` itself when it runs out (Horovod's meaning:
    it adds zeros), and so does rank 0 at its end. ``exit_early``: rank 1 calls ``sys.exit(0)``
    right after ``hvd.init()``.
    """
    import sys

    if framework == "torch":
        import horovod.torch as hvd
        import torch

        def total():
            return float(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    else:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        def total():
            return float(hvd.allreduce(tf.ones(1), op=hvd.Sum).numpy()[0])
    hvd.init()
    if exit_early and hvd.rank() == 1:
        sys.exit(0)
    steps = 2 if hvd.rank() == 1 else 4
    sums = [total() for _ in range(steps)]
    if user_join:
        hvd.join()
    return sums


def rank_zero_works_alone_after_training(work_s: float = 8.0):
    """Both ranks train; then rank 0 alone works a while with no collective (legitimate). Rank 0
    also returns the CPU seconds rank 1's main thread used meanwhile (it waits to leave
    Horovod)."""
    import os
    import time

    import horovod.torch as hvd
    import torch

    def main_thread_cpu_s(pid: int) -> float:
        with open(f"/proc/{pid}/task/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    hvd.init()
    total = float(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    pids = hvd.allgather_object(os.getpid())
    if hvd.rank() == 0:
        time.sleep(1.0)  # rank 1 is in its wait to leave by now
        before = main_thread_cpu_s(pids[1])
        time.sleep(work_s - 1.0)
        return total, hvd.rank(), hvd.size(), main_thread_cpu_s(pids[1]) - before
    return total


def wait_for_a_slower_peer(peer_s: float = 3.0):
    """Rank 1 sleeps ``peer_s`` seconds before an allreduce that rank 0 waits in; rank 0 returns
    the CPU seconds its main thread used in that wait, and the wait's seconds."""
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    hvd.allreduce(torch.ones(1), name="meet")
    if hvd.rank() == 1:
        time.sleep(peer_s)
    began, cpu = time.monotonic(), time.thread_time()
    hvd.allreduce(torch.ones(1), name="waited")
    return time.thread_time() - cpu, time.monotonic() - began


def undecorated_elastic_loop(steps: int = 200):
    """An elastic job's loop written without ``@hvd.elastic.run``: rank 1 dies at step 5."""
    import os
    import signal
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    for step in range(steps):
        if hvd.rank() == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(1))
        time.sleep(0.05)
    return steps


def rank_metrics_held(marks: str, epochs: int = 3):
    """As :func:`rank_metrics`, but after epoch 1 it writes ``marks/epoch1`` and waits for
    ``marks/go`` (the test stops the tracking server meanwhile)."""
    import os
    import time

    from hvd_magics.rank.api import progress

    rank = int(os.environ["HOROVOD_RANK"])
    for epoch in range(1, epochs + 1):
        progress.start_epoch(epoch, epochs, steps=4, batch_size=8)
        progress.report(4, loss=10.0 * rank + epoch)
        progress.end_epoch(samples=32, score=rank + epoch)
        if epoch == 1:
            open(os.path.join(marks, "epoch1"), "w").close()
            while not os.path.exists(os.path.join(marks, "go")):
                time.sleep(0.05)
    return "ok"


def pool_keep(**values):
    """Keep ``values`` in the rank's kept namespace (a warm pool's); return this process's pid."""
    import os

    from hvd_magics import rank_namespace

    rank_namespace().update(values)
    return os.getpid()


def pool_horovod_init():
    """Initialise Horovod (torch) on the pool's rank: its background threads run from then on."""
    import horovod.torch as hvd

    hvd.init()


def pool_read(name: str):
    """What the rank's kept namespace holds under ``name`` (``None``), and this process's pid."""
    import os

    from hvd_magics import rank_namespace

    return rank_namespace().get(name), os.getpid()


def pool_build_model():
    """Initialise Horovod and keep a small torch model and its optimizer for the next runs."""
    import horovod.torch as hvd
    import torch

    from hvd_magics import rank_namespace

    hvd.init()
    torch.manual_seed(hvd.rank())  # different on each rank until the broadcast
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    rank_namespace().update(model=model, optimizer=optimizer)
    return [float(w) for w in model.weight.detach().flatten()]


def pool_train_kept(steps: int):
    """Train the kept model ``steps`` steps on this rank's data; return its weights."""
    import horovod.torch as hvd
    import torch

    from hvd_magics import rank_namespace

    model, optimizer = rank_namespace()["model"], rank_namespace()["optimizer"]
    generator = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(8, 4, generator=generator)
        optimizer.zero_grad()
        ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
        optimizer.step()
    return [float(w) for w in model.weight.detach().flatten()]


def pool_raise_on_rank_1_while_0_allreduces():
    """Rank 1 raises; rank 0 waits in an allreduce rank 1 never enters (stuck)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 gives up")
    hvd.allreduce(torch.ones(3), name="never.completed")


def pool_sleep_marked(marks: str):
    """Write ``marks``/<rank>, then sleep (until interrupted)."""
    import os
    import time

    with open(os.path.join(marks, os.environ["HOROVOD_RANK"]), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)


def raise_on_rank(bad_rank: int = 1):
    """Rank ``bad_rank`` raises ``ValueError``; the others return their rank (no collective)."""
    import os

    rank = int(os.environ["HOROVOD_RANK"])
    if rank == bad_rank:
        raise ValueError(f"boom from rank {rank}")
    return rank


def environment_value(name: str):
    """``os.environ.get(name)`` on rank 0."""
    import os

    return os.environ.get(name)


def wait_for_a_sleeping_peer():
    """Rank 1 sleeps in ``slow_down`` while rank 0 waits for it in an allreduce."""
    import time

    import horovod.torch as hvd
    import torch

    def slow_down():
        time.sleep(600)

    hvd.init()
    if hvd.rank() == 1:
        slow_down()
    hvd.allreduce(torch.ones(3), name="grad.dense/kernel")


def shard_sums(column: str = "x", **frames):
    """The sum and row count of ``column`` in this rank's shard of each DataFrame."""
    return {name: (float(shard.to_numpy(column).sum()), len(shard))
            for name, shard in frames.items()}


def keras_3_with_horovod_callbacks():
    """A Keras 3 model (the keras package) trained with Horovod's Keras callback."""
    import horovod.tensorflow.keras as hvd
    import keras
    import numpy as np

    hvd.init()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    model.fit(np.zeros((8, 2)), np.zeros(8), epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


def module_value(name: str):
    """``VALUE`` of module ``name`` (imported, or as the rank already holds it)."""
    import importlib

    return importlib.import_module(name).VALUE


def task_process(out: str):
    """Write the process id of the Spark task (a Python worker) that started this rank to
    ``out/<rank>``: its supervisor (a rank forked from a zygote is not its descendant)."""
    import os

    import psutil

    task = psutil.Process(int(os.environ["HVD_MAGICS_SUPERVISOR_PID"]))
    with open(os.path.join(out, os.environ["HOROVOD_RANK"]), "w") as file:
        file.write(str(task.pid))


def keras_callback_timing_warnings(slow_s: float = 0.05):
    """Two tf.keras fits: one with Horovod's broadcast callback, then one with a user's callback
    that sleeps ``slow_s`` at each batch's end; Keras's warnings of slow callbacks in each."""
    import logging
    import time

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    class Slow(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(slow_s)  # the slowness under test, not a wait

    keep = Keep()
    logging.getLogger("tensorflow").addHandler(keep)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 20)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input((20,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    warned = {}
    for name, callback in (("broadcast", hvd.callbacks.BroadcastGlobalVariablesCallback(0)),
                           ("slow", Slow())):
        keep.lines = []
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
        warned[name] = [line for line in keep.lines if "is slow compared" in line]
    return warned


def _zygote_of_this_rank():
    """The zygote this rank was forked from (rank -> keeper -> zygote), as a ``psutil.Process``,
    or ``None`` for a rank started fresh."""
    import psutil

    from hvd_magics.protocol import ZYGOTE_MODULE

    above = psutil.Process().parent().parent()
    return above if ZYGOTE_MODULE in " ".join(above.cmdline()) else None


def _zygote_pid():
    zygote = _zygote_of_this_rank()
    return zygote.pid if zygote else None


def kill_own_keeper(sig: int):
    """Send the rank's keeper ``sig`` when the rank was forked from a zygote (its keeper then
    kills it); ``"fresh"`` otherwise."""
    import os
    import time

    import torch  # noqa: F401 - a framework, so that the next rank of this environment is forked

    if _zygote_of_this_rank() is None:
        return "fresh"
    os.kill(os.getppid(), sig)
    time.sleep(60)  # killed meanwhile


def zygote_draws():
    """Every rank's draws from Python's, numpy's and torch's global generators, whether its
    process was forked from a zygote, and that zygote's pid."""
    import os
    import random

    import horovod.torch as hvd
    import numpy as np
    import torch

    hvd.init()
    mine = {"draws": (random.random(), float(np.random.rand()), float(torch.rand(1))),
            "zygote": _zygote_pid(), "pid": os.getpid()}
    return hvd.allgather_object(mine)


def zygote_place():
    """Every rank's zygote (its pid, ``None`` for a rank started fresh), folder (a standalone
    executor's own work folder) and where it imported hvd_magics from."""
    import os

    import horovod.torch as hvd

    import hvd_magics

    hvd.init()
    return hvd.allgather_object({"zygote": _zygote_pid(), "cwd": os.getcwd(),
                                 "package": hvd_magics.__file__})


def zygote_imports(modules: list[str]):
    """Which of ``modules`` this rank held before the job imported them, and the pid of the zygote
    it was forked from (``None`` for a rank started fresh)."""
    import importlib
    import sys

    held = [name for name in modules if name in sys.modules]
    for name in modules:
        importlib.import_module(name)
    return held, _zygote_pid()


def zygote_setting(name: str):
    """The variable ``name`` as this rank sees it and as its zygote saw it when it started
    (``None`` for a rank started fresh)."""
    import os

    import torch  # noqa: F401 - a framework, so that the next rank of this environment is forked

    zygote = _zygote_of_this_rank()
    if zygote is None:
        return os.environ.get(name), None, None
    return os.environ.get(name), zygote.environ().get(name), zygote.pid


def rank_threads():
    """Every rank's ``OMP_NUM_THREADS`` and the intra-op threads its PyTorch took from it."""
    import os

    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allgather_object((os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()))


def horovod_init_late(late: int = 1, seconds: float = 8.0):
    """Rank ``late`` reaches ``hvd.init()`` ``seconds`` after the others."""
    import os
    import time

    import horovod.torch as hvd

    if int(os.environ["HOROVOD_RANK"]) == late:
        time.sleep(seconds)
    hvd.init()
    return hvd.rank()
