"""Elastic jobs side by side: a 2-rank elastic PyTorch job that loses a rank, ours and the peer's.

On one warm ``local[2,4]`` SparkSession, interleaved, ``--runs`` times each (medians):
  ours           hvd_magics.HorovodRunner(np=(1, 2)).run(job)
  run_elastic    horovod.spark.run_elastic(job, num_proc=2, min_num_proc=1, max_num_proc=2)
``local[2,4]`` retries a failed task up to 4 times, as a cluster does: ``run_elastic`` fails the
Spark task of a lost rank so that Spark restarts it, and on plain ``local[2]`` (no retries) that
fails its whole job.
Two cases: ``clean`` (nothing fails: the launch and end of an elastic job) and ``lost`` (rank 1
kills its own process with SIGKILL at step 22; commits every 5 steps, so 2 steps are redone; ours
goes on with 1 rank, run_elastic's Spark task is retried and may join again). Per run: the wall
time, and for ``lost`` the recovery, from the kill to the survivor's first step after the reset
(both on this machine's wall clock).

Usage: .venv/bin/python benchmarks/elastic_recovery.py [--runs 3]
Last line: elastic_recovery ours_lost=<s> run_elastic_lost=<s> ours_recovery=<s>
run_elastic_recovery=<s> wall_ratio=<x> (ours / run_elastic, lost case) clean_ratio=<x>
(each ratio: the median of per-run ratios, candidates in alternating order, with its min and max)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from pairs import in_turn, local_session, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

STEPS = 60
KILL_AT = 22
COMMIT_EVERY = 5


def elastic_job(marks: str, kill: bool, steps: int = STEPS, kill_at: int = KILL_AT,
                commit_every: int = COMMIT_EVERY, step_s: float = 0.05):
    """Horovod's elastic loop; with ``kill``, the last rank of two SIGKILLs itself at
    ``kill_at`` and the survivor marks its first step after the reset in ``marks``."""
    import os
    import signal
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    killed = os.path.join(marks, "killed")

    def mark(name: str) -> bool:
        """Write the time to ``name`` unless some rank already did; whether this one did."""
        try:
            fd = os.open(os.path.join(marks, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, repr(time.time()).encode())
        os.close(fd)
        return True

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            x = torch.randn(16, 4)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state.step += 1
            if kill and os.path.exists(killed) and hvd.size() == 1:
                mark("resumed")
            if state.step % commit_every == 0:
                state.commit()
            if (kill and state.step == kill_at and hvd.size() == 2 and hvd.rank() == 1
                    and mark("killed")):  # once: a rank that joins later must not
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(step_s)

    train(state)
    return state.step


def _read(path: str) -> float:
    with open(path) as fh:
        return float(fh.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    spark = local_session("elastic_recovery", master="local[2,4]")
    import horovod.spark

    from hvd_magics import HorovodRunner

    candidates = {
        "ours": lambda kw: HorovodRunner(np=(1, 2)).run(elastic_job, **kw),
        "run_elastic": lambda kw: horovod.spark.run_elastic(
            elastic_job, kwargs=kw, num_proc=2, min_num_proc=1, max_num_proc=2, verbose=0)[0],
    }

    def once(name: str, kill: bool) -> tuple[float, float | None]:
        with tempfile.TemporaryDirectory() as marks:
            start = time.perf_counter()
            steps = candidates[name]({"marks": marks, "kill": kill})
            wall = time.perf_counter() - start
            assert steps == STEPS, (name, steps)
            if not kill:
                return wall, None
            resumed, killed = (_read(os.path.join(marks, n)) for n in ("resumed", "killed"))
            return wall, resumed - killed

    for name in candidates:  # warm-up: imports, JVM classes, Python workers
        once(name, False)
    walls: dict[tuple[str, str], list[float]] = {}
    recoveries: dict[str, list[float]] = {name: [] for name in candidates}
    for run in range(args.runs):
        for case in ("clean", "lost"):
            for name in in_turn(run, list(candidates)):
                wall, recovery = once(name, case == "lost")
                walls.setdefault((name, case), []).append(wall)
                if recovery is not None:
                    recoveries[name].append(recovery)
                print(f"run {run + 1} {case:<5} {name:<12} {wall:6.2f} s"
                      + (f"  recovery {recovery:5.2f} s" if recovery is not None else ""),
                      flush=True)
    med = {key: statistics.median(values) for key, values in walls.items()}
    rec = {name: statistics.median(values) for name, values in recoveries.items()}
    print(f"\nmedians over {args.runs} runs: {STEPS} steps, rank 1 lost at step {KILL_AT}, "
          f"{KILL_AT % COMMIT_EVERY} steps redone (commits every {COMMIT_EVERY})")
    for name in candidates:
        print(f"  {name:<12} clean {med[(name, 'clean')]:6.2f} s   "
              f"lost {med[(name, 'lost')]:6.2f} s   recovery {rec[name]:5.2f} s")
    print(f"elastic_recovery ours_lost={med[('ours', 'lost')]:.2f} "
          f"run_elastic_lost={med[('run_elastic', 'lost')]:.2f} "
          f"ours_recovery={rec['ours']:.2f} run_elastic_recovery={rec['run_elastic']:.2f} "
          + ratio_text("wall_ratio", walls[("ours", "lost")], walls[("run_elastic", "lost")]) + " "
          + ratio_text("clean_ratio", walls[("ours", "clean")], walls[("run_elastic", "clean")]))
    spark.stop()


if __name__ == "__main__":
    main()
