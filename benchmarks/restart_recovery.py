"""A job that loses an executor and restarts from its last checkpoint (issue 40), on a standalone
cluster of one-core workers on loopback (``--workers``: 3 leaves a spare executor for the second
attempt, as a cluster with room has; 2 makes it wait for the worker to start a new executor).

A DDP job (an MNIST-shaped MLP, 40 steps of 64 rows per rank) with ``restarts=1``, saving a
checkpoint file every 5 steps (``files``) or keeping every step in the hosts' memory
(``memory``, ``checkpoint.keep``, issue 84); after step 22 of its first attempt, rank 1's executor
JVM is SIGKILLed (the standalone worker starts a new executor). Measured, ``--runs`` times each,
side by side:
  recovery  seconds from the kill to the first training step of the second attempt
  redone    steps done twice (the kill's step minus the step it resumed from)
  cold      a cold launch of a trivial DDP job on the same cluster (the goal's yardstick)
Usage: .venv/bin/python benchmarks/restart_recovery.py [--runs 3] [--workers 3]
       [--modes files,memory]
Last lines, a mode each: restart_recovery mode=<m> workers=<n> recovery_s=<s> cold_s=<s>
over_cold_s=<s> redone=<steps> (medians; goals: over_cold_s <= 2, redone <= 5 with files,
<= 1 with memory, recovery_s <= 10 with memory)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

KILL_AFTER, EVERY, STEPS = 22, 5, 40


def train(folder: str, mode: str = "files"):
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
    found = checkpoint.latest({"model": model, "optimizer": optimizer})
    start = 0 if found is None else found[1]
    for step in range(start, STEPS):
        data = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(64, 784, generator=data), torch.randint(0, 10, (64,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        if step == start and checkpoint.attempt() == 1 and rank == 0:
            with open(os.path.join(folder, "first_step"), "w") as out:
                out.write(f"{time.time()} {start}")
        if rank == 1 and step == KILL_AFTER and checkpoint.attempt() == 0:
            with open(os.path.join(folder, "rank1"), "w") as out:
                out.write(str(os.getpid()))
            time.sleep(600)  # the benchmark kills this rank's executor now
        if mode == "memory":
            checkpoint.keep({"model": model, "optimizer": optimizer}, step + 1)
        elif (step + 1) % EVERY == 0:
            checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                            step + 1)
    return checkpoint.attempt()


def trivial():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def executor_jvm(pid: int):
    """The executor JVM that (through the Python worker and the rank's keeper, or the zygote
    that forked it) started rank ``pid``."""
    from tests.conftest import supervisor_of

    for parent in supervisor_of(pid).parents():
        if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
            return parent
    raise RuntimeError(f"no executor JVM above process {pid}")


def _runs(mode: str, runs: int, workers: int) -> None:
    """``runs`` restarts of the job in ``mode`` (and as many cold launches); its line."""
    from hvd_magics import HorovodRunner, last_run

    recovery, cold, redone = [], [], []
    for _ in range(runs):
        began = time.monotonic()
        HorovodRunner(np=2, engine="torch").run(trivial)
        cold.append(time.monotonic() - began)
        folder = tempfile.mkdtemp(prefix="hvd-restart-bench-")
        killed: list[float] = []

        def kill(folder: str = folder, killed: list = killed) -> None:
            marker = Path(folder, "rank1")
            while not marker.exists():
                time.sleep(0.05)
            time.sleep(0.1)  # its pid is written whole
            jvm = executor_jvm(int(marker.read_text()))
            killed.append(time.time())
            jvm.kill()

        threading.Thread(target=kill, daemon=True).start()
        runner = HorovodRunner(np=2, engine="torch", restarts=1,
                               checkpoint_dir=os.path.join(folder, "checkpoints"))
        assert runner.run(train, folder=folder, mode=mode) == 1
        first, start = Path(folder, "first_step").read_text().split()
        recovery.append(float(first) - killed[0])
        redone.append(KILL_AFTER + 1 - int(start))
        print(f"{mode} run: recovery {recovery[-1]:.2f} s, cold {cold[-1]:.2f} s, redone "
              f"{redone[-1]} steps; attempts {last_run().attempts}", flush=True)
    over = [r - c for r, c in zip(recovery, cold)]
    print(f"restart_recovery mode={mode} workers={workers} "
          f"recovery_s={statistics.median(recovery):.2f} cold_s={statistics.median(cold):.2f} "
          f"over_cold_s={statistics.median(over):.2f} "
          f"over_cold_s_min={min(over):.2f} over_cold_s_max={max(over):.2f} "
          f"redone={statistics.median(redone):.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--modes", default="files,memory")
    args = parser.parse_args()
    from hvd_magics import HorovodRunner
    from tests.standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=args.workers)
    try:
        cluster.session("restart_recovery")
        assert HorovodRunner(np=2, engine="torch").run(trivial) == 2.0  # warm
        for mode in args.modes.split(","):
            _runs(mode, args.runs, args.workers)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
