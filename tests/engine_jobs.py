"""Functions the tests run on torch.distributed and tf.distribute ranks (pickled by value)."""


def ddp_allreduce():
    """Each rank adds rank+1 with torch.distributed (Gloo); every rank's view comes back."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    mine = {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": total.item(),
            "pid": os.getpid(), "local_rank": int(os.environ["LOCAL_RANK"]),
            "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
            "horovod_vars": sorted(k for k in os.environ if k.startswith("HOROVOD_"))}
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    return views


def ddp_mlp(epochs: int = 2, steps: int = 20, batch: int = 32, shard=None):
    """A small MLP trained with DistributedDataParallel, reporting its progress; returns the
    final loss and a checksum of the weights (the same on every rank after DDP's averaging).
    With ``shard``, the batches come from that DataFrame shard (columns ``x`` and ``y``)."""
    import torch
    import torch.distributed as dist

    import hvd_magics

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(dist.get_rank())
    loss = torch.tensor(0.0)
    for epoch in range(1, epochs + 1):
        if shard is not None:
            batches = ((torch.as_tensor(b["x"], dtype=torch.float32),
                        torch.as_tensor(b["y"], dtype=torch.float32).reshape(-1, 1))
                       for b in shard.batches(batch, shuffle=True, seed=epoch))
            total = shard.steps_per_epoch(batch)
        else:
            batches = ((x, x.sum(1, keepdim=True)) for x in
                       (torch.randn(batch, 8, generator=generator) for _ in range(steps)))
            total = steps
        hvd_magics.progress.start_epoch(epoch, epochs, total, batch)
        for step, (x, y) in enumerate(batches, 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            hvd_magics.progress.report(step, loss=loss.item())
        hvd_magics.progress.end_epoch(samples=total * batch, loss=loss.item())
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    sums = [None] * dist.get_world_size()
    dist.all_gather_object(sums, round(checksum, 5))
    return {"loss": loss.item(), "checksums": sums}


def ddp_then_destroy(learning_rate: float = 0.5):
    """pyspark's TorchDistributor pattern: train a DDP model, destroy the process group, return
    the loss (the model is freed as the function returns)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
    x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dist.destroy_process_group()
    return loss.item()


def groups_kept_around_init():
    """How many destroyed process groups this rank keeps before and after a new
    ``init_process_group`` (hvd_magics.rank.torch_group_hold), then destroy the new one."""
    import torch.distributed as dist

    from hvd_magics.rank import torch_group_hold

    before = len(torch_group_hold._HELD)
    dist.init_process_group(backend="gloo")
    after = len(torch_group_hold._HELD)
    dist.destroy_process_group()
    return before, after, len(torch_group_hold._HELD)


def destroy_then_linger(seconds: float = 1.5):
    """Start and destroy the group at once (pyspark's docstring example); rank 1 then works on
    alone for ``seconds`` before it returns."""
    import time

    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 1:
        time.sleep(seconds)  # the rank's own work after the group, not a wait for a condition
    return rank


def ddp_fail(bad_rank: int = 1):
    """Rank ``bad_rank`` raises; the others wait in an all_reduce it never enters."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} before the failure", flush=True)
    if dist.get_rank() == bad_rank:
        time.sleep(0.5)
        raise ValueError(f"boom from DDP rank {dist.get_rank()}")
    dist.all_reduce(torch.ones(1))
    time.sleep(600)
    return "never"


def wait_marked(marks: str, engine: str = "torch", seconds: float = 600):
    """Every rank starts its engine, leaves a file named by its rank in ``marks`` and waits
    (to be interrupted)."""
    import os
    import pathlib
    import time

    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    else:
        import tensorflow as tf

        tf.distribute.MultiWorkerMirroredStrategy()
    pathlib.Path(marks, os.environ["HVD_MAGICS_RANK"]).touch()
    time.sleep(seconds)


def horovod_on_torch_engine():
    """The mistake: hvd.init() on ranks started for torch.distributed."""
    import horovod.torch as hvd

    hvd.init()


def tf_mwms_fit(epochs: int = 2, fail_rank: int | None = None, shard=None,
                reduces_mb: int = 0):
    """A Keras model fitted under MultiWorkerMirroredStrategy (on ``shard``'s columns ``x`` and
    ``y`` when given: each worker its own rows), then three cross-worker sums of ``reduces_mb``
    MB each (when given) as the job's last calls; returns rank 0's view and what TF_CONFIG
    named."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    config = json.loads(os.environ["TF_CONFIG"])
    if fail_rank is not None and config["task"]["index"] == fail_rank:
        raise ValueError(f"boom from tf worker {fail_rank}")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    options = tf.data.Options()
    if shard is None:
        policy = tf.data.experimental.AutoShardPolicy.DATA
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    else:  # the rows are this worker's already
        policy = tf.data.experimental.AutoShardPolicy.OFF
        data = shard.to_tf_dataset("x", "y", batch_size=32)
    options.experimental_distribute.auto_shard_policy = policy
    data = data.with_options(options)
    history = model.fit(data, epochs=epochs, verbose=0)
    total = float(sum(float(np.sum(w)) for w in model.get_weights()))
    summed = None
    for _ in range(3 if reduces_mb else 0):
        ones = strategy.run(lambda: tf.ones([reduces_mb * 1024 * 1024 // 4]))
        summed = float(strategy.reduce("SUM", ones, axis=None)[0])
    return {"workers": strategy.num_replicas_in_sync, "loss": history.history["loss"][-1],
            "weights": round(total, 4), "index": config["task"]["index"],
            "cluster": config["cluster"]["worker"], "summed": summed}


def ddp_allreduce_kept():
    """On a warm pool: join the process group once (the first run), all_reduce every run."""
    import os

    import torch
    import torch.distributed as dist

    before = dist.is_initialized()
    if not before:
        dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return {"sum": total.item(), "pid": os.getpid(), "initialised_before": before}


def uneven_all_reduces():
    """Rank 0 makes three all_reduce calls, rank 1 two: the first two are right, the third
    can never complete."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    values = []
    for _ in range(3 if dist.get_rank() == 0 else 2):
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        values.append(float(tensor))
        print("all_reduce gave", float(tensor), flush=True)
    return values


def ddp_uneven_steps(steps: tuple = (30, 15), join: bool = False):
    """The usual DDP loop, rank 0 taking ``steps[0]`` steps and rank 1 ``steps[1]`` (uneven
    data per rank); with ``join``, inside DDP's join context, which lets that end."""
    import contextlib

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    taken = 0
    with model.join() if join else contextlib.nullcontext():
        for _ in range(steps[dist.get_rank()]):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            taken += 1
    return taken


def all_reduce_against_broadcast():
    """Rank 0 calls all_reduce where rank 1 calls broadcast: they never meet."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(3)
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)
    else:
        dist.broadcast(tensor, 0)
    print("value", tensor.tolist(), flush=True)


def uneven_tf_reduces():
    """Worker 0 makes three cross-worker reductions, worker 1 two."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    for _ in range(3 if strategy.cluster_resolver.task_id == 0 else 2):
        value = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        print("reduce gave", float(value), flush=True)


def _where():
    """This rank's Python and where its hvd_magics came from."""
    import sys

    import hvd_magics

    return sys.executable, hvd_magics.__file__


def ddp_where():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    return (*_where(), float(total))


def horovod_where():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return (*_where(), float(hvd.allreduce(torch.ones(1), op=hvd.Sum)))


def _ancestors() -> list[str]:
    """This process's ancestors' command lines, its parent's first."""
    import os

    found, pid = [], os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                found.append(cmd.read().replace(b"\0", b" ").decode(errors="replace"))
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return found


def hosts_of_ranks(engine: str = "torch", ancestors: bool = False):
    """Every rank's (rank, host name, its engine's sum of ones) as rank 0 gathers them, and its
    process's ancestors (``ancestors``)."""
    import socket

    import torch

    if ancestors:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        views = [None] * dist.get_world_size()
        dist.all_gather_object(views, (dist.get_rank(), socket.gethostname(), _ancestors()))
        return views

    if engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
        total = float(hvd.allreduce(torch.ones(1), op=hvd.Sum))
        return hvd.allgather_object((hvd.rank(), socket.gethostname(), total))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, (dist.get_rank(), socket.gethostname(), float(total)))
    return views


def tf_where():
    import json
    import os

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)),
                            axis=None)
    return (*_where(), float(total), len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]))


