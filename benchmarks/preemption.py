"""A spot executor taken back (issue 60): steps redone, seconds from the notice to the saved
checkpoint, and the job's wall time, with the notice (``checkpoint.preempting()``) against
``restarts`` alone (today's way: resume from the last periodic checkpoint once the executor is
gone), on a standalone cluster of one-core workers on loopback with
``spark.decommission.enabled``.

A DDP job (an MNIST-shaped MLP, 200 steps of 64 rows per rank, each step 50 ms longer, a
checkpoint every 50 steps) with ``restarts=1``. After step 60 of its first attempt, rank 1's
worker gets ``SIGPWR`` (Spark decommissions it and its executor) and a new worker starts (the
cluster's autoscaler); ``--grace`` seconds later the decommissioned worker and its executor are
killed (the instance goes). With the notice the loop saves when ``preempting()`` says so; without
it, it saves only every 50 steps. Measured, ``--runs`` times each, in turn:
  redone    steps run twice (by any rank)
  saved_s   seconds from the SIGPWR to the checkpoint the next attempt resumed from being written
            (with the notice; without it, that checkpoint was written before the SIGPWR)
  wall_s    the job's wall time, against an uninterrupted run's (``whole_s``)
``--state-mb N`` pads every checkpoint with N MB (a larger model's state, which rank 0 writes
after the other ranks ended on the notice).
Usage: .venv/bin/python benchmarks/preemption.py [--runs 3] [--grace 4] [--state-mb 0]
Last line: preemption redone_notice=<n> redone_restarts=<n> saved_s=<s> wall_notice_s=<s>
wall_restarts_s=<s> whole_s=<s>  (medians; goals: redone_notice = 0)
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SIGNAL_AFTER, EVERY, STEPS, STEP_S = 60, 50, 200, 0.05


def train(folder: str, notice: bool, state_mb: int = 0):
    import time

    import torch
    import torch.distributed as dist

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    start = 0
    found = checkpoint.latest()
    if found is not None:
        state, start = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    for step in range(start, STEPS):
        time.sleep(STEP_S)
        data = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(64, 784, generator=data), torch.randint(0, 10, (64,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        with open(os.path.join(folder, f"steps-{rank}"), "a") as out:
            out.write(f"{checkpoint.attempt()} {step}\n")
        if rank == 1 and step == SIGNAL_AFTER and checkpoint.attempt() == 0:
            with open(os.path.join(folder, "rank1"), "w") as out:
                out.write(str(os.getpid()))
        if (step + 1) % EVERY == 0 or (notice and checkpoint.preempting()):
            checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "padding": bytes(state_mb << 20)}, step + 1)
    return checkpoint.attempt()


def worker_jvm(pid: int):
    from tests.conftest import supervisor_of

    for parent in supervisor_of(pid).parents():
        if "org.apache.spark.deploy.worker.Worker" in " ".join(parent.cmdline()):
            return parent
    raise RuntimeError(f"no worker JVM above process {pid}")


def one_run(cluster, notice: bool, grace: float, state_mb: int) -> tuple[int, float, float]:
    """``(steps redone, seconds from the SIGPWR to the checkpoint resumed from, wall time)``."""
    from hvd_magics import HorovodRunner
    from hvd_magics.common.checkpoints import checkpoint_at

    folder = tempfile.mkdtemp(prefix="hvd-preempt-bench-")
    signalled: list[float] = []

    def decommission() -> None:
        marker = Path(folder, "rank1")
        while not marker.exists():
            time.sleep(0.02)
        time.sleep(0.05)  # its pid is written whole
        worker = worker_jvm(int(marker.read_text()))
        signalled.append(time.time())
        os.kill(worker.pid, signal.SIGPWR)
        cluster.add_worker(wait=False)
        time.sleep(grace)
        for process in [*worker.children(recursive=True), worker]:
            process.kill()

    thread = threading.Thread(target=decommission, daemon=True)
    thread.start()
    checkpoints = os.path.join(folder, "checkpoints")
    began = time.monotonic()
    assert HorovodRunner(np=2, engine="torch", restarts=1, checkpoint_dir=checkpoints).run(
        train, folder=folder, notice=notice, state_mb=state_mb) == 1
    wall = time.monotonic() - began
    thread.join(grace + 30)
    cluster.wait_for_workers(3)
    ran = {rank: [tuple(map(int, line.split())) for line in
                  Path(folder, f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    redone = max(len(steps) - STEPS for steps in ran.values())
    resumed_from = min(step for attempt, step in ran[0] if attempt == 1)
    found = checkpoint_at(Path(checkpoints), resumed_from)
    saved = (found[1].stat().st_mtime if found else float("nan")) - signalled[0]
    return redone, saved, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grace", type=float, default=4.0)
    parser.add_argument("--state-mb", type=int, default=0,
                        help="MB of padding in every checkpoint (a larger model's state)")
    args = parser.parse_args()
    from hvd_magics import HorovodRunner
    from tests.standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=3, worker_opts="-Dspark.decommission.enabled=true")
    try:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(cluster.url).appName("preemption")
                 .config("spark.executor.cores", "1").config("spark.cores.max", "2")
                 .config("spark.decommission.enabled", "true")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        whole = []
        results: dict[bool, list[tuple[int, float, float]]] = {True: [], False: []}
        for run in range(args.runs):
            folder = tempfile.mkdtemp(prefix="hvd-preempt-whole-")
            began = time.monotonic()
            HorovodRunner(np=2, engine="torch", checkpoint_dir=os.path.join(folder, "c")).run(
                train, folder=folder, notice=False, state_mb=args.state_mb)
            whole.append(time.monotonic() - began)
            for notice in ((True, False) if run % 2 == 0 else (False, True)):
                results[notice].append(one_run(cluster, notice, args.grace, args.state_mb))
                redone, saved, wall = results[notice][-1]
                print(f"run {run + 1} {'notice  ' if notice else 'restarts'}: redone {redone} "
                      f"steps, resumed checkpoint written {saved:+.2f} s from the SIGPWR, wall "
                      f"{wall:.1f} s (uninterrupted {whole[-1]:.1f} s)", flush=True)
        med = {n: [statistics.median(r[i] for r in results[n]) for i in range(3)]
               for n in (True, False)}
        print(f"preemption redone_notice={med[True][0]:.0f} redone_restarts={med[False][0]:.0f} "
              f"saved_s={med[True][1]:.2f} wall_notice_s={med[True][2]:.1f} "
              f"wall_restarts_s={med[False][2]:.1f} whole_s={statistics.median(whole):.1f}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
