"""Every step kept in the hosts' memory (issue 84): what keeping costs a training step, and what a
killed rank costs with it, side by side in one run, on ranks on this machine (``np=-N``).

Overhead: an MLP of ``--sizes`` MB of float32 parameters (four square layers) trained with Adam
under DDP, batch 32, on ``--ranks`` ranks; the median step time (the first steps left out) of
  none    no checkpoint
  keep    ``checkpoint.keep(state, step)`` every step (the state: the model and the optimizer)
  async   ``checkpoint.save(state, step, asynchronous=True)`` every step (PyTorch's distributed
          checkpoint to the job's folder on disk, written in the background), the peers' way of
          saving often (torchtitan's, Lightning's async checkpointing)
and each one's overhead over ``none``, and the stall ``keep`` said (the loop's waits for copies).

Recovery: the same job of 10 MB with ``restarts=1`` keeping every step; rank 1 SIGKILLs itself
right after keeping step 12 (its copy may still be under way); the seconds from the kill to the
next attempt's first step, and the steps done twice.

Each mode runs ``--rounds`` times, in turn (none, keep, async, none, ...), and its median step is
taken over all its rounds' steps (the first two of each job left out): the machine's drift over
a run falls on every mode alike.

Usage: .venv/bin/python benchmarks/keep_steps.py [--sizes 10,100,1000] [--ranks 2,4] [--steps 12]
       [--rounds 3]
Last lines: ``keep_steps size_mb=<m> ranks=<n> none_s=<s> keep_s=<s> async_s=<s>
keep_overhead=<%> async_overhead=<%> stall_s_per_step=<s>`` per size and count, then ``keep_recovery
ranks=2 kill_to_first_step_s=<s> redone=<steps>`` (goals: keep_overhead <= 3% at 100 MB on 2
ranks; the kill to the next first step <= 5 s; redone <= 1)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("none", "keep", "async")


def train(size_mb: float, steps: int, mode: str, out: str, kill_after: int | None = None):
    import signal

    import torch
    import torch.distributed as dist

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    width = int(math.sqrt(size_mb * 2**20 / 4 / 4))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    state = {"model": model, "optimizer": optimizer}
    found = checkpoint.latest(state)
    start = 0 if found is None else found[1] + 1
    times = []
    for step in range(start, steps):
        began = time.perf_counter()
        x = torch.randn(32, width, generator=torch.Generator().manual_seed(step * 10 + rank))
        optimizer.zero_grad()
        ddp(x).pow(2).mean().backward()
        optimizer.step()
        if mode == "keep":
            checkpoint.keep(state, step)
        elif mode == "async":
            checkpoint.save(state, step, asynchronous=True)
        times.append(time.perf_counter() - began)
        if rank == 0 and step == start and checkpoint.attempt() == 1:
            Path(out, "first_step").write_text(f"{time.time()} {start}")
        if kill_after is not None and rank == 1 and step == kill_after and \
                not checkpoint.attempt():
            Path(out, "killed").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
    if mode == "async":
        checkpoint.wait()
    return times


def _run(size_mb: float, ranks: int, steps: int, mode: str) -> tuple[list[float], float]:
    """One job's step times, and the seconds its loops waited for copies."""
    import shutil

    from hvd_magics import HorovodRunner, last_run

    folder = tempfile.mkdtemp(prefix="hvd-keep-bench-")
    try:
        times = HorovodRunner(np=-ranks, engine="torch", checkpoint_dir=folder).run(
            train, size_mb=size_mb, steps=steps, mode=mode, out=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return times[2:] if len(times) > 4 else times, last_run().kept_stall_s


def overhead(size_mb: float, ranks: int, steps: int, rounds: int) -> dict[str, float]:
    """The modes' median steps, measured in ``rounds`` rounds of one job each, in turn (the
    machine's drift over a run shared out), and their line."""
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    stall = 0.0
    for _ in range(rounds):
        for mode in MODES:
            if times[mode] and math.isnan(times[mode][0]):
                continue
            try:
                taken, stalled = _run(size_mb, ranks, steps, mode)
            except Exception as exc:  # noqa: BLE001 - a mode that does not fit is said
                print(f"  {mode}: failed: {str(exc).splitlines()[0][:300]}", flush=True)
                times[mode] = [math.nan]
                continue
            times[mode] += taken
            stall += stalled if mode == "keep" else 0.0
    medians = {mode: statistics.median(found) for mode, found in times.items()}
    for mode in MODES:
        print(f"  {mode}: median step {medians[mode]:.3f} s over {len(times[mode])} steps",
              flush=True)
    none = medians["none"]
    print(f"keep_steps size_mb={size_mb:g} ranks={ranks} none_s={none:.3f} "
          f"keep_s={medians['keep']:.3f} async_s={medians['async']:.3f} "
          f"keep_overhead={100 * (medians['keep'] / none - 1):.1f}% "
          f"async_overhead={100 * (medians['async'] / none - 1):.1f}% "
          f"stall_s_per_step={stall / max(1, len(times['keep'])):.4f}", flush=True)
    return medians


def recovery() -> None:
    from hvd_magics import HorovodRunner, last_run

    folder = tempfile.mkdtemp(prefix="hvd-keep-recovery-")
    HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=folder).run(
        train, size_mb=10, steps=24, mode="keep", out=folder, kill_after=12)
    killed = float(Path(folder, "killed").read_text())
    first, start = Path(folder, "first_step").read_text().split()
    redone = 12 - int(start) + 1
    print(f"  attempts: {json.dumps(last_run().attempts)}", flush=True)
    print(f"keep_recovery ranks=2 kill_to_first_step_s={float(first) - killed:.2f} "
          f"redone={redone}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HVD_MAGICS_KEEP_IDLE_S", "30")
    for size in (float(s) for s in args.sizes.split(",")):
        for ranks in (int(r) for r in args.ranks.split(",")):
            if size >= 1000 and ranks > 2:
                print(f"keep_steps size_mb={size:g} ranks={ranks}: left out (the state of "
                      f"{ranks} ranks and their kept steps does not fit this machine's 24 GiB)")
                continue
            if size < 1000:
                overhead(size, ranks, args.steps, args.rounds)
            else:  # a step of seconds: one round, half the steps
                overhead(size, ranks, max(6, args.steps // 2), 1)
    recovery()


if __name__ == "__main__":
    main()