def shipped_marker_where():
    """The rank's Python, its prefix and the version of the package only the shipped
    environment holds."""
    import sys

    import shipped_marker

    return sys.executable, sys.prefix, shipped_marker.VERSION


def shipped_marker_where_with(**frames):
    """As :func:`shipped_marker_where`, on ranks that read a shard of each DataFrame (its rows
    must be there)."""
    assert all(len(shard) > 0 for shard in frames.values()), frames
    return shipped_marker_where()


def resume_points(saves: int = 3):
    """Every rank asks ``checkpoint.latest()``, rank 1 only after rank 0 has saved ``saves``
    newer checkpoints (a peer that starts late); returns each rank's step and whether the
    folder still holds it."""
    import torch.distributed as dist

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    found = checkpoint.latest() if rank == 0 else None
    if rank == 0:
        for step in range(saves):
            checkpoint.save({"step": 100 + step}, 100 + step)
    dist.barrier()
    if rank == 1:
        found = checkpoint.latest()
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, None if found is None else found[1])
    return views


class SlowToPickle:
    """Part of a checkpoint whose pickling stops half-way: it writes ``saving`` (with its
    process id) in ``folder`` and sleeps, so that a test can kill the rank while its checkpoint
    file is half written."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __reduce__(self):
        import os
        import time

        with open(os.path.join(self.folder, "saving"), "w") as out:
            out.write(str(os.getpid()))
        time.sleep(120)
        return (SlowToPickle, (self.folder,))


def _data_parallel(model, optimizer, engine):
    """``(rank, module to call, optimizer to step)`` of ``model`` trained by ``optimizer`` under
    DDP (``engine="torch"``) or Horovod."""
    import torch

    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        return dist.get_rank(), torch.nn.parallel.DistributedDataParallel(model), optimizer
    import horovod.torch as hvd

    hvd.init()
    return hvd.rank(), model, hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())


def steps_with_checkpoints(steps=20, every=5, kill_on=None, bad_rank=None, engine="torch",
                           hold_on=None, step_s=0.0, spot=None, torn_save=None):
    """A regression trained ``steps`` steps from seeded data under DDP (``engine="torch"``) or
    Horovod, saving a checkpoint every ``every`` steps and resuming from the latest one.
    ``kill_on``: ``(step, attempts)``, rank 1 SIGKILLs itself after that step on those attempts;
    ``bad_rank`` raises a ValueError; ``hold_on``: ``(attempt, folder)``, on that attempt every
    rank writes ``folder/<rank>`` once it resumed and waits (for the test's interrupt);
    ``step_s``: seconds each step takes more; ``spot``: ``(step, folder[, attempts])``, every
    rank also saves when ``checkpoint.preempting()`` says so, appends ``"<attempt> <step>"`` to
    ``folder/steps-<rank>`` for each step it takes, and on the first attempt rank 1 writes its
    pid to ``folder/rank1`` after that step (for the test to decommission its executor); with
    ``attempts`` (2), on the second too, to ``folder/rank1-1`` 10 steps after it resumed.
    ``torn_save``: a folder; on the first attempt the save on the notice carries
    :class:`SlowToPickle` after 256 KiB of padding (written out before it stops).
    Returns the weights, the attempt, the step it started from and when (``time.time()``) its
    process started, this function began and its first step ended."""
    import os
    import signal
    import time as clock

    import psutil

    entered_at = clock.time()
    import torch

    from hvd_magics import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rank, forward, optimizer = _data_parallel(model, optimizer, engine)
    if rank == bad_rank:
        raise ValueError(f"bad shard on rank {rank}")
    start = 0
    found = checkpoint.latest()
    if found is not None:
        state, start = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    if hold_on and checkpoint.attempt() == hold_on[0]:
        import time

        open(os.path.join(hold_on[1], str(rank)), "w").close()
        time.sleep(600)
    first_step_at = None
    for step in range(start, steps):
        clock.sleep(step_s)
        data = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(8, 4, generator=data)
        optimizer.zero_grad()
        loss = ((forward(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        optimizer.step()
        if kill_on and rank == 1 and step == kill_on[0] and checkpoint.attempt() in kill_on[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        if spot:
            with open(os.path.join(spot[1], f"steps-{rank}"), "a") as out:
                out.write(f"{checkpoint.attempt()} {step}\n")
            marks = spot[2] if len(spot) > 2 else 1  # how many attempts are decommissioned
            attempt = checkpoint.attempt()
            if rank == 1 and step == (spot[0] if attempt == 0 else start + 10) and \
                    attempt < marks:
                name = "rank1" if attempt == 0 else f"rank1-{attempt}"
                with open(os.path.join(spot[1], name), "w") as out:
                    out.write(str(os.getpid()))
        on_notice = bool(spot) and checkpoint.preempting()
        if (step + 1) % every == 0 or on_notice:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            if on_notice and torn_save and checkpoint.attempt() == 0:
                state.update(pad=b"x" * 262144, slow=SlowToPickle(torn_save))
            checkpoint.save(state, step + 1)
        first_step_at = first_step_at or clock.time()
    return {"weights": [p.detach().tolist() for p in model.parameters()],
            "attempt": checkpoint.attempt(), "start": start, "first_step_at": first_step_at,
            "process_at": psutil.Process().create_time(), "entered_at": entered_at}


def tf_fit_with_backup(epochs=6, kill_after_epoch=None, pause_after_epoch=None):
    """A Keras fit under MultiWorkerMirroredStrategy with Keras' own BackupAndRestore in the
    job's checkpoint folder; worker 1 SIGKILLs itself after epoch ``kill_after_epoch`` (1-based)
    on the first attempt; ``pause_after_epoch``: ``(epoch, folder)``, there it writes its pid to
    ``folder/rank1`` and waits instead (for the test to kill its executor). Returns the epochs
    this attempt ran and the final weights' sum."""
    import os
    import signal

    import numpy as np
    import tensorflow as tf

    from hvd_magics import checkpoint

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(32)
    ran = []

    class Track(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            ran.append(epoch + 1)

        def on_epoch_end(self, epoch, logs=None):
            if index == 1 and epoch + 1 == kill_after_epoch and checkpoint.attempt() == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if index == 1 and pause_after_epoch and epoch + 1 == pause_after_epoch[0] and \
                    checkpoint.attempt() == 0:
                import time

                with open(os.path.join(pause_after_epoch[1], "rank1"), "w") as out:
                    out.write(str(os.getpid()))
                time.sleep(600)

    backup = tf.keras.callbacks.BackupAndRestore(str(checkpoint.directory() / "keras"))
    model.fit(data, epochs=epochs, verbose=0, callbacks=[backup, Track()])
    return {"ran": ran, "attempt": checkpoint.attempt(),
            "weights": float(sum(float(np.sum(w)) for w in model.get_weights()))}


def topology_views(engine: str = "horovod"):
    """Every rank's place as its engine tells it, after an allreduce over all ranks (rank + 1
    summed): rank 0 returns each rank's view."""
    import json
    import os
    import socket

    view = {"pid": os.getpid(), "host": socket.gethostname(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "torchrun": {k: os.environ.get(k) for k in (
                "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")}}
    if engine == "horovod":
        import horovod.torch as hvd
        import torch

        hvd.init()
        view.update(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                    local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                    cross_size=hvd.cross_size(),
                    sum=hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())
        return hvd.allgather_object(view)
    if engine == "torch":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(total)
        view.update(rank=dist.get_rank(), size=dist.get_world_size(), sum=total.item())
        views = [None] * dist.get_world_size()
        dist.all_gather_object(views, view)
        return views
    import tensorflow as tf

    config = json.loads(os.environ["TF_CONFIG"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = config["task"]["index"]
    total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.run(lambda: tf.constant(rank + 1.0)), axis=None)
    view.update(rank=rank, size=len(config["cluster"]["worker"]), sum=float(total),
                workers=config["cluster"]["worker"])
    size = len(config["cluster"]["worker"])
    pids = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
        lambda: tf.one_hot(rank, size, dtype=tf.float64) * os.getpid()), axis=None)
    return [{**view, "rank": r, "pid": int(pid)} if r != rank else view
            for r, pid in enumerate(pids.numpy())]


def _lightning_linear(**log):
    """A Lightning module of one linear layer (4 to 1), SGD, its MSE logged as ``train_mse``
    with ``self.log(..., **log)``."""
    import pytorch_lightning as pl
    import torch

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, _index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_mse", loss, **log)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Linear()


def lightning_fit(devices=None, num_nodes=None, strategy=None):
    """Two epochs of a Lightning ``Trainer`` on a linear model (CPU, quiet); returns this rank's
    global rank and world size as Lightning saw them, and the job's rank. An argument left
    ``None`` is left out of ``Trainer(...)``, as a user who writes no layout leaves it."""
    import os

    import pytorch_lightning as pl
    import torch

    layout = {name: value for name, value in (("devices", devices), ("num_nodes", num_nodes),
                                              ("strategy", strategy)) if value is not None}
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(**layout, accelerator="cpu", max_epochs=2, enable_progress_bar=False,
                         enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer.fit(_lightning_linear(on_step=False, on_epoch=True),
                torch.utils.data.DataLoader(data, batch_size=8))
    return trainer.global_rank, trainer.world_size, int(os.environ["RANK"])


def fabric_sum():
    """A Lightning ``Fabric()`` as its docs write it, no layout given: this rank's global rank
    and world size as Fabric saw them, and the sum of every rank's rank + 1 over its collective."""
    import torch
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu")
    fabric.launch()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    return fabric.global_rank, fabric.world_size, float(total)


def _hand_the_order(step: int, order_at: int, attempt: int) -> None:
    """At step ``order_at`` of the first attempt, every rank hands itself the driver's
    preemption order for the ask three on, as its supervisor hands it on
    (:func:`hvd_magics.rank.api.preemption.on_order`): the ranks of these jobs run on the driver,
    which has no executor to decommission."""
    import json

    from hvd_magics.rank.api import preemption

    if attempt == 0 and step == order_at:
        at = preemption._state.calls + 3  # noqa: SLF001 - the driver's pick
        preemption.on_order(json.dumps({"at": at, "notice": "executor 1 is going"}))


def keras_spot(folder: str | None = None, epochs: int = 4, steps: int = 20, order_at: int = 10,
               step_s: float = 0.05):
    """A Keras ``fit`` under Horovod (tf_keras, the README's callbacks) of ``epochs`` epochs of
    ``steps`` batches of seeded data, unshuffled, with Adam (state in its slots); nothing of
    preemption in it. With ``folder``: each batch takes ``step_s`` more, each rank appends
    ``"<attempt> <global step>"`` to ``folder/steps-<rank>`` per batch, and on the first attempt
    the preemption order comes after ``order_at`` batches (:func:`_hand_the_order`). Returns the
    weights (as lists) and the attempt."""
    import os
    import time

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    from hvd_magics import checkpoint

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(steps * 8, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    tf.keras.utils.set_random_seed(0)  # tf.random.set_seed alone leaves tf_keras's initializers
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), "mse")
    attempt = checkpoint.attempt()

    class Steps(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = self.epoch * steps + batch + 1
            time.sleep(step_s)
            with open(os.path.join(folder, f"steps-{hvd.rank()}"), "a") as out:
                out.write(f"{attempt} {step}\n")
            _hand_the_order(step, order_at, attempt)

    marks = [Steps()] if folder else []
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *marks])
    return [w.tolist() for w in model.get_weights()], attempt


def lightning_spot(folder: str, steps: int = 60, order_at: int = 10):
    """A Lightning ``Trainer`` of ``steps`` steps (each 50 ms longer) on the job's topology,
    as written, with nothing about preemption; its module appends ``"<attempt> <global
    step>"`` to ``folder/steps-<rank>`` after each batch, and on the first attempt the
    preemption order comes after step ``order_at`` (:func:`_hand_the_order`). Returns the
    attempt, the step it started from and the last step."""
    import os
    import time

    import pytorch_lightning as pl
    import torch

    from hvd_magics import checkpoint

    class Logged(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.first = None

        def training_step(self, batch, _index):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            time.sleep(0.05)
            step = self.trainer.global_step
            self.first = self.first or step
            rank = self.trainer.global_rank
            with open(os.path.join(folder, f"steps-{rank}"), "a") as out_file:
                out_file.write(f"{checkpoint.attempt()} {step}\n")
            _hand_the_order(step, order_at, checkpoint.attempt())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    trainer = pl.Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                         num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), accelerator="cpu",
                         max_steps=steps, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False)
    module = Logged()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    return checkpoint.attempt(), module.first, trainer.global_step


