"""A warm pool against a cold job: a trivial function and a trivial %%horovod cell, side by side.

On one local SparkSession (``local[4]``, so a pool of 2 and a cold job of 2 both find their
slots), interleaved, ``--runs`` times each (medians and per-pair ratios):
  pool.run            HorovodPool(np=2).run(trivial)        cold.run     HorovodRunner(np=2).run
  pool cell           %%horovod (the pool's)  trivial cell  cold cell    %%horovod np=2 --cold
The same on the driver (np=-2). The trivial function initialises Horovod (once, on a pool) and
allreduces one number; the cell does the same through the magic with its text view.

Usage: .venv/bin/python benchmarks/warm_pool.py [--runs 7]
Last line: warm_pool run_s=<s> cell_s=<s> ratio=<warm/cold> (Spark), and the same for the driver
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from contextlib import redirect_stdout

from pairs import in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

CELL = ("import horovod.torch as hvd\nimport torch\nhvd.init()\n"
        "hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()")


def trivial():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


def timed(fn) -> float:
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        value = fn()
    assert value == 2.0, value  # a wrong number is never a figure
    return time.perf_counter() - start


def measure(np: int, runs: int, ip) -> dict[str, list[float]]:
    from hvd_magics import HorovodPool, HorovodRunner
    from hvd_magics.job.session import SESSION

    times: dict[str, list[float]] = {k: [] for k in ("warm_run", "cold_run", "warm_cell",
                                                     "cold_cell")}
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("hvd_pool", f"start np={np}")
    pool = SESSION.pool
    try:
        candidates = {
            "warm_run": lambda: pool.run(trivial),
            "cold_run": lambda: HorovodRunner(np=np).run(trivial),
            "warm_cell": lambda: ip.run_cell_magic("horovod", "", CELL),
            "cold_cell": lambda: ip.run_cell_magic("horovod", f"np={np} --cold", CELL),
        }
        timed(candidates["warm_run"])  # the pool's first run imports torch and Horovod
        for run in range(runs):
            for name in in_turn(run, list(candidates)):
                times[name].append(timed(candidates[name]))
    finally:
        ip.run_line_magic("hvd_pool", "stop")
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magics")
    local_session("warm_pool", master="local[4]")
    lines = []
    for label, np in (("spark", 2), ("driver", -2)):
        t = measure(np, args.runs, ip)
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"{label}: pool.run {med['warm_run']:.3f} s, cold run {med['cold_run']:.3f} s; "
              f"pool cell {med['warm_cell']:.3f} s, cold cell {med['cold_cell']:.3f} s "
              f"(medians of {args.runs})")
        lines.append(f"{label}_run_s={med['warm_run']:.3f} {label}_cell_s={med['warm_cell']:.3f} "
                     + ratio_text(f"{label}_run_ratio", t["warm_run"], t["cold_run"]) + " "
                     + ratio_text(f"{label}_cell_ratio", t["warm_cell"], t["cold_cell"]))
    print("warm_pool " + " ".join(lines))


if __name__ == "__main__":
    main()
