"""Which rank holds the others back (issue 59): is the straggler named, rightly, soon, and never
in a clean run; and what does timing each step's parts cost.

1. detection: driver ranks (np=-2 and np=-4, Gloo) run a DDP loop (``--engine torch``) and a
   Horovod loop over a DataLoader, each step ~30 ms of compute; from step 20 on, one rank (the
   last) is slowed by 15% or by 30%, in its compute (more work per step) or in its input (its
   Dataset waits). A run is right when that rank, and only it, is named, for that cause, within
   20 steps of the slowdown (the step the verdict names it at, minus 20).
2. clean: ``--clean`` runs of the same loops with no rank slowed (np 2 and 4, both engines in
   turn): how many name anyone (goal 0).
3. overhead: a DDP loop and a Horovod loop of many tiny steps (np=-2), with the split on and off
   (``HVD_MAGICS_STEP_SPLIT=0``), interleaved ``--runs`` times; rank 0's own time of its loop.
   Then the direct cost of one step's hooks, against the loop's step. Keras and tf.distribute
   steps are not split (a graph call hides its parts), so they cost nothing.

Not measured here: a slow link. A link slower than the others' slows every rank's communication
alike, and the split names no rank then (on two hosts with one limited to 50 mbit, tried by
hand with tests/hosts.py: every rank shows most of its step in communication).

Usage: .venv/bin/python benchmarks/straggler.py [--runs 5] [--clean 20] [--steps 80]
Last line: straggler detected=<right>/<runs> clean_named=<n>/<clean> max_delay_steps=<n>
ddp_ratio=<on/off> horovod_ratio=<on/off> (goals: every run right, 0 clean runs named,
ratios >= 0.99)
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

from hvd_magics.protocol import ENV_STEP_SPLIT  # noqa: E402

#: The step the slowdown begins at, and how soon after it the rank must be named.
SLOW_FROM, WITHIN = 20, 20


def _run(np: int, engine: str, env: dict[str, str] | None = None, job=None, **kwargs):
    from hvd_magics import HorovodRunner
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    import cloudpickle

    cloudpickle.register_pickle_by_value(engine_jobs)
    return HorovodRunner(np=-np, engine=engine, env=env or {}).run_payload(
        serialize_job(job or engine_jobs.straggler_ddp, {"engine": engine, **kwargs}), views=[])


def _named(record) -> list[tuple[int, str]]:
    """``(step, verdict)`` of each rank named in a run."""
    out = []
    for line in record.stragglers:
        head, _, text = line.partition(": ")
        out.append((int(head.removeprefix("from step ")), text))
    return out


def detection(steps: int) -> tuple[int, int, int]:
    """``(right, runs, largest delay in steps)`` over the slowed runs."""
    right = runs = 0
    delays = []
    for np in (2, 4):
        for engine in ("torch", "horovod"):
            for how in ("compute", "input"):
                for slower in (0.15, 0.30):
                    slow = np - 1
                    record = _run(np, engine, steps=steps, slow_rank=slow, how=how,
                                  slower=slower, slow_from=SLOW_FROM)
                    named = _named(record)
                    cause = "input pipeline" if how == "input" else "in compute"
                    ok = (len(named) == 1 and named[0][1].startswith(f"rank {slow} (host ")
                          and cause in named[0][1] and named[0][0] - SLOW_FROM <= WITHIN)
                    runs += 1
                    right += ok
                    if named:
                        delays.append(named[0][0] - SLOW_FROM)
                    print(f"np={np} {engine:<7} {how:<7} +{slower:.0%}: "
                          f"{'right' if ok else 'WRONG'}; "
                          + ("; ".join(f"named at step {s}: {t[:90]}..." for s, t in named)
                             or "nobody named"), flush=True)
    return right, runs, max(delays, default=-1)


def clean(count: int, steps: int) -> int:
    named = 0
    for run in range(count):
        np, engine = (2, 4)[run % 2], ("torch", "horovod")[(run // 2) % 2]
        record = _run(np, engine, steps=steps)
        found = _named(record)
        named += bool(found)
        print(f"clean run {run + 1} np={np} {engine}: "
              + ("; ".join(t[:100] for _, t in found) or "nobody named"), flush=True)
    return named


def many_steps(engine: str = "torch", steps: int = 3000):
    """A loop of ``steps`` tiny steps over a DataLoader (DDP or Horovod), after 100 warm-up
    steps; rank 0's own seconds for them."""
    import time

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        import horovod.torch as hvd

        hvd.init()
        model = net
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters())
    rows = (steps + 100) * 4
    data = torch.utils.data.TensorDataset(torch.randn(rows, 16), torch.randint(0, 2, (rows,)))
    start = 0.0
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=4)):
        if i == 100:
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return time.perf_counter() - start


def direct_cost(calls: int = 100_000) -> float:
    """Seconds of one step's own hooks, called directly: an optimizer step's two, a batch's
    wait, a DDP backward of 4 parameters' gradients."""
    from hvd_magics.rank import step_split

    step_split.reset()
    step_split._before_optimizer_step()
    step_split._on_optimizer_step()
    take = step_split._timed(step_split._INPUT, lambda: None)
    start = time.perf_counter()
    for _ in range(calls):
        take()
        for _ in range(4):
            step_split._grad_ready(None)
        step_split._before_optimizer_step()
        step_split._on_optimizer_step()
    return (time.perf_counter() - start) / calls


def overhead(runs: int) -> list[str]:
    out = []
    for engine in ("torch", "horovod"):
        on, off = [], []
        for run in range(runs):
            for label, times, env in in_turn(run, (("on", on, {}),
                                                   ("off", off, {ENV_STEP_SPLIT: "0"}))):
                record = _run(2, engine, env=env, job=many_steps)
                times.append(record.value)
                print(f"run {run + 1} {engine:<7} split {label:<3} loop {record.value:.3f} s",
                      flush=True)
        step_s = statistics.median(off) / 3000
        cost = direct_cost()
        print(f"direct: {cost * 1e6:.2f} us of hooks a step; a step of this {engine} loop takes "
              f"{step_s * 1e3:.3f} ms -> estimated ratio {1 / (1 + cost / step_s):.4f}")
        # times: a shorter loop is faster, so on/off is off's time over on's
        out.append(ratio_text(f"{'ddp' if engine == 'torch' else engine}_ratio", off, on))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clean", type=int, default=20)
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    began = time.monotonic()
    right, runs, delay = detection(args.steps)
    named = clean(args.clean, args.steps)
    ratios = overhead(args.runs)
    print(f"({time.monotonic() - began:.0f} s)")
    print(f"straggler detected={right}/{runs} clean_named={named}/{args.clean} "
          f"max_delay_steps={delay} {' '.join(ratios)}")


if __name__ == "__main__":
    main()