def library_alone(library: str):
    """Make what ``library`` trains with the way its docs write it, in a job whose engine that
    library cannot join: each rank would train alone."""
    import os

    if library == "accelerate":
        from accelerate import Accelerator

        return Accelerator().num_processes
    if library == "hf":
        return hf_trainer_fit(os.getcwd())
    if library == "lightning":
        import pytorch_lightning as pl
        import torch

        data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        trainer = pl.Trainer(accelerator="cpu", logger=False, max_epochs=1,
                             enable_progress_bar=False, enable_checkpointing=False)
        trainer.fit(_lightning_linear(on_step=False, on_epoch=True),
                    torch.utils.data.DataLoader(data, batch_size=8))
        return trainer.world_size
    import numpy as np
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((8, 4)), np.zeros((8, 1)), verbose=0)
    return 1


def work_alone(library: str, fit_alone: bool = False):
    """The job's model trained on every rank as the library's docs write it (Lightning DDP
    under the torch engine, Keras under ``MultiWorkerMirroredStrategy`` under the tf engine),
    then single-process work of one rank's own: rank 0 predicting with a ``Trainer(devices=1)``,
    a small probe model fitted outside the strategy on every worker; with ``fit_alone``, a
    ``Trainer(devices=1).fit`` on every rank, inside ``hvd_magics.alone()`` when ``fit_alone``
    is ``"said"``. Returns what that work made (the predictions' rows, the probe's loss)."""
    import os

    import hvd_magics

    rank = int(os.environ["RANK"]) if library == "lightning" else None
    if library == "keras":
        import numpy as np
        import tensorflow as tf
        import tf_keras

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=8, verbose=0)
        probe = tf_keras.Sequential([tf_keras.layers.Dense(1)])  # outside: this worker's own
        probe.compile("sgd", "mse")
        return float(probe.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0).history["loss"][-1])
    import pytorch_lightning as pl
    import torch

    quiet = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False,
             "enable_checkpointing": False, "enable_model_summary": False}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
    model = _lightning_linear(on_step=False, on_epoch=True)
    pl.Trainer(max_epochs=1, **quiet).fit(model, loader)  # the job's model, on every rank
    if fit_alone:
        probe = _lightning_linear(on_step=False, on_epoch=True)
        if fit_alone == "said":
            with hvd_magics.alone():
                pl.Trainer(devices=1, max_epochs=1, **quiet).fit(probe, loader)
        else:
            pl.Trainer(devices=1, max_epochs=1, **quiet).fit(probe, loader)
        return "fitted"
    if rank != 0:
        return None
    rows = pl.Trainer(devices=1, **quiet).predict(model, torch.utils.data.DataLoader(
        torch.randn(12, 4), batch_size=4))
    return sum(len(r) for r in rows)


