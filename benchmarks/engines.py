"""Our torch engine against pyspark's TorchDistributor, side by side on one warm local[2] session.

Two DDP (Gloo) jobs, each run by three candidates in alternating order, ``--runs`` times:
  ours      hvd_magics.HorovodRunner(np=2, engine="torch").run(fn)
  dropin    hvd_magics.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)
  pyspark   pyspark.ml.torch.distributor.TorchDistributor(the same arguments).run(fn)
and, after them (it holds both task slots while it lives), a warm pool:
  pool      HorovodPool(np=2, engine="torch").run(fn), the process group kept across runs
Jobs:
  trivial   init_process_group, one all_reduce, return: the launch cost (wall time of the call)
  mlp       an MNIST-shaped MLP (784-256-10) on generated data, DDP, 3 epochs of 128 steps of
            64 rows per rank; rank 0 times epochs 2 and 3 itself: steps per second
Usage: .venv/bin/python benchmarks/engines.py [--runs 3]
Last line: engines ours_trivial_s=<s> pyspark_trivial_s=<s> pool_trivial_s=<s> launch_ratio=<x>
dropin_launch_ratio=<x> steps_ratio=<x> (ratios: ours over pyspark, medians of per-run ratios
with their min and max)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from pairs import in_turn, local_session, pair_ratios, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def trivial():
    """Join the process group (once: a warm pool keeps it), one all_reduce, return."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    return {"value": value.item()}


def mlp(epochs: int = 3, steps: int = 128, batch: int = 64):
    """DDP training of a 784-256-10 MLP; rank 0's steps per second over epochs 2.. ."""
    import time

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.rand(steps * batch, 784, generator=generator)
    y = torch.randint(0, 10, (steps * batch,), generator=generator)
    began = None
    for epoch in range(epochs):
        if epoch == 1:
            began = time.perf_counter()
        for step in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[step * batch:(step + 1) * batch]),
                                                     y[step * batch:(step + 1) * batch])
            loss.backward()
            optimizer.step()
    return {"steps_per_s": (epochs - 1) * steps / (time.perf_counter() - began),
            "loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor as PysparkDistributor

    from hvd_magics import HorovodPool, HorovodRunner, TorchDistributor

    local_session("engines")
    candidates = {
        "ours": lambda fn: HorovodRunner(np=2, engine="torch").run(fn),
        "dropin": lambda fn: TorchDistributor(num_processes=2, local_mode=False,
                                              use_gpu=False).run(fn),
        "pyspark": lambda fn: PysparkDistributor(num_processes=2, local_mode=False,
                                                 use_gpu=False).run(fn),
    }
    wall: dict[tuple[str, str], list[float]] = {}
    speed: dict[str, list[float]] = {name: [] for name in candidates}
    for name, run_job in candidates.items():  # warm up: Python workers, imports, page cache
        run_job(trivial)
    for run in range(args.runs):
        for job in (trivial, mlp):
            for name in in_turn(run, list(candidates)):
                began = time.perf_counter()
                result = candidates[name](job)
                took = time.perf_counter() - began
                wall.setdefault((name, job.__name__), []).append(took)
                if job is mlp:
                    speed[name].append(result["steps_per_s"])
                print(f"run {run} {job.__name__:7s} {name:8s} {took:6.2f} s"
                      + (f", {result['steps_per_s']:6.1f} steps/s on rank 0" if job is mlp
                         else ""), flush=True)
    with HorovodPool(np=2, engine="torch") as pool:
        pool.run(trivial)  # the first run joins the process group
        for run in range(args.runs):
            for job in (trivial, mlp):
                began = time.perf_counter()
                result = pool.run(job)
                took = time.perf_counter() - began
                wall.setdefault(("pool", job.__name__), []).append(took)
                if job is mlp:
                    speed.setdefault("pool", []).append(result["steps_per_s"])
                print(f"run {run} {job.__name__:7s} pool     {took:6.2f} s"
                      + (f", {result['steps_per_s']:6.1f} steps/s on rank 0" if job is mlp
                         else ""), flush=True)
    for name in [*candidates, "pool"]:
        print(f"{name:8s} trivial median {statistics.median(wall[name, 'trivial']):5.2f} s, mlp "
              f"median {statistics.median(wall[name, 'mlp']):5.2f} s at "
              f"{statistics.median(speed[name]):6.1f} steps/s")
    launch = pair_ratios(wall["ours", "trivial"], wall["pyspark", "trivial"])
    print(f"engines ours_trivial_s={statistics.median(wall['ours', 'trivial']):.2f} "
          f"pyspark_trivial_s={statistics.median(wall['pyspark', 'trivial']):.2f} "
          f"pool_trivial_s={statistics.median(wall['pool', 'trivial']):.3f} "
          f"launch_ratio={launch[0]:.3f} launch_ratio_min={launch[1]:.3f} "
          f"launch_ratio_max={launch[2]:.3f} "
          + ratio_text("dropin_launch_ratio", wall["dropin", "trivial"],
                       wall["pyspark", "trivial"]) + " "
          + ratio_text("mlp_wall_ratio", wall["ours", "mlp"], wall["pyspark", "mlp"]) + " "
          + ratio_text("steps_ratio", speed["ours"], speed["pyspark"]))


if __name__ == "__main__":
    main()
