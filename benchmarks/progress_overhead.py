"""Cost of live progress: a Keras loop of many small steps, and a flood of output in a real kernel.

1. overhead: np=2 ranks on a local[2] SparkSession train a small tf.keras model (many tiny
   steps) with progress reporting on and off (HVD_MAGICS_KERAS_PROGRESS=0), interleaved,
   ``--runs`` times each; the time of ``model.fit`` on rank 0 (its own clock) is compared.
2. flood: in a real Jupyter kernel, ``%%horovod np=-4`` ranks print ``--lines`` lines per second
   each for ``--seconds`` s; then how long the kernel takes to answer a new cell, its memory
   before and after, and whether every line reached the log file.

3. torch: np=2 ``--engine torch`` ranks run a plain DDP loop of many tiny steps (a
   DistributedSampler, ``set_epoch``, ``backward``) with the loop's progress inferred and without
   (HVD_MAGICS_LOOP_PROGRESS=0), interleaved; then the direct cost of one step's hooks (DDP
   forward and ``backward``) and of one step of the Hugging Face and Lightning callbacks.

Usage: .venv/bin/python benchmarks/progress_overhead.py [--runs 5] [--lines 5000] [--seconds 10]
Last line: progress_overhead ratio=<with/without> ratio_min=<x> ratio_max=<x>
torch_ratio=<with/without> torch_ratio_min=<x> torch_ratio_max=<x>
(the medians of per-run ratios, with/without in alternating order)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from pairs import in_turn, ratio_text, local_session  # benchmarks/pairs.py

from hvd_magics.protocol import ENV_KERAS_PROGRESS, ENV_LOOP_PROGRESS

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


#: Training steps timed per run: 2 epochs of 2,000 steps of 4 samples.
STEPS = 4000


def keras_many_steps(steps: int = 2000):
    import time

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # 2 ranks on 2 cores: less noise
    tf.config.threading.set_inter_op_parallelism_threads(1)
    x = np.random.default_rng(hvd.rank()).normal(size=(steps * 4, 16)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:64], y[:64], batch_size=4, epochs=1, verbose=0)  # warm-up: tracing, allreduce
    start = time.perf_counter()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return time.perf_counter() - start


def ddp_many_steps(rows: int = 8000, batch: int = 4):
    """A plain DDP loop (no line of ours): 2 epochs of ``rows / 2 / batch`` steps per rank; rank
    0's own time of the two epochs after a warm-up pass."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(rows, 16), torch.randint(0, 2, (rows,)))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
    start = 0.0
    for epoch in range(3):  # the first: warm-up
        if epoch == 1:
            start = time.perf_counter()
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    return time.perf_counter() - start


def torch_per_step_costs(calls: int = 100_000) -> dict[str, float]:
    """Seconds of one step's work in each torch hook, called directly: the DDP loop's (forward
    and backward), Hugging Face's callback (on_step_end) and Lightning's (on_train_batch_end)."""
    import torch
    import pytorch_lightning as pl
    from transformers import TrainerCallback

    from hvd_magics.rank.api import progress
    from hvd_magics.rank.integrations import hugging_face as hf_progress
    from hvd_magics.rank.integrations import lightning as lightning_progress
    from hvd_magics.rank.integrations import plain_loops as loop_progress

    loss, batch = torch.tensor(0.5, requires_grad=True), (torch.zeros(4, 16),)
    costs = {}
    progress.begin_epoch(1, 1, calls, 4, inferred=True)
    loop_progress._loop.epoch = 1
    start = time.perf_counter()
    for _ in range(calls):
        loop_progress.on_step(batch)
        loop_progress.on_backward(loss)
    costs["ddp loop hooks"] = (time.perf_counter() - start) / calls
    loop_progress.reset()
    hf = hf_progress._callback_class(TrainerCallback)()
    start = time.perf_counter()
    for _ in range(calls):
        hf.on_step_end(None, None, None)
    costs["Hugging Face callback"] = (time.perf_counter() - start) / calls

    class Trainer:
        num_training_batches, max_epochs, current_epoch, train_dataloader = calls, 1, 0, None

    lightning = lightning_progress._callback_class(pl.Callback)()
    lightning.on_train_epoch_start(Trainer(), None)
    start = time.perf_counter()
    for index in range(calls):
        lightning.on_train_batch_end(Trainer(), None, {"loss": loss}, batch, index)
    costs["Lightning callback"] = (time.perf_counter() - start) / calls
    return costs


def torch_overhead(runs: int) -> str:
    from hvd_magics import HorovodRunner
    from hvd_magics.launch.payload import serialize_job

    spark = local_session("progress_overhead_torch")
    on, off = [], []
    for run in range(runs):
        for label, times, env in in_turn(run, (("with", on, {}),
                                               ("without", off, {ENV_LOOP_PROGRESS: "0"}))):
            record = HorovodRunner(np=2, engine="torch", env=env).run_payload(
                serialize_job(ddp_many_steps, {}), views=[])
            times.append(record.value)
            print(f"run {run + 1} torch {label:<8} loop {record.value:.3f} s", flush=True)
    spark.stop()
    step_s = statistics.median(off) / 2000  # 2 epochs of 1,000 steps
    for name, cost in torch_per_step_costs().items():
        print(f"direct: {name}: {cost * 1e6:.2f} us a step; a step of this loop takes "
              f"{step_s * 1e3:.2f} ms -> estimated ratio {1 + cost / step_s:.4f}")
    return ratio_text("torch_ratio", on, off)