def accelerate_notebook_launcher():
    """What a notebook written for accelerate does: launch the training function itself."""
    from accelerate import notebook_launcher

    notebook_launcher(print, num_processes=2)


def _tiny_bert_and_sequences():
    """A one-layer BERT classifier built from its config (nothing downloaded) and 64 generated
    sequences of 8 token ids, labelled by their first token's parity."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=2))
    ids = torch.randint(0, 64, (64, 8), generator=torch.Generator().manual_seed(1))
    return model, [{"input_ids": ids[i], "labels": ids[i, 0] % 2} for i in range(64)]


def hf_trainer_fit(out: str, report_to: tuple = (), fsdp: str = ""):
    """Hugging Face's Trainer, two epochs of a one-layer BERT built from its config (nothing
    downloaded) on 64 generated sequences (``fsdp``: its ``fsdp=`` argument); returns the world
    size and steps it saw."""
    from transformers import Trainer, TrainingArguments

    model, data = _tiny_bert_and_sequences()
    args = TrainingArguments(output_dir=out, num_train_epochs=2, per_device_train_batch_size=8,
                             logging_steps=1, report_to=list(report_to), use_cpu=True,
                             save_strategy="no", disable_tqdm=True, fsdp=fsdp)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return trainer.args.world_size, trainer.state.global_step


def hf_trainer_spot(out: str, folder: str, steps: int = 60, order_at: int = 10):
    """Hugging Face's Trainer for ``steps`` optimizer steps (a checkpoint every 20 in ``out``,
    each step 50 ms longer), as written, with nothing about preemption; a callback of the
    test's appends ``"<attempt> <step>"`` to ``folder/steps-<rank>`` after each step, and on
    the first attempt the preemption order comes after step ``order_at``
    (:func:`_hand_the_order`). Returns the attempt, the step it started from and the last
    step."""
    import os
    import time

    import torch.distributed as dist
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hvd_magics import checkpoint

    class Steps(TrainerCallback):
        first = None

        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(0.05)
            rank = dist.get_rank()
            self.first = self.first or state.global_step
            with open(os.path.join(folder, f"steps-{rank}"), "a") as out_file:
                out_file.write(f"{checkpoint.attempt()} {state.global_step}\n")
            _hand_the_order(state.global_step, order_at, checkpoint.attempt())

    model, data = _tiny_bert_and_sequences()
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                             logging_steps=5, report_to=[], use_cpu=True, save_strategy="steps",
                             save_steps=20, disable_tqdm=True)
    steps_seen = Steps()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[steps_seen])
    trainer.train()
    return checkpoint.attempt(), steps_seen.first, trainer.state.global_step


def hf_trainer_as_written(out: str):
    """Hugging Face's Trainer as a user writes it: its tqdm bar and printed logs on, an
    evaluation each epoch; returns the last evaluation's loss and the steps."""
    from transformers import Trainer, TrainingArguments

    model, data = _tiny_bert_and_sequences()
    args = TrainingArguments(output_dir=out, num_train_epochs=2, per_device_train_batch_size=8,
                             logging_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             eval_strategy="epoch")
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:16])
    trainer.train()
    return trainer.state.log_history[-2]["eval_loss"], trainer.state.global_step


def lightning_as_written(out: str):
    """Lightning's Trainer as a user writes it: its rich progress bar, model summary and
    default logger on (rich is installed), on as many devices as the job has ranks."""
    import os

    import pytorch_lightning as pl
    import torch

    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]), max_epochs=2,
                         accelerator="cpu", default_root_dir=out)
    trainer.fit(_lightning_linear(prog_bar=True), torch.utils.data.DataLoader(data, batch_size=8))
    return trainer.global_step


