"""Our DeepspeedTorchDistributor drop-in against pyspark's, side by side on one warm local[2]
session (DeepSpeed's CPU accelerator and gloo: no GPU here).

Both run with pyspark's arguments ``numGpus=1, nnodes=2, localMode=False, useGpu=False`` (a rank
per Spark task), in alternating order, ``--runs`` times:
  ours      hvd_magics.DeepspeedTorchDistributor(...).run(fn)
  pyspark   pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor(...).run(fn)
Jobs:
  trivial   deepspeed.initialize of a linear model, one step, return: the launch cost
  train     an MNIST-shaped MLP (784-256-10) on generated data, 96 DeepSpeed steps of 64 rows per
            rank; rank 0 times the last 64 itself: steps per second
Usage: .venv/bin/python benchmarks/deepspeed_dropin.py [--runs 3]
Last line: deepspeed ours_trivial_s=<s> pyspark_trivial_s=<s> launch_ratio=<x> (min, max)
train_wall_ratio=<x> steps_ratio=<x> (ours over pyspark, medians of per-run ratios)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from pairs import jobs_in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def trivial():
    """Initialise DeepSpeed on a linear model, take one step, return the world size."""
    import deepspeed
    import torch

    model = torch.nn.Linear(4, 1)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        config={"train_micro_batch_size_per_gpu": 8})
    loss = engine(torch.randn(8, 4)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    return {"world": engine.world_size}


def train(steps: int = 96, timed: int = 64, batch: int = 64):
    """DeepSpeed training of a 784-256-10 MLP; rank 0's steps per second over the last
    ``timed`` steps."""
    import time

    import deepspeed
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        config={"train_micro_batch_size_per_gpu": batch})
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    began = 0.0
    for step in range(steps):
        if step == steps - timed:
            began = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    return {"steps_per_s": timed / (time.perf_counter() - began)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from pyspark.ml.deepspeed.deepspeed_distributor import \
        DeepspeedTorchDistributor as PysparkDistributor

    from hvd_magics import DeepspeedTorchDistributor

    local_session("deepspeed")
    layout = {"numGpus": 1, "nnodes": 2, "localMode": False, "useGpu": False}
    candidates = {"ours": lambda fn: DeepspeedTorchDistributor(**layout).run(fn),
                  "pyspark": lambda fn: PysparkDistributor(**layout).run(fn)}
    for run_job in candidates.values():  # warm up: Python workers, imports, DeepSpeed's ops
        run_job(trivial)
    wall: dict[tuple[str, str], list[float]] = {}
    speed: dict[str, list[float]] = {name: [] for name in candidates}
    jobs_in_turn(candidates, (trivial, train), args.runs, train, wall, speed)
    for name in candidates:
        print(f"{name:8s} trivial median {statistics.median(wall[name, 'trivial']):5.2f} s, "
              f"train median {statistics.median(wall[name, 'train']):5.2f} s at "
              f"{statistics.median(speed[name]):6.1f} steps/s")
    print(f"deepspeed ours_trivial_s={statistics.median(wall['ours', 'trivial']):.2f} "
          f"pyspark_trivial_s={statistics.median(wall['pyspark', 'trivial']):.2f} "
          + ratio_text("launch_ratio", wall["ours", "trivial"], wall["pyspark", "trivial"]) + " "
          + ratio_text("train_wall_ratio", wall["ours", "train"], wall["pyspark", "train"]) + " "
          + ratio_text("steps_ratio", speed["ours"], speed["pyspark"]))


if __name__ == "__main__":
    main()
