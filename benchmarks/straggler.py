"""Which rank holds the others back (issue 59): is the straggler named, rightly, soon, and never
in a clean run; and what does timing each step's parts cost.

1. detection: driver ranks (np=-2 and np=-4, Gloo) run a DDP loop (``--engine torch``) and a
   Horovod loop over a DataLoader, each step ~30 ms of compute; from step 20 on, one rank (the
   last) is slowed by 15% or by 30%, in its compute (more work per step) or in its input (its
   Dataset waits); and, with np=2 (each rank pinned to a core of its own, steps of a fixed
   amount of work), by a process that spins on its core (it waits for a CPU); and with every
   third batch of its input 90% late (``bursts``: 30% on average). A run is right
   when that rank, and only it, is named, for that cause, within 80 steps of the slowdown (the
   step the verdict names it at, minus 20); the spinner's run when the host's condition is
   said and no rank is named (a CPU shared with other work is the host's, not the rank's).
2. clean: ``--clean`` runs of the same loops with no rank slowed (np 2 and 4, both engines in
   turn): how many name a rank (goal 0; the host's condition may be said).
3. overhead: a DDP loop and a Horovod loop (one rank each, a process of its own, so that no
   other rank shares the two cores and swings its time by 20%), of tiny steps (~0.3 ms) and
   of medium ones (a few ms), with the split on and off (``HVD_MAGICS_STEP_SPLIT=0``),
   interleaved ``--runs`` times: steps/s on over off; and Horovod's Keras ``fit`` (its steps
   timed inside the graph, rank/instruments/step_split_tf.py). Then the direct cost of one step's torch
   hooks. Steps under tf.distribute are timed by the same ops in the graph as Keras' under
   Horovod (not measured apart).

4. link (needs root): two real hosts of two cores (tests/hosts.py), a DDP job of 4 ranks with
   1 MB of gradients a step; in ``--link-runs`` runs the link into one host (alternately the
   first and the second) is limited to 50 mbit (tc tbf), in as many it is not. A run is right
   when the limited host's link is named (job/readings/link_probe.py) and no rank is named for its own
   work; a clean run when no host's link is named. In as many, one host's processes are under
   a CPU quota of 30% of a CPU (a cgroup) and nothing is on the links: right when no link is
   named (its answers waited for a CPU), and any rank named is that host's, waiting for a CPU.

5. stalls: the last rank sleeps 0.25-0.3 s in every 10th or 50th step of ~7 ms (np 2 and 4,
   both engines): right when it alone is named within three periods of its first stall.
6. busy: ``--busy-clean`` clean runs (equal ranks, 7 ms steps varying by 20% at random)
   beside a process spinning on each core: how many name a rank (goal 0, ever); how many say
   the host busy instead.

7. noise (issue 82): equal ranks whose steps do a fixed amount of work (matrix products, as
   training does: a CPU shared with other work runs it slower; the parts above do a fixed
   *time* of work, which a busy CPU cannot lengthen), 1 ms and 30 ms of it a step, np=2 DDP,
   beside 0, 1, 2 and 4 processes that spin: ``--noise-runs`` clean runs of each (goal: no
   rank named, ever) and as many with rank 1 doing 30% more (right when it alone is named);
   each run 800 steps (1 ms) or 150 (30 ms). ``--record FILE`` keeps every step split the
   driver got (the evidence tests/unit/test_straggler_recorded.py replays).

Usage: .venv/bin/python benchmarks/straggler.py [--runs 5] [--clean 20] [--steps 80]
       [--busy-clean 30] [--link-runs 4]
       [--parts detection,clean,stalls,busy,overhead,link,noise] [--loops tiny,medium]
       [--noise-runs 10] [--noise-busy 0,1,2,4] [--record FILE]
       [--engines torch,horovod,keras]
Last line: straggler detected=<right>/<runs> clean_named=<n>/<clean> max_delay_steps=<n>
stalls=<right>/<runs> stall_periods_max=<periods> busy_named=<n>/<runs> busy_said=<n>/<runs>
link_named=<right>/<runs> link_clean=<no link named>/<runs> link_busy=<no link named>/<runs>
ddp_tiny_ratio=... ddp_medium_ratio=... horovod_tiny_ratio=... horovod_medium_ratio=...
keras_tiny_ratio=... keras_medium_ratio=...
(steps/s on over off; goals: every run right, 0 clean runs named, ratios >= 0.99)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pairs import hosts_session, in_turn, ratio_text  # benchmarks/pairs.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hvd_magics.protocol import ENV_STEP_SPLIT  # noqa: E402

#: The step the slowdown begins at, and how soon after it the rank must be named: a slowdown
#: under twice the others' own work is named once the time lost to it held over 2 s of steps
#: (issue 82: 60 steps of 33 ms), 20 steps before that.
SLOW_FROM, WITHIN = 20, 80
#: The CPU quota (a share of one CPU) of the link part's busy host.
BUSY_SHARE = 0.3


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


def _cause_of(verdict: str) -> str:
    """The cause a verdict names, in a few words."""
    for words in ("waiting for a CPU", "in compute (", "input pipeline"):
        if words in verdict:
            return words.rstrip(" (")
    return "?"


def detection(steps: int) -> tuple[int, int, int]:
    """``(right, runs, largest delay in steps)`` over the slowed runs."""
    right = runs = 0
    delays = []
    for np in (2, 4):
        for engine in ("torch", "horovod"):
            ways = [("compute", 0.15), ("compute", 0.30), ("input", 0.15), ("input", 0.30),
                    ("bursts", 0.30)]
            for how, slower in ways + ([("cpu", 0.0)] if np == 2 else []):
                slow = np - 1
                record = _run(np, engine, steps=steps, slow_rank=slow, how=how,
                              slower=slower, slow_from=SLOW_FROM)
                said = _named(record)
                named = [(s, t) for s, t in said if "host's condition" not in t]
                cause = {"input": "input pipeline", "bursts": "input pipeline"}.get(
                    how, "in compute (")
                if how == "cpu":  # a spinner on its CPU: the host's condition, no rank named
                    ok = not named and len(said) == 1
                else:
                    ok = (len(named) == 1 and named[0][1].startswith(f"rank {slow} (host ")
                          and cause in named[0][1] and named[0][0] - SLOW_FROM <= WITHIN)
                runs += 1
                right += ok
                if named and how != "cpu":
                    delays.append(named[0][0] - SLOW_FROM)
                print(f"np={np} {engine:<7} {how:<7} "
                      f"{'a spinner' if how == 'cpu' else f'+{slower:.0%}'}: "
                      f"{'right' if ok else 'WRONG'}; "
                      + ("; ".join(f"said at step {s}: {t[:60]}... {_cause_of(t)}"
                                   for s, t in said) or "nobody named"), flush=True)
    return right, runs, max(delays, default=-1)


def clean(count: int, steps: int) -> int:
    named = 0
    for run in range(count):
        np, engine = (2, 4)[run % 2], ("torch", "horovod")[(run // 2) % 2]
        record = _run(np, engine, steps=steps)
        found = _named(record)
        named += any("host's condition" not in t for _, t in found)
        print(f"clean run {run + 1} np={np} {engine}: "
              + ("; ".join(f"{t[:60]} ... {t.split(' s), ')[-1][:80]}" for _, t in found)
                 or "nobody named"), flush=True)
    return named


def _spinners():
    """One process spinning on each core (a machine busy with other work); stop it with
    ``.kill()`` on each."""
    import subprocess

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]


def stalls(steps_per: int = 5) -> tuple[int, int, int]:
    """``(right, runs, most periods to name)``: the last rank sleeps 0.25-0.3 s in every 10th
    (or 50th) step of ~7 ms from step 10 (50) on, np 2 and 4, both engines. Right when that
    rank alone is named, at most three periods after its first stall."""
    right = runs = 0
    periods = []
    for every in (10, 50):
        for np in (2, 4):
            for engine in ("torch", "horovod"):
                record = _run(np, engine, steps=every * steps_per, slow_rank=np - 1,
                              how="stall", base_s=0.007, slow_from=every, every=every)
                named = [(s, t) for s, t in _named(record) if "host's condition" not in t]
                first = named[0][0] if named else -1
                ok = (len(named) == 1 and named[0][1].startswith(f"rank {np - 1} (host ")
                      and first - every <= 3 * every)
                runs, right = runs + 1, right + ok
                if named:
                    periods.append((first - every) / every)
                print(f"stall every {every} np={np} {engine:<7}: {'right' if ok else 'WRONG'}; "
                      + ("; ".join(f"named at step {s}: {t[:70]}..." for s, t in named)
                         or "nobody named"), flush=True)
    return right, runs, max(periods, default=-1)


def busy_clean(count: int, steps: int) -> tuple[int, int]:
    """``(runs that named a rank, runs that said the host busy)`` of ``count`` clean runs
    (equal ranks, 7 ms steps varying by 20% at random) beside a process spinning on each
    core; np 2 and 4, both engines in turn."""
    named = busy = 0
    spinning = _spinners()
    try:
        for run in range(count):
            np, engine = (2, 4)[run % 2], ("torch", "horovod")[(run // 2) % 2]
            record = _run(np, engine, steps=steps, base_s=0.007, jitter=0.2)
            found = _named(record)
            ranks = [t for _, t in found if "host's condition" not in t]
            named, busy = named + bool(ranks), busy + (len(ranks) < len(found))
            print(f"busy clean run {run + 1} np={np} {engine}: "
                  + ("; ".join(t[:90] for _, t in found) or "nobody named"), flush=True)
    finally:
        for process in spinning:
            process.kill()
    return named, busy


def noise(runs: int, busy_levels: list[int], record: str | None) -> tuple[int, int, int, int]:
    """``(clean runs that named a rank, clean runs, straggler runs right, straggler runs)`` of
    the fixed-work loops beside ``busy_levels`` spinning processes (part 7)."""
    import json
    import subprocess

    from hvd_magics.job.verdicts import straggler
    from tests import engine_jobs

    events: list = []
    observe = straggler.StepSplits.observe

    def kept(self, rank, event, hosts):  # the driver's evidence, for --record
        events.append([rank, event.get("rows") or [], event.get("pace") or [],
                       event.get("totals")])
        return observe(self, rank, event, hosts)

    straggler.StepSplits.observe = kept
    wrong = clean_runs = right = slow_runs = 0
    try:
        for work_ms, steps in ((1.0, 800), (30.0, 150)):
            for busy in busy_levels:
                spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                            for _ in range(busy)]
                try:
                    for run in range(2 * runs):
                        more = 0.3 if run % 2 else 0.0
                        events.clear()
                        record_ = _run(2, "torch", job=engine_jobs.fixed_work, steps=steps,
                                       work_ms=work_ms, slow_rank=1, more=more)
                        said = [t for _, t in _named(record_) if "host's condition" not in t]
                        if more:
                            slow_runs += 1
                            ok = bool(said) and all(t.startswith("rank 1 ") for t in said)
                            right += ok
                        else:
                            clean_runs += 1
                            wrong += bool(said)
                            ok = not said
                        print(f"noise {work_ms:g} ms busy={busy} "
                              f"{'+30% rank 1' if more else 'clean'}: "
                              f"{'right' if ok else 'WRONG'}; "
                              + ("; ".join(t[:90] for t in said) or "nobody named"), flush=True)
                        if record:
                            with open(record, "a") as out:
                                out.write(json.dumps({"busy": busy, "work_ms": work_ms,
                                                      "more": more, "events": events}) + "\n")
                finally:
                    for process in spinners:
                        process.kill()
    finally:
        straggler.StepSplits.observe = observe
    return wrong, clean_runs, right, slow_runs


#: The overhead's loops: (name, width of the MLP's layers, batch size); tiny steps take about
#: 0.3 ms on this machine, medium ones a few ms.
LOOPS = (("tiny", 8, 4), ("medium", 2048, 256))


def one_loop(engine: str, width: int, batch: int, steps: int = 3000) -> float:
    """In this process, one rank (world of 1) of a DDP or Horovod loop over a DataLoader:
    seconds per step after 300 warm-up steps."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000),
                      RANK="0", WORLD_SIZE="1")
    if os.environ.get(ENV_STEP_SPLIT, "1") != "0":
        from hvd_magics.rank.instruments import step_split

        step_split.install()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, 2))
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
    rows = (steps + 300) * batch
    data = torch.utils.data.TensorDataset(torch.randn(rows, 16), torch.randint(0, 2, (rows,)))
    start = 0.0
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=batch)):
        if i == 300:
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def one_keras_loop(width: int, batch: int, steps: int = 3000) -> float:
    """In this process, one rank (world of 1) of Horovod's Keras ``fit`` over a ``tf.data``
    pipeline: seconds per step after 300 warm-up steps (its steps are timed in the graph,
    rank/instruments/step_split_tf.py)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if os.environ.get(ENV_STEP_SPLIT, "1") != "0":
        from hvd_magics.rank.instruments import step_split

        step_split.install()
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow.keras as hvd

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)
    rows = (steps + 300) * batch
    x = np.random.default_rng(0).normal(size=(rows, 16)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype("int64"))).batch(batch)
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(width, "relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    marks: list[float] = []

    class Clock(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch_index, logs=None):
            if batch_index == 300:
                marks.append(time.perf_counter())

        def on_train_end(self, logs=None):
            marks.append(time.perf_counter())

    model.fit(data, verbose=0, callbacks=[Clock()])
    return (marks[1] - marks[0]) / steps


def _loop_in_process(engine: str, width: int, batch: int, on: bool) -> float:
    import subprocess

    env = {**os.environ, ENV_STEP_SPLIT: "1" if on else "0"}
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import straggler; "
            + (f"print(straggler.one_keras_loop({width}, {batch}))" if engine == "keras" else
               f"print(straggler.one_loop({engine!r}, {width}, {batch}))"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def links(runs: int) -> tuple[int, int, int, int]:
    """``(right, clean runs that named no link, busy runs that named no link, runs)``."""
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "tests" / "spark-conf"))

    from hvd_magics import HorovodRunner, last_run
    from tests import engine_jobs
    from tests.hosts import HostCluster

    import cloudpickle

    cloudpickle.register_pickle_by_value(engine_jobs)
    cluster = HostCluster(hosts=2, cores=2)
    right = clean_ok = busy_ok = 0
    try:
        spark = hosts_session(cluster, "straggler")
        for run in range(3 * runs):
            kind, host = ("limited", "clean", "busy")[run % 3], cluster.hosts[run // 3 % 2]
            if kind == "limited":
                host.limit("50mbit")
            elif kind == "busy":
                host.limit_cpu(BUSY_SHARE)
            try:
                HorovodRunner(np=4, engine="torch", timeout=300).run(
                    engine_jobs.straggler_ddp, engine="torch", steps=60, width=4096,
                    base_s=0.01)
            finally:
                host.limit(None)
                host.limit_cpu(None)
            record = last_run()
            named = "is the slowest" in record.links
            if kind == "limited":
                ok = f"link of host {host.address} is" in record.links and not record.stragglers
                right += ok
            elif kind == "busy":  # its ranks may be named, for their wait for a CPU
                ok = not named and all(host.address in line and "waiting for a CPU" in line
                                       for line in record.stragglers)
                busy_ok += ok
            else:
                ok = not named
                clean_ok += ok
            what = "clean" if kind == "clean" else f"{kind} {host.address}"
            print(f"link run {run + 1} {what:<22} {'right' if ok else 'WRONG'}: "
                  f"{record.links or 'no probe'}"
                  + (f"; {record.stragglers}" if record.stragglers else ""), flush=True)
        spark.stop()
    finally:
        cluster.stop()
    return right, clean_ok, busy_ok, runs


def direct_cost(calls: int = 100_000) -> float:
    """Seconds of one step's own hooks, called directly: an optimizer step's two, a batch's
    wait, a DDP backward of 4 parameters' gradients."""
    from hvd_magics.rank.instruments import step_split

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