def plain_ddp_loop(epochs: int = 3, rows: int = 256, batch: int = 8, set_epoch: bool = True):
    """A DDP loop with no line of hvd_magics: a DistributedSampler (its ``set_epoch`` called
    each epoch, or not), a validation pass under ``no_grad`` each epoch, the loss printed.
    Returns each epoch's last training loss."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():  # a warm pool's rank keeps its group
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(rows, 4), torch.randn(rows, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
    check = torch.utils.data.DataLoader(data, batch_size=64)
    losses = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _y in check:
                model(x)
        model.train()
        losses.append(loss.item())
        print(f"epoch {epoch}: loss {loss.item():.3f}")
    return losses


def keras_3_on_tf_engine():
    """Keras 3 under MultiWorkerMirroredStrategy: its ``fit`` (refused), then a custom loop of
    ``strategy.run`` steps; returns the refusal and the first layer's weight sum per worker."""
    import numpy as np
    import tensorflow as tf

    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(strategy.cluster_resolver.task_id).random((64, 4)).astype("f4")
    y = x.sum(1, keepdims=True)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    try:
        model.fit(x, y, epochs=1, verbose=0)
        refusal = None
    except TypeError as exc:
        refusal = f"{type(exc).__name__}: {exc}"
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16))

    @tf.function
    def step(xb, yb):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2) / 2
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(replica, (xb, yb))

    for xb, yb in batches:
        step(xb, yb)
    weight = float(np.sum(model.layers[0].kernel.numpy()))
    weights = strategy.gather(strategy.run(lambda: tf.constant([weight])), axis=0)
    return refusal, [float(w) for w in weights.numpy()]


def accelerate_loop(epochs: int = 3, cpu: bool = True):
    """An Accelerate loop as its docs write it (prepare, accelerator.backward, accelerator.log);
    returns its processes, the prepared model's type and each epoch's logged loss. ``cpu``:
    ``Accelerator(cpu=True)``, else a default ``Accelerator()``."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True) if cpu else Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    logged = []
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        accelerator.log({"train_loss": loss.item(), "epoch": epoch}, step=epoch)
        logged.append(loss.item())
    return accelerator.num_processes, type(model).__name__, logged


def accelerate_accumulating(accumulation: int = 4, pause: float = 0.0):
    """An Accelerate loop that accumulates gradients over ``accumulation`` batches, as its docs
    write it (``with accelerator.accumulate(model):``); returns the losses it computed (its own,
    before Accelerate divides them) and its optimizer steps. ``pause``: seconds before each
    batch."""
    import time

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), 3 * torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, steps = [], 0
    for x, y in loader:
        time.sleep(pause)  # long enough a step for progress reports (at most 4 a second)
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            steps += accelerator.sync_gradients
    return losses, steps


def ddp_on_a_shard_per_epoch(folder: str, rows: int = 1001, epochs: int = 2):
    """A DataFrame shard's ``to_torch`` made anew each epoch, as users write it, under DDP: a
    real shard file per rank (rows dealt as Spark deals them); returns the steps and rows
    each epoch ran on this rank."""
    import os

    import pyarrow as pa
    import torch
    import torch.distributed as dist

    from hvd_magics.rank.api.shard import Shard

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    ids = list(range(rank, rows, size))
    table = pa.table({"x": pa.array([[float(i), 1.0] for i in ids], pa.list_(pa.float32()))})
    path = os.path.join(folder, f"part-{rank}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    shard = Shard(path, "train", rank, size, [len(range(r, rows, size)) for r in range(size)])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    ran = []
    for epoch in range(epochs):
        steps = seen = 0
        for (xb,) in shard.to_torch("x", batch_size=100, shuffle=True, seed=epoch):
            optimizer.zero_grad()
            model(xb).pow(2).mean().backward()
            optimizer.step()
            steps, seen = steps + 1, seen + len(xb)
        ran.append((steps, seen))
    return ran


def keras_3_fit():
    """A Keras 3 ``fit`` on whichever backend ``KERAS_BACKEND`` names."""
    import numpy as np

    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((8, 4)), np.zeros((8, 1)), verbose=0)
    return keras.backend.backend()


def trainers_given_a_shard(train):
    """What Hugging Face's and Lightning's Trainers do with a rank's shard of ``train`` (columns
    ``x``, a 4-float array, and ``y``): the refusals of the two that would deal it out again,
    then Lightning with ``use_distributed_sampler=False``: the rows it trained per epoch."""
    import os

    import pytorch_lightning as pl
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    refusals = []
    rows = [{"input_ids": torch.zeros(4, dtype=torch.long), "labels": 0}] * len(train)
    try:
        Trainer(model=BertForSequenceClassification(BertConfig(
                    vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                    intermediate_size=8, max_position_embeddings=8)),
                args=TrainingArguments(output_dir=os.getcwd(), report_to=[], use_cpu=True),
                train_dataset=rows)
    except ValueError as exc:
        refusals.append(f"{type(exc).__name__}: {exc}")

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.rows = 0

        def training_step(self, batch, _index):
            x, y = batch
            self.rows += len(x)
            return torch.nn.functional.mse_loss(self.layer(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def trainer(**kwargs):
        return pl.Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                          num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), accelerator="cpu",
                          max_epochs=1, enable_progress_bar=False, logger=False,
                          enable_checkpointing=False, enable_model_summary=False, **kwargs)

    loader = train.to_torch("x", "y", batch_size=8, shuffle=True, seed=0)
    try:
        trainer().fit(Linear(), loader)
    except ValueError as exc:
        refusals.append(f"{type(exc).__name__}: {exc}")
    module = Linear()
    trainer(use_distributed_sampler=False).fit(module, loader)
    return refusals, module.rows, len(train)


def rows_of_ranks(train):
    """Every rank's (rank, host name, the ``x`` of its shard's rows) as rank 0 gathers them."""
    import socket

    import torch.distributed as dist

    dist.init_process_group("gloo")
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, (dist.get_rank(), socket.gethostname(),
                                   sorted(int(x) for x in train.to_numpy("x"))))
    return views


def keep_host(value):
    """Keep ``value`` in the rank's namespace (a pool's next runs read it); this rank's host."""
    import socket

    from hvd_magics import rank_namespace

    rank_namespace()["kept"] = value
    return socket.gethostname()


def kept_value():
    from hvd_magics import rank_namespace

    return rank_namespace()["kept"]


