"""Throughput of a small synthetic training job with and without Horovod Timeline.

np=-2 ranks on the driver run a synthetic PyTorch training loop (a small MLP, random data,
Horovod's DistributedOptimizer); each run reports samples per second measured on rank 0's own
clock after a warm-up. Runs with the timeline on and off are interleaved, ``--runs`` times each.

Usage: .venv/bin/python benchmarks/timeline_overhead.py [--runs 5]
Last line: timeline_overhead ratio=<on/off> ratio_min=<x> ratio_max=<x>   (throughput with the timeline / without)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pairs import in_turn, ratio_text  # benchmarks/pairs.py


def synthetic_training(steps: int = 600, batch: int = 64):
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)  # two ranks on two cores: no oversubscription noise
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch * hvd.size() / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from hvd_magics import HorovodRunner
    from hvd_magics.launch.payload import serialize_job
    from hvd_magics.job.records.timeline import summarize

    payload = serialize_job(synthetic_training, {})
    folder = Path(tempfile.mkdtemp())
    on, off = [], []
    for run in range(args.runs):
        for label, rates in in_turn(run, (("on", on), ("off", off))):
            trace = folder / f"trace-{run}.json" if label == "on" else None
            record = HorovodRunner(np=-2, timeline=trace).run_payload(payload, views=[])
            rates.append(record.value)
            extra = f", trace {trace.stat().st_size / 1e6:.1f} MB" if trace else ""
            print(f"run {run + 1} timeline {label:<3} {record.value:10.0f} samples/s{extra}", flush=True)
    summary = summarize(folder / "trace-0.json")
    print(f"trace of run 1: {summary.events} events; top activities: "
          + ", ".join(f"{n} {us / 1e3:.0f} ms" for n, us in
                      sorted(summary.activity_us.items(), key=lambda kv: -kv[1])[:4]))
    print(f"medians: on {statistics.median(on):.0f} samples/s, off {statistics.median(off):.0f} samples/s")
    print(f"timeline_overhead {ratio_text('ratio', on, off)}")


if __name__ == "__main__":
    main()