def overhead(runs: int, loops: list[str], engines: list[str]) -> list[str]:
    out = []
    for engine in engines:
        for name, width, batch in (loop for loop in LOOPS if loop[0] in loops):
            on, off = [], []
            for run in range(runs):
                for label, times, split in in_turn(run, (("on", on, True), ("off", off, False))):
                    times.append(_loop_in_process(engine, width, batch, split))
                    print(f"run {run + 1} {engine:<7} {name:<6} split {label:<3} "
                          f"{times[-1] * 1e3:.3f} ms a step", flush=True)
            # steps/s on over off = off's step time over on's
            tag = f"{'ddp' if engine == 'torch' else engine}_{name}_ratio"
            out.append(ratio_text(tag, off, on))
            print(out[-1], flush=True)
    cost = direct_cost()
    print(f"direct: {cost * 1e6:.2f} us of hooks a step, called alone")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clean", type=int, default=20)
    parser.add_argument("--busy-clean", type=int, default=30)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--link-runs", type=int, default=4)
    parser.add_argument("--noise-runs", type=int, default=10)
    parser.add_argument("--noise-busy", default="0,1,2,4",
                        help="the noise part's spinning processes (comma-separated counts)")
    parser.add_argument("--record", default=None,
                        help="a file to append the noise part's step splits to (JSON lines)")
    parser.add_argument("--parts", default="detection,clean,stalls,busy,overhead,link",
                        help="which parts to run (comma-separated)")
    parser.add_argument("--engines", default="torch,horovod,keras",
                        help="the overhead's loops' engines (comma-separated: torch (DDP), "
                             "horovod (its torch API), keras (its Keras API))")
    parser.add_argument("--loops", default="tiny,medium",
                        help="the overhead's loops (comma-separated: tiny, medium)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    began = time.monotonic()
    right, runs, delay = detection(args.steps) if "detection" in parts else (0, 0, -1)
    named = clean(args.clean, args.steps) if "clean" in parts else 0
    stall_right, stall_runs, stall_periods = stalls() if "stalls" in parts else (0, 0, -1)
    busy_named, busy_said = (busy_clean(args.busy_clean, args.steps) if "busy" in parts
                             else (0, 0))
    ratios = (overhead(args.runs, args.loops.split(","), args.engines.split(","))
              if "overhead" in parts else [])
    link_right, link_clean, link_busy, link_runs = (links(args.link_runs) if "link" in parts
                                                    else (0, 0, 0, 0))
    noise_wrong, noise_clean, noise_right, noise_slow = (
        noise(args.noise_runs, [int(b) for b in args.noise_busy.split(",")], args.record)
        if "noise" in parts else (0, 0, 0, 0))
    print(f"({time.monotonic() - began:.0f} s)")
    print(f"straggler detected={right}/{runs} clean_named={named}/{args.clean} "
          f"max_delay_steps={delay} stalls={stall_right}/{stall_runs} "
          f"stall_periods_max={stall_periods:.1f} busy_named={busy_named}/{args.busy_clean} "
          f"busy_said={busy_said}/{args.busy_clean} link_named={link_right}/{link_runs} "
          f"link_clean={link_clean}/{link_runs} link_busy={link_busy}/{link_runs} "
          f"noise_named={noise_wrong}/{noise_clean} noise_detected={noise_right}/{noise_slow} "
          f"{' '.join(ratios)}")


if __name__ == "__main__":
    main()