def small_classifier():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def straggler_ddp(steps: int = 60, slow_rank: int | None = None, how: str = "compute",
                  slower: float = 0.3, base_s: float = 0.03, slow_from: int = 0,
                  engine: str = "torch", width: int = 64, every: int = 10,
                  jitter: float = 0.0):
    """A DDP (``engine="torch"``) or Horovod (``"horovod"``) loop over a ``DataLoader`` whose
    steps each do ``base_s`` seconds of compute; from step ``slow_from`` on, ``slow_rank``'s
    steps take ``slower`` times that longer, in compute or in its data loader (``how``; with
    ``"bursts"``, every third batch is three times as late). With
    ``how="cpu"`` a step's compute is a fixed amount of work instead (what ``base_s`` took the
    slowest rank at the start), each rank runs on a CPU of its own and ``slow_rank`` shares its
    CPU with a process that spins from step ``slow_from`` on. With ``how="stall"``,
    ``slow_rank`` sleeps 0.25 to 0.3 s in every ``every``-th step from ``slow_from`` on. Every
    rank's compute varies by ``jitter`` (a share, at random each step). Its gradients are
    ``width`` x 65 floats. Returns the steps each rank took."""
    import os
    import random
    import subprocess
    import sys
    import time

    import torch

    torch.set_num_threads(1)
    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    else:
        import horovod.torch as hvd

        hvd.init()
        rank = hvd.rank()
    extra = base_s * slower

    per_step = 0.0  # matrix products per base_s (a fixed amount of work), 0: seconds instead

    def busy(seconds: float) -> int:
        end, a, count = time.perf_counter() + seconds, torch.ones(32, 32), 0
        work = per_step * seconds / base_s
        while (count < work) if per_step else (time.perf_counter() < end):
            a, count = torch.tanh(a @ a), count + 1
        return count

    spinner = None
    if how == "cpu":  # the same work on every rank: the least any rank did in base_s
        least = torch.tensor([max(1.0, busy(0.3) * base_s / 0.3)])
        if engine == "torch":
            dist.all_reduce(least, op=dist.ReduceOp.MIN)
        else:
            least = hvd.allreduce(least, op=hvd.Min)
        per_step = float(least[0])
        cpu = sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]
        os.sched_setaffinity(0, {cpu})
        spin = (f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n"
                f"while os.getppid() == {os.getpid()}:\n    sum(range(100000))")

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return steps

        def __getitem__(self, i):
            if rank == slow_rank and how == "input" and i >= slow_from:
                time.sleep(extra)
            if rank == slow_rank and how == "bursts" and i >= slow_from and i % 3 == 2:
                time.sleep(3 * extra)  # every third batch late: as slow on average as "input"
            x = torch.randn(32, 64, generator=torch.Generator().manual_seed(i * 100 + rank))
            return x, x.sum(1, keepdim=True)

    net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, 1))
    if engine == "torch":
        model = torch.nn.parallel.DistributedDataParallel(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        model = net
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    taken = 0
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(Batches(), batch_size=None)):
        if how == "cpu" and rank == slow_rank and i == slow_from:
            spinner = subprocess.Popen([sys.executable, "-c", spin])
        if how == "stall" and rank == slow_rank and i >= slow_from and (i - slow_from) % every == 0:
            time.sleep(0.25 + 0.05 * random.random())
        busy(base_s * (1 + jitter * (2 * random.random() - 1))
             + (extra if rank == slow_rank and how == "compute" and i >= slow_from else 0.0))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        taken += 1
    if spinner is not None:
        spinner.kill()
    return taken


def fixed_work(steps: int = 800, work_ms: float = 1.0, slow_rank: int | None = None,
               more: float = 0.0, engine: str = "torch") -> int:
    """A DDP loop over a ``DataLoader`` whose steps each do a fixed amount of work (matrix
    products: as many as the slowest rank did in ``work_ms`` at the start), ``slow_rank``
    ``more`` of it (a share), as real training does: a CPU shared with other work runs it
    slower, unlike :func:`straggler_ddp`'s steps of a fixed time (``engine``: torch's only).
    Returns the products a step of this rank does."""
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.ones(48, 48)
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < 0.2:
        a, done = torch.tanh(a @ a), done + 1
    per_ms = torch.tensor([done / 200.0])
    dist.all_reduce(per_ms, op=dist.ReduceOp.MIN)
    count = max(1, int(per_ms.item() * work_ms * (1 + (more if rank == slow_rank else 0.0))))

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return steps

        def __getitem__(self, i):
            x = torch.randn(16, 32, generator=torch.Generator().manual_seed(i))
            return x, x.sum(1, keepdim=True)

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in torch.utils.data.DataLoader(Batches(), batch_size=None):
        b = a
        for _ in range(count):
            b = torch.tanh(b @ b)
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
    return count


