"""Horovod's background loop while a rank has nothing to negotiate: waiting for the next
enqueue (our build's default, change 11 of ``hvd_magics.horovod.patches``) against a cycle
every millisecond (``HVD_MAGICS_HOROVOD_IDLE_WAIT_MS=0``: Horovod's own loop).

np=-2 ranks on the driver, the two loops interleaved, ``--runs`` times each. Rank 0 reports:
  idle      the process's CPU seconds (every thread) while its Python sleeps ``--idle`` s after
            ``hvd.init()`` (a warm pool between cells, a rank waiting for its data)
  latency   the median time of an ``hvd.allreduce`` of one float, ranks in step (500 of them)
  train     samples a second of a small PyTorch MLP under Horovod's DistributedOptimizer (256 ->
            ``--hidden`` (512) -> 10, batch 64, 300 steps after 20 of warm-up, one thread a rank)
  cpu/step  the process's CPU seconds per training step
The ratios are the waiting loop's over the cycling one's, run by run (the median, then min and
max). On a Horovod built without change 11 both candidates are the same loop: ratios near 1.

Usage: .venv/bin/python benchmarks/horovod_loop.py [--runs 3] [--idle 5] [--hidden 512]
Last line: horovod_loop idle=<ratio> latency=<ratio> train=<ratio> cpu_step=<ratio>, each with
its _min and _max
"""
from __future__ import annotations

import argparse
import statistics

from pairs import in_turn, ratio_text  # benchmarks/pairs.py

from hvd_magics.protocol import ENV_HOROVOD_IDLE_WAIT


def measure(idle_wait: str | None, idle_s: float, hidden: int) -> dict:
    import os
    import resource
    import time

    os.environ.pop(ENV_HOROVOD_IDLE_WAIT, None)  # read by the loop's first cycle, after init
    if idle_wait is not None:
        os.environ[ENV_HOROVOD_IDLE_WAIT] = idle_wait
    import horovod.torch as hvd
    import torch

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    hvd.init()
    torch.set_num_threads(1)
    one = torch.ones(1)
    hvd.allreduce(one, name="warm")
    began = cpu()
    time.sleep(idle_s)
    idle = cpu() - began
    times = []
    for _ in range(500):
        start = time.perf_counter()
        hvd.allreduce(one, name="latency")
        times.append(time.perf_counter() - start)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    steps, began, start = 300, cpu(), time.perf_counter()
    for _ in range(steps):
        step()
    wall = time.perf_counter() - start
    return {"idle": idle, "latency": statistics.median(times),
            "train": steps * 64 * hvd.size() / wall, "cpu_step": (cpu() - began) / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width")
    args = parser.parse_args()
    from hvd_magics import HorovodRunner

    found: dict[str, list[dict]] = {"waits": [], "cycles": []}
    for run in range(args.runs):
        for label in in_turn(run, ("waits", "cycles")):
            figures = HorovodRunner(np=-2).run(measure, idle_wait=None if label == "waits" else "0",
                                               idle_s=args.idle, hidden=args.hidden)  # rank 0's
            found[label].append(figures)
            print(f"run {run} {label}: idle {figures['idle']:.3f} CPU s in {args.idle:g} s, "
                  f"allreduce {figures['latency'] * 1e6:.0f} us, {figures['train']:.0f} "
                  f"samples/s, {figures['cpu_step'] * 1e3:.2f} CPU ms a step", flush=True)
    line = ["horovod_loop"]
    for key in ("idle", "latency", "train", "cpu_step"):
        line.append(ratio_text(key, [f[key] for f in found["waits"]],
                               [f[key] for f in found["cycles"]]))
    print(" ".join(line))


if __name__ == "__main__":
    main()
