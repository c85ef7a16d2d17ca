"""Where the ranks are, and what looking costs: ``job.stacks()`` latency, and a training loop's
step time while its stacks are taken over and over, against the same loop left alone.

1. latency: a background job of np=2 (on a local[2] SparkSession, then on the driver, np=-2)
   whose rank 1 sleeps in a function while rank 0 waits in an allreduce; ``job.stacks()`` (what
   ``%hvd_stacks`` calls) is timed ``--runs`` times, and each answer must name both places.
2. cost: ``--loop-runs`` times each, interleaved, a driver job of 2 ranks times 2,000 small
   torch allreduce steps on rank 0's own clock: once left alone (the stack thread waits on its
   pipe and costs nothing), once while the notebook takes its stacks every 0.1 s. The stall watch
   itself costs the ranks nothing: it is a clock on the driver, and a rank is asked for its
   stacks only when it has been silent for ``--stall-after`` seconds.

Usage: .venv/bin/python benchmarks/stacks.py [--runs 20] [--loop-runs 5]
Last line: stacks spark_latency_s=<median> driver_latency_s=<median> looked_at_ratio=<x>
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from pairs import in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
STEPS = 2000


def waiting_peer():
    import time

    import horovod.torch as hvd
    import torch

    def slow_down():
        time.sleep(600)

    hvd.init()
    if hvd.rank() == 1:
        slow_down()
    hvd.allreduce(torch.ones(3))


def allreduce_loop(steps: int = STEPS) -> float:
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    hvd.allreduce(torch.ones(100))  # warm
    began = time.perf_counter()
    for _ in range(steps):
        hvd.allreduce(torch.ones(100))
    return time.perf_counter() - began


def latency(np: int, runs: int) -> list[float]:
    from hvd_magics import HorovodRunner

    job = HorovodRunner(np=np, driver_log_verbosity="log_callback_only").start(waiting_peer)
    try:
        deadline = time.monotonic() + 120
        while "slow_down" not in job.stacks().where().get(1, ""):
            if time.monotonic() > deadline:
                raise RuntimeError("the ranks never reached their places")
            time.sleep(0.1)
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            where = job.stacks().where()
            times.append(time.perf_counter() - began)
            assert "slow_down" in where[1] and "mpi_ops" in where[0], where  # never a wrong figure
        return times
    finally:
        job.stop()


def looked_at(look: bool) -> float:
    from hvd_magics import HorovodRunner

    job = HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").start(allreduce_loop)
    stop = threading.Event()

    def keep_looking() -> None:
        while not stop.wait(0.1):
            job.stacks(wait=0.5)

    looker = threading.Thread(target=keep_looking, daemon=True)
    if look:
        looker.start()
    try:
        return job.wait(timeout=600)
    finally:
        stop.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--loop-runs", type=int, default=5)
    args = parser.parse_args()
    local_session("stacks")
    spark = latency(2, args.runs)
    driver = latency(-2, args.runs)
    print(f"job.stacks() on np=2: spark local[2] median {statistics.median(spark):.3f} s "
          f"(max {max(spark):.3f}), driver median {statistics.median(driver):.3f} s "
          f"(max {max(driver):.3f}); {args.runs} runs each; goal <= 1 s")
    times: dict[bool, list[float]] = {True: [], False: []}
    for run in range(args.loop_runs):
        for look in in_turn(run, [False, True]):
            times[look].append(looked_at(look))
    print(f"{STEPS} allreduce steps on rank 0: alone {statistics.median(times[False]):.3f} s, "
          f"stacks taken every 0.1 s {statistics.median(times[True]):.3f} s "
          f"(medians of {args.loop_runs})")
    print(f"stacks spark_latency_s={statistics.median(spark):.3f} "
          f"driver_latency_s={statistics.median(driver):.3f} "
          + ratio_text("looked_at_ratio", times[True], times[False]))


if __name__ == "__main__":
    main()
