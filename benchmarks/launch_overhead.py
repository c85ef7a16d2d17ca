"""Launch overhead of a trivial 2-rank job (init, one allreduce, return a value), side by side.

Spark peers run on one warm local[2] SparkSession, interleaved, ``--runs`` times each (medians):
  ours              hvd_magics.HorovodRunner(np=2): after the warm-up, its ranks are forked from
                    the zygote of each Python worker (what every job after a session's first gets)
  ours_fresh        the same with HVD_MAGICS_ZYGOTE=0: every rank a fresh interpreter (a session's
                    first job)
  horovod_spark     horovod.spark.run(fn, num_proc=2, use_gloo=True)
  torchdistributor  pyspark TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
Driver-only: HorovodRunner(np=-2) against ``horovodrun --gloo -np 2``.
Also prints where our time goes (submit -> tasks started -> ranks started -> ranks done -> returned).

Usage: .venv/bin/python benchmarks/launch_overhead.py [--runs 5]
Last line: launch_overhead ours=<s> ours_fresh=<s> horovod_spark=<s> torchdistributor=<s>
ratio_vs_best_peer=<x> fresh_ratio_vs_best_peer=<x>
(each ratio: the median of per-run ratios, candidates in alternating order, with its min and max)
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time

from pairs import PhaseTimer, in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def hvd_torch_job():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


def torch_distributed_job():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item()


HOROVODRUN_SCRIPT = """
import horovod.torch as hvd, torch

hvd.init()
print(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item())
"""


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    spark = local_session("launch_overhead")
    import horovod.spark
    from pyspark.ml.torch.distributor import TorchDistributor

    from hvd_magics import HorovodRunner
    from hvd_magics.launch.payload import serialize_job

    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write(HOROVODRUN_SCRIPT)
    script.close()
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    quiet = open(os.devnull, "w")  # noqa: SIM115

    phases: list[dict[str, float]] = []

    source = inspect.getsource(hvd_torch_job)  # as HorovodRunner.run passes it (leading imports)

    def ours():
        timer = PhaseTimer()
        record = HorovodRunner(np=2).run_payload(serialize_job(hvd_torch_job, {}), views=[timer],
                                                 source=source)
        phases.append(timer.marks)
        return record.value

    def ours_fresh():
        return HorovodRunner(np=2, env={"HVD_MAGICS_ZYGOTE": "0"}).run_payload(
            serialize_job(hvd_torch_job, {}), views=[], source=source).value

    candidates = {
        "ours": ours,
        "ours_fresh": ours_fresh,
        "horovod_spark": lambda: horovod.spark.run(hvd_torch_job, num_proc=2, use_gloo=True,
                                                   verbose=0)[0],
        "torchdistributor": lambda: TorchDistributor(num_processes=2, local_mode=False,
                                                     use_gpu=False).run(torch_distributed_job),
        "ours_driver": lambda: HorovodRunner(np=-2).run_payload(
            serialize_job(hvd_torch_job, {}), views=[], source=source).value,
        "horovodrun": lambda: subprocess.run(
            [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, script.name],
            check=True, stdout=quiet, stderr=quiet),
    }
    for fn in candidates.values():  # warm-up: imports, JVM classes, Python workers
        fn()
    phases.clear()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for run in range(args.runs):
        for name in in_turn(run, list(candidates)):
            elapsed, value = timed(candidates[name])
            times[name].append(elapsed)
            print(f"run {run + 1} {name:<17} {elapsed:6.2f} s  -> {value!r:.40}", flush=True)
    med = {name: statistics.median(values) for name, values in times.items()}
    print("\nmedians over", args.runs, "runs (s):")
    for name, value in med.items():
        print(f"  {name:<17} {value:6.2f}   (min {min(times[name]):.2f}, max {max(times[name]):.2f})")
    print("\nwhere our Spark launch goes (medians, s since submit, driver clock):")
    for mark in ("task_started", "started", "result", "exit", "end"):
        values = [p[mark] for p in phases if mark in p]
        if values:
            print(f"  all ranks {mark:<13} {statistics.median(values):6.2f}")
    print(f"\ndriver-only: ours np=-2 {med['ours_driver']:.2f} s, horovodrun --gloo -np 2 "
          f"{med['horovodrun']:.2f} s, ratio {med['ours_driver'] / med['horovodrun']:.2f}")
    best_peer = [min(h, t) for h, t in zip(times["horovod_spark"], times["torchdistributor"])]
    print(f"launch_overhead ours={med['ours']:.2f} ours_fresh={med['ours_fresh']:.2f} "
          f"horovod_spark={med['horovod_spark']:.2f} torchdistributor={med['torchdistributor']:.2f} "
          + ratio_text("ratio_vs_best_peer", times["ours"], best_peer) + " "
          + ratio_text("fresh_ratio_vs_best_peer", times["ours_fresh"], best_peer))
    spark.stop()


if __name__ == "__main__":
    main()