def straggler_keras(steps: int = 60, slow_rank: int | None = None, how: str = "compute",
                    extra_s: float = 0.03, base_s: float = 0.0, eager: bool = False,
                    tape: bool = False, engine: str = "horovod"):
    """Horovod's Keras ``fit`` over a ``tf.data`` pipeline (or, with ``tape``, a loop of
    ``hvd.DistributedGradientTape`` steps in a ``tf.function``; with ``engine="tf"``, a Keras
    ``fit`` under ``MultiWorkerMirroredStrategy``, each worker its own data), in which
    ``slow_rank``'s steps take ``extra_s`` seconds longer: in its model (a layer that waits,
    ``how="compute"``) or in its pipeline (``how="input"``: it waits before each batch, as a
    slow store makes it). Every rank's model waits ``base_s`` seconds a step besides. Returns
    the steps run."""
    import json
    import os
    import time

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    if engine == "tf":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    else:
        import horovod.tensorflow.keras as hvd

        hvd.init()
        rank = hvd.rank()
    slow = rank == slow_rank
    wait_s = base_s + (extra_s if slow and how == "compute" else 0.0)

    def pause(x):
        time.sleep(wait_s)
        return x

    x = np.random.default_rng(rank).normal(size=(32 * steps, 16)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(32)
    if slow and how == "input":
        data = data.apply(testing.sleep(int(extra_s * 1e6)))
    if engine == "tf":
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        data = data.with_options(options)

    class Wait(tf.keras.layers.Layer):
        def call(self, inputs):
            if wait_s:
                inputs = tf.numpy_function(pause, [inputs], tf.float32, stateful=True)
                inputs.set_shape([None, 16])
            return inputs

    def build():
        return tf.keras.Sequential([tf.keras.Input((16,)), Wait(), tf.keras.layers.Dense(16),
                                    tf.keras.layers.Dense(1)])

    if engine == "tf":
        with strategy.scope():
            model = build()
            model.compile(tf.keras.optimizers.SGD(0.001), "mse")
        batches = []
        model.fit(data, verbose=0, callbacks=[tf.keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: batches.append(batch))])
        return len(batches)
    model = build()
    if not tape:
        model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.001)), "mse",
                      run_eagerly=eager)
        history = model.fit(data, verbose=0,
                            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        return len(history.epoch) and steps
    optimizer = tf.keras.optimizers.SGD(0.001)
    import horovod.tensorflow as hvd_tf

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as grad_tape:
            loss = tf.reduce_mean((model(features) - labels) ** 2)
        grad_tape = hvd_tf.DistributedGradientTape(grad_tape)
        grads = grad_tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    taken = 0
    for features, labels in data:
        step(features, labels)
        if taken == 0:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
        taken += 1
    return taken


def straggler_keras_3_loop(steps: int = 60, slow_rank: int | None = None,
                           how: str = "compute", extra_s: float = 0.03):
    """A Keras 3 model in a custom loop of ``strategy.run`` steps under
    ``MultiWorkerMirroredStrategy`` (Keras 3's ``fit`` does not train there), in which
    ``slow_rank``'s steps take ``extra_s`` seconds longer: in its replica's step
    (``how="compute"``) or in its ``tf.data`` pipeline (``"input"``). Returns the steps run."""
    import time

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = strategy.cluster_resolver.task_id
    slow = rank == slow_rank
    x = np.random.default_rng(rank).normal(size=(32 * steps, 16)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(
        32 * strategy.num_replicas_in_sync)  # a global batch: each worker takes 32 of it
    if slow and how == "input":
        data = data.apply(testing.sleep(int(extra_s * 1e6)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    batches = strategy.experimental_distribute_dataset(data.with_options(options))
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.001)
        optimizer.build(model.trainable_variables)

    def pause(value):
        time.sleep(extra_s)
        return value

    @tf.function
    def step(xb, yb):
        def replica(xb, yb):
            if slow and how == "compute":
                xb = tf.numpy_function(pause, [xb], tf.float32, stateful=True)
                xb.set_shape([None, 16])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(replica, (xb, yb))

    taken = 0
    for xb, yb in batches:
        step(xb, yb)
        taken += 1
    return taken


def pick_local_rank_gpu():
    """``torch.cuda.set_device(LOCAL_RANK)`` as a rank that shares its host's one GPU meets it
    (a stand-in: no GPU here; the message is the one torch 2.11 gave on an H200 with np=-2)."""
    import os

    if int(os.environ["LOCAL_RANK"]) >= 1:
        raise RuntimeError("CUDA error: invalid device ordinal\nGPU device may be out of range, "
                           "do you have enough GPUs?")
    return "ok"


def keras_mwms_spot(order_at: int = 12, epochs: int = 3, steps: int = 16):
    """A Keras ``fit`` under ``MultiWorkerMirroredStrategy`` (Adam, a ``BatchNormalization``,
    whose moving statistics are synchronised on read), nothing of preemption in it. On the
    first attempt every worker gets the driver's preemption order after global step
    ``order_at`` (as the supervisor hands it on: :func:`hvd_magics.rank.api.preemption.on_order`),
    for the call two batches on. Returns the attempt, the global steps it ran and the weights
    (as lists)."""
    import json

    import numpy as np
    import tensorflow as tf

    from hvd_magics import checkpoint
    from hvd_magics.rank.api import preemption

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((4,)),
                                     tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.BatchNormalization(),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(steps * 16, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(16)
    attempt, ran = checkpoint.attempt(), []

    class Order(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            ran.append(self.epoch * steps + batch + 1)
            if attempt == 0 and ran[-1] == order_at:  # the fit's own asks come after this one
                at = preemption._state.calls + 3  # noqa: SLF001 - the driver's pick
                preemption.on_order(json.dumps({"at": at, "notice": "executor 1 is going"}))

    model.fit(data, epochs=epochs, verbose=0, callbacks=[Order()])
    return attempt, ran, [w.tolist() for w in model.get_weights()]


class SlowSave:
    """Part of a checkpoint that takes ``seconds`` to pickle (a large model's state); it is
    read back as an empty dict."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self):
        import time

        time.sleep(self.seconds)
        return (dict, ())


def ddp_slow_save_on_notice(save_s: float, order_after: int = 5, steps: int = 20):
    """A DDP loop that saves when ``checkpoint.preempting()`` says so, rank 0's save taking
    ``save_s``; on the first attempt every rank gets the driver's preemption order after step
    ``order_after`` (as its supervisor hands it on), for the call two steps on. Returns the
    attempt and the step it started from."""
    import json
    import time

    import torch
    import torch.distributed as dist

    from hvd_magics import checkpoint
    from hvd_magics.rank.api import preemption

    dist.init_process_group("gloo")
    found = checkpoint.latest()
    start = 0 if found is None else found[1]
    total = torch.zeros(1)
    for step in range(start, steps):
        dist.all_reduce(total)
        time.sleep(0.02)
        if step == order_after and checkpoint.attempt() == 0:
            at = preemption._state.calls + 3  # noqa: SLF001 - the driver's pick
            preemption.on_order(json.dumps({"at": at, "notice": "executor 1 is going"}))
        if checkpoint.preempting():
            checkpoint.save({"state": SlowSave(save_s)}, step + 1)
    return checkpoint.attempt(), start


def keras_mwms_history():
    """A Keras ``fit`` under ``MultiWorkerMirroredStrategy`` whose ``History`` is the job's value
    (as a cell ending in ``model.fit(...)`` has it): pickling it pickles the model, whose
    metrics' variables are synced on read (an all-reduce of every worker)."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
        model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model.fit(x, (x[:, 0] > 0).astype("int64"), batch_size=32, verbose=0)


def steps_kept(steps=20, kill_on=None, engine="torch", every=None, steps_file=None, width=16,
               plain=False, kill_keeper=None, wipe=False, step_s=0.0, mark_pid=None):
    """A small network trained ``steps`` steps with Adam from seeded data under DDP
    (``engine="torch"``) or Horovod, keeping every step in the hosts' memory
    (``checkpoint.keep``) and resuming from ``checkpoint.latest``; ``every``: also saves a
    checkpoint file every so many steps. ``kill_on``: ``(step, attempts)``, rank 1 SIGKILLs
    itself right after keeping that step (its copy may be under way) on those attempts;
    ``steps_file``: every rank appends ``"<attempt> <step>"`` to ``<steps_file>-<rank>`` for each
    step it takes; ``plain``: keeps and resumes state dicts rather than the modules;
    ``kill_keeper``: a file; on the first attempt, after step 3, rank 0 SIGKILLs its host's
    keeper and writes its pid there; ``wipe``: at that step, rank 0 removes its host's kept steps
    (the host's memory lost with rank 1); ``step_s``: seconds each step takes more;
    ``mark_pid``: ``(step, folder)``, on the first attempt rank 1 writes its pid to
    ``folder/rank1`` after that step (for the test to kill its executor) and trains on. Returns
    the weights (as lists, bit for bit), the optimizer's first moment's sum, the attempt, the step
    it started from and when (``time.time()``) its first step ended."""
    import json
    import os
    import signal
    import time

    import torch

    from hvd_magics import checkpoint
    from hvd_magics.common.kept_steps import host_folder, keep_root

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    rank, forward, optimizer = _data_parallel(model, optimizer, engine)
    state = {"model": model, "optimizer": optimizer, "next": 0}
    if plain:
        found = checkpoint.latest()
        if found is not None:
            model.load_state_dict(found[0]["model"])
            optimizer.load_state_dict(found[0]["optimizer"])
    else:
        found = checkpoint.latest(state)
    start = 0 if found is None else found[1] + 1
    first_step_at = None
    for step in range(start, steps):
        time.sleep(step_s)
        data = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(8, 4, generator=data)
        optimizer.zero_grad()
        loss = ((forward(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        optimizer.step()
        if steps_file:
            with open(f"{steps_file}-{rank}", "a") as out:
                out.write(f"{checkpoint.attempt()} {step}\n")
        kept = {"model": model.state_dict(), "optimizer": optimizer.state_dict()} if plain \
            else state
        checkpoint.keep(kept, step)
        if every and (step + 1) % every == 0:
            checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                            step)
        if kill_keeper and rank == 0 and step == 3 and checkpoint.attempt() == 0:
            from hvd_magics.rank.api import keeping
            from hvd_magics.rank.step_keeper import running_keeper

            keeping.wait()
            keeping.host_keeper(keeping.job_part_folder())  # started by now, or now
            found_keeper = running_keeper(host_folder(keep_root(),
                                                      os.environ.get("HVD_MAGICS_RANK_HOST")))
            if found_keeper:
                os.kill(found_keeper[0], signal.SIGKILL)
            with open(kill_keeper, "w") as out:
                json.dump(found_keeper, out)
        if wipe and rank == 0 and step == kill_on[0] and checkpoint.attempt() in kill_on[1]:
            import shutil

            from hvd_magics.rank.api import keeping
            keeping.wait()
            shutil.rmtree(keeping.job_part_folder())
        if kill_on and rank == 1 and step == kill_on[0] and checkpoint.attempt() in kill_on[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        if mark_pid and rank == 1 and step == mark_pid[0] and not checkpoint.attempt():
            with open(os.path.join(mark_pid[1], "rank1"), "w") as out:
                out.write(str(os.getpid()))
        first_step_at = first_step_at or time.time()
    moments = optimizer.state_dict()["state"]
    return {"weights": [p.detach().tolist() for p in model.parameters()],
            "moment": float(sum(s["exp_avg"].sum() for s in moments.values())),
            "attempt": checkpoint.attempt(), "start": start, "first_step_at": first_step_at}


def lightning_kept(folder: str, steps: int = 40, kill_at: int | None = None,
                   save_at: int | None = None, ckpt_path: str | None = None):
    """A Lightning ``Trainer`` of ``steps`` steps on the job's topology, as written, with nothing
    about checkpoints (the job may keep its steps: ``keep_steps=True``); its module appends
    ``"<attempt> <global step>"`` to ``folder/steps-<rank>`` after each batch. On the first
    attempt: with ``save_at``, every rank saves Lightning's own checkpoint of that step (before
    its next batch, where keeping keeps it) to ``folder/own.ckpt``; with ``kill_at``, rank 1
    SIGKILLs itself before the batch after that global step (after that save). ``ckpt_path`` is
    given to ``fit``. Returns the
    attempt, the first global step it took, the last, and the weights."""
    import os
    import signal

    import pytorch_lightning as pl
    import torch

    from hvd_magics import checkpoint

    class Logged(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.first = None

        def training_step(self, batch, _index):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_batch_start(self, batch, batch_idx):
            step, rank = self.trainer.global_step, self.trainer.global_rank
            if step == save_at and not checkpoint.attempt():
                self.trainer.save_checkpoint(os.path.join(folder, "own.ckpt"))
            if step == kill_at and rank == 1 and not checkpoint.attempt():
                os.kill(os.getpid(), signal.SIGKILL)  # every rank past its hooks' keep

        def on_train_batch_end(self, outputs, batch, batch_idx):
            step = self.trainer.global_step
            self.first = self.first or step
            rank = self.trainer.global_rank
            with open(os.path.join(folder, f"steps-{rank}"), "a") as out_file:
                out_file.write(f"{checkpoint.attempt()} {step}\n")

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 4), torch.randn(512, 1))
    trainer = pl.Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                         num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), accelerator="cpu",
                         max_steps=steps, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False)
    module = Logged()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    return (checkpoint.attempt(), module.first, trainer.global_step,
            [p.detach().tolist() for p in module.parameters()])


def fsdp_kept(steps: int = 16, kill_at: int | None = None, width: int = 64,
              steps_file: str | None = None, step_s: float = 0.0):
    """An FSDP2 model of two layers trained ``steps`` steps of Adam on data seeded by the step,
    keeping every step in the hosts' memory (each rank its part, and its peer host a copy) and
    resuming from ``checkpoint.latest(state)``; rank 1 of the first attempt SIGKILLs itself right
    after keeping step ``kill_at``; ``steps_file``: each rank appends ``"<attempt> <step>"`` to
    ``<steps_file>-<rank>`` for each step it takes; ``step_s``: seconds each step takes more.
    Rank 0 returns a digest of the full weights and of Adam's full state, where it started, and
    when its first step ended."""
    import hashlib
    import os
    import signal
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    found = checkpoint.latest(state)
    start = 0 if found is None else found[1] + 1
    rank, size = dist.get_rank(), dist.get_world_size()
    first_step_at = None
    for step in range(start, steps):
        time.sleep(step_s)
        batch = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
        part = batch[rank * 8 // size:(rank + 1) * 8 // size]
        optimizer.zero_grad()
        (model(part).pow(2).sum() / 8).backward()
        optimizer.step()
        state["step"] = step
        if steps_file:
            with open(f"{steps_file}-{rank}", "a") as out:
                out.write(f"{checkpoint.attempt()} {step}\n")
        checkpoint.keep(state, step)
        if step == kill_at and rank == 1 and checkpoint.attempt() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        first_step_at = first_step_at or time.time()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    moments = get_optimizer_state_dict(model, optimizer, options=full).get("state", {})

    def digest(tensors: dict) -> str:
        hashed = hashlib.sha256()
        for name in sorted(tensors):
            hashed.update(tensors[name].detach().float().numpy().tobytes())
        return hashed.hexdigest()[:16]

    flat = {f"{name}.{key}": value for name, entry in moments.items()
            for key, value in entry.items() if torch.is_tensor(value)}
    return {"weights": digest(weights), "moments": digest(flat), "start": start,
            "first_step_at": first_step_at}


def keras_kept(folder: str, epochs: int = 4, steps: int = 20, kill_at: int | None = None):
    """A Keras ``fit`` under Horovod (tf_keras) of ``epochs`` epochs of ``steps`` batches of
    seeded data, unshuffled, with Adam, with nothing of checkpoints in it (the job keeps its
    steps: ``keep_steps=True``); each rank appends ``"<attempt> <global step>"`` to
    ``folder/steps-<rank>`` per batch, and on the first attempt rank 1 SIGKILLs itself after
    global step ``kill_at``. Returns the weights (as lists) and the attempt."""
    import os
    import signal

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    from hvd_magics import checkpoint

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(steps * 8, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8),
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), "mse")
    attempt = checkpoint.attempt()

    class Steps(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = self.epoch * steps + batch + 1
            with open(os.path.join(folder, f"steps-{hvd.rank()}"), "a") as out:
                out.write(f"{attempt} {step}\n")
            if step == kill_at and hvd.rank() == 1 and not attempt:
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Steps()])
    return [w.tolist() for w in model.get_weights()], attempt


def horovod_one_late(release: str, late: int):
    """Every rank allreduces its rank, but rank ``late`` first waits until the file ``release``
    exists (the others wait for it in the allreduce); rank 0 returns the sum, the size and each
    rank's host and local rank."""
    import os
    import socket
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == late:
        while not os.path.exists(release):
            time.sleep(0.05)
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    places = hvd.allgather_object((socket.gethostname(), hvd.local_rank(), hvd.local_size()))
    return {"sum": total, "size": hvd.size(), "places": places}
