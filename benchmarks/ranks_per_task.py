"""Several ranks per Spark task (issue 41) against one rank per task, side by side on one
standalone cluster of two 2-core workers on loopback (one session: executors of 2 cores).

Two layouts of np=4 Horovod ranks, in alternating order, ``--runs`` times:
  per_task  HorovodRunner(np=4, ranks_per_task=2): 2 barrier tasks of 2 ranks, each task holding
            2 CPUs through a stage-level resource profile
  per_rank  HorovodRunner(np=4): 4 barrier tasks of one rank
Jobs:
  trivial   hvd.init(), one allreduce, return: the launch cost (wall time of the call)
  allreduce a 64 MB float32 tensor allreduced ``--reps`` times (after one to warm up); rank 0
            times them: seconds per allreduce
Usage: .venv/bin/python benchmarks/ranks_per_task.py [--runs 3] [--reps 5]
Last line: ranks_per_task per_task_launch_s=<s> per_rank_launch_s=<s> launch_ratio=<x>
per_task_allreduce_s=<s> per_rank_allreduce_s=<s> allreduce_ratio=<x> (ratios: per_task over
per_rank, medians of per-run ratios with their min and max; goal: launch_ratio <= 1.0)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from pairs import in_turn, ratio_text  # benchmarks/pairs.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def trivial():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()


def allreduce(reps: int):
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    tensor = torch.ones(16 * 1024 * 1024)  # 64 MB of float32
    hvd.allreduce(tensor, name="warm")
    began = time.perf_counter()
    for step in range(reps):
        hvd.allreduce(tensor, name=f"step{step}")
    return (time.perf_counter() - began) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from hvd_magics import HorovodRunner
    from tests.standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=2, cores=2)
    try:
        spark = (SparkSession.builder.master(cluster.url).appName("ranks-per-task")
                 .config("spark.executor.cores", "2").config("spark.cores.max", "4")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        while spark.sparkContext._jsc.sc().getExecutorIds().size() < 2:
            time.sleep(0.25)
        layouts = {"per_task": 2, "per_rank": 1}
        for per_task in layouts.values():  # warm: executors' Python workers, imports
            HorovodRunner(np=4, ranks_per_task=per_task, driver_log_verbosity="log_callback_only"
                          ).run(trivial)
        launch: dict[str, list[float]] = {name: [] for name in layouts}
        reduce: dict[str, list[float]] = {name: [] for name in layouts}
        for run in range(args.runs):
            for name in in_turn(run, list(layouts)):
                runner = HorovodRunner(np=4, ranks_per_task=layouts[name],
                                       driver_log_verbosity="log_callback_only")
                began = time.monotonic()
                runner.run(trivial)
                launch[name].append(time.monotonic() - began)
                reduce[name].append(runner.run(allreduce, reps=args.reps))
            print(f"run {run}: " + " ".join(
                f"{name} launch {launch[name][-1]:.2f} s, allreduce {reduce[name][-1]:.3f} s"
                for name in layouts), flush=True)
        print("ranks_per_task " + " ".join(
            f"{name}_launch_s={statistics.median(launch[name]):.2f}" for name in layouts) + " " +
              ratio_text("launch_ratio", launch["per_task"], launch["per_rank"]) + " " +
              " ".join(f"{name}_allreduce_s={statistics.median(reduce[name]):.3f}"
                       for name in layouts) + " " +
              ratio_text("allreduce_ratio", reduce["per_task"], reduce["per_rank"]))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