FLOOD_CELL = """%%horovod np=-4 -q
import time

rank = int(__import__("os").environ["HOROVOD_RANK"])
end = time.monotonic() + {seconds}
sent = 0
while time.monotonic() < end:
    for _ in range({lines} // 100):
        print(f"rank {{rank}} line {{sent}}")
        sent += 1
    time.sleep(0.01)
sent
"""


def per_step_cost(calls: int = 200_000) -> float:
    """Seconds one on_train_batch_end call of the progress callback costs (Keras 2 logs)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras

    from hvd_magics.rank.integrations.keras import _callback_class

    callback = _callback_class(tf_keras.callbacks.Callback)(batch_size=4)
    callback.set_params({"epochs": 1, "steps": calls})
    logs = {"loss": tf.constant(0.5)}
    callback.on_epoch_begin(0)
    start = time.perf_counter()
    for batch in range(calls):
        callback.on_train_batch_end(batch, logs)
    return (time.perf_counter() - start) / calls


def overhead(runs: int) -> float:
    from hvd_magics import HorovodRunner

    spark = local_session("progress_overhead")
    on, off = [], []
    for run in range(runs):
        for label, times, env in in_turn(run, (("with", on, {}),
                                               ("without", off, {ENV_KERAS_PROGRESS: "0"}))):
            from hvd_magics.launch.payload import serialize_job

            record = HorovodRunner(np=2, env=env).run_payload(serialize_job(keras_many_steps, {}),
                                                               views=[])
            times.append(record.value)
            print(f"run {run + 1} {label:<8} fit {record.value:.3f} s", flush=True)
    spark.stop()
    ratio = ratio_text("ratio", on, off)
    print(f"medians: with {statistics.median(on):.3f} s, without {statistics.median(off):.3f} s; "
          f"fastest: with {min(on):.3f} s, without {min(off):.3f} s "
          f"(ratio of fastest {min(on) / min(off):.3f})")
    step_s = statistics.median(off) / STEPS
    cost = per_step_cost()
    print(f"direct: one callback call costs {cost * 1e6:.2f} us; a step takes {step_s * 1e3:.2f} ms "
          f"without progress -> estimated ratio {1 + cost / step_s:.4f}")
    return ratio


def flood(lines: int, seconds: int) -> None:
    import psutil
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        kernel = psutil.Process(manager.provisioner.process.pid)
        client.execute_interactive("%load_ext hvd_magics", timeout=60)
        rss_before = kernel.memory_info().rss
        start = time.monotonic()
        reply = client.execute_interactive(FLOOD_CELL.format(lines=lines, seconds=seconds),
                                           timeout=seconds + 120, output_hook=lambda msg: None)
        flood_s = time.monotonic() - start
        t0 = time.monotonic()
        client.execute_interactive("1 + 1", timeout=30, output_hook=lambda msg: None)
        answer_s = time.monotonic() - t0
        rss_after = kernel.memory_info().rss
        log_lines = {}
        client.execute_interactive(
            "import hvd_magics; _p = hvd_magics.last_run().log_path", timeout=30)
        msgs = []
        client.execute_interactive("print(_p)", timeout=30, output_hook=msgs.append)
        path = "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream").strip()
        with open(path) as fh:
            for line in fh:
                parts = line.split(" ", 3)
                if len(parts) == 4 and parts[2] == "rank":
                    log_lines[parts[1]] = log_lines.get(parts[1], 0) + 1
        total = sum(log_lines.values())
        print(f"flood: 4 ranks x ~{lines} lines/s x {seconds} s -> {total} lines in the log "
              f"({total / seconds:.0f} lines/s), cell took {flood_s:.1f} s, status {reply['content']['status']}")
        print(f"flood: kernel answered the next cell in {answer_s:.3f} s; kernel RSS "
              f"{rss_before / 2**20:.0f} MiB before, {rss_after / 2**20:.0f} MiB after")
        missing = _missing(path)
        print(f"flood: lines missing from the log (gaps in any rank's numbering): {missing}")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _missing(path: str) -> int:
    seen: dict[str, list[int]] = {}
    with open(path) as fh:
        for line in fh:
            parts = line.rstrip("\n").split(" ")
            if len(parts) == 6 and parts[2] == "rank" and parts[4] == "line":
                seen.setdefault(parts[3], []).append(int(parts[5]))
    return sum(max(nums) + 1 - len(set(nums)) for nums in seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=5000, help="lines per second per rank")
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    flood(args.lines, args.seconds)
    ratio = overhead(args.runs)
    torch_ratio = torch_overhead(args.runs)
    print(f"progress_overhead {ratio} {torch_ratio}")


if __name__ == "__main__":
    main()
