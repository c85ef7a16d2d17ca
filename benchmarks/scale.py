"""64 ranks on 16 hosts against 2 (issue 85), on real hosts made on this machine (tests/hosts.py:
one network namespace per host, its own address, name and /tmp, a standalone worker of
``--cores`` cores inside). One cluster of ``--hosts`` hosts; one SparkSession.

start    a trivial job per engine (``torch``: ``init_process_group`` and one ``all_reduce``;
         ``horovod``: ``hvd.init()`` and one ``allreduce``) at each size of ``--sizes``, 4 ranks
         per task (2 ranks: one per task), warm (see :func:`start_times`); the wall time of
         ``HorovodRunner.run``, its parts (to the ranks' start, ``init``, the collective, back)
         and its ratio to 2 ranks, medians of ``--runs``. Goal: at most 3.
driver   ``--train-s`` seconds of a DDP loop of a step every 0.1 s with progress reported, at each
         size: the driver's CPU seconds per second (this Python process, all its threads) and
         its watch turns (their count and CPU seconds each). Goal: at most 0.25 s/s at 64.
lines    the text a 64-rank job of 3 epochs printed in a cell (``HorovodRunner``'s output);
         goal: at most 40 lines.
memory   RSS and PSS per rank and per host while the biggest size's ranks train.
kill     a rank of the biggest size SIGKILLed mid-job: seconds from the kill to the job's end,
         and whether the error's first line names that rank. Goal: at most 1 s.
cut      a host of the biggest size cut mid-job: seconds from the cut to the job's end, and
         whether the error's first line names that host. Goal: at most 10 s.

Needs root (network namespaces). Usage:
  .venv/bin/python benchmarks/scale.py [--hosts 16] [--cores 4] [--sizes 2,8,16,32,64]
      [--engines torch,horovod] [--runs 1] [--train-s 20]
      [--parts start,driver,lines,memory,kill,cut]
Last lines: scale engine=<e> ranks=<n> start_s=<s> ratio=<x>, scale driver ranks=<n>
cpu_per_s=<x> turn_cpu_ms=<x>, scale lines=<n>, scale memory ..., scale kill_s=<s> named=<bool>,
scale cut_s=<s> named=<bool>
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

from pairs import hosts_session  # benchmarks/pairs.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "tests" / "spark-conf"))


def torch_trivial():
    import time

    import torch
    import torch.distributed as dist

    began, cpu = time.time(), time.process_time()  # after the imports (its zygote's)
    dist.init_process_group("gloo")
    joined, init_cpu = time.time(), time.process_time() - cpu
    total = torch.ones(1)
    dist.all_reduce(total)
    mine, views = (began, joined, time.time(), cpu, init_cpu), [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    return views


def horovod_trivial():
    import time

    import horovod.torch as hvd
    import torch

    began, cpu = time.time(), time.process_time()
    hvd.init()
    joined, init_cpu = time.time(), time.process_time() - cpu
    hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return hvd.allgather_object((began, joined, time.time(), cpu, init_cpu))


TRIVIAL = {"torch": torch_trivial, "horovod": horovod_trivial}


def ddp_train(seconds: float = 20.0, epochs: int = 1, step_s: float = 0.1):
    """A DDP loop of a step every ``step_s`` with progress reported, for ``seconds``."""
    import os
    import time

    import torch
    import torch.distributed as dist

    import hvd_magics

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = max(1, int(seconds / step_s / epochs))
    for epoch in range(1, epochs + 1):
        hvd_magics.progress.start_epoch(epoch, epochs, steps, 8)
        for step in range(1, steps + 1):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 8)).pow(2).mean()
            loss.backward()
            optimizer.step()
            hvd_magics.progress.report(step, loss=loss.item())
            time.sleep(step_s)  # the same on every rank (not a pace: that makes one rank late)
        hvd_magics.progress.end_epoch(samples=steps * 8, loss=loss.item())
    return os.getpid()


def _session(cluster):
    # 16 executors of 1g ran this machine out of memory
    return hosts_session(cluster, "scale", wait_s=120, **{
        "spark.executor.memory": "512m", "spark.executor.extraJavaOptions": "-XX:+UseSerialGC"})


def _runner(size: int, **options):
    from hvd_magics import HorovodRunner

    return HorovodRunner(np=size, ranks_per_task=1 if size < 4 else 4, start_timeout=600,
                         driver_log_verbosity="log_callback_only", **options)


def _phases(launched: float, views: list, returned: float) -> str:
    """Where a trivial job's time went: to the ranks' start (the last rank's function began),
    to their meeting (the last rank's ``init`` returned), to the first collective, and back;
    and the CPU seconds a rank's process used before the job's function began and in ``init``
    (medians over the ranks): what each host pays per rank, in parallel on a real cluster,
    where here 64 ranks share 2 cores."""
    entered = max(v[0] for v in views)
    joined = max(v[1] for v in views)
    reduced = max(v[2] for v in views)
    return (f"to_ranks={entered - launched:.2f} spread={entered - min(v[0] for v in views):.2f}"
            f" init={joined - entered:.2f} collective={reduced - joined:.2f} "
            f"back={returned - reduced:.2f} rank_start_cpu={statistics.median(v[3] for v in views):.3f}"
            f" rank_init_cpu={statistics.median(v[4] for v in views):.3f}")


def start_times(sizes: list[int], engines: list[str], runs: int) -> None:
    """Warm first: every size of every engine once, the largest first, so that every host has
    the zygotes and Python workers each layout uses (Spark places a job's tasks where it likes:
    a 2-rank job warmed once may land on two other hosts next time, and one cold zygote there
    is 5 s), then the 2-rank layout ``WARM_SMALL`` times more; then ``runs`` timed runs of each
    size in turn (sizes alternating, so that a slow minute of the machine does not fall on one
    size alone)."""
    for engine in engines:
        for size in sorted(sizes, reverse=True):
            began = time.monotonic()
            _runner(size, engine=engine, timeout=600).run(TRIVIAL[engine])
            print(f"  {engine} {size} ranks, warming: {time.monotonic() - began:.1f} s", flush=True)
        for _ in range(WARM_SMALL):
            _runner(min(sizes), engine=engine, timeout=600).run(TRIVIAL[engine])
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(runs):
        for engine in engines:
            for size in sizes:
                began, launched = time.monotonic(), time.time()
                views = _runner(size, engine=engine, timeout=600).run(TRIVIAL[engine])
                times.setdefault((engine, size), []).append(time.monotonic() - began)
                print(f"  {engine} {size} ranks: {times[engine, size][-1]:.2f} s: "
                      f"{_phases(launched, views, time.time())}", flush=True)
    for engine in engines:
        base = statistics.median(times[engine, min(sizes)])
        for size in sizes:
            median = statistics.median(times[engine, size])
            print(f"scale engine={engine} ranks={size} start_s={median:.2f} "
                  f"ratio={median / base:.2f} runs="
                  f"{','.join(f'{t:.2f}' for t in times[engine, size])}", flush=True)


#: Extra warm-up runs of the smallest size (one task a rank: they land where Spark likes).
WARM_SMALL = 3


def _wait_for_steps(job, size: int) -> None:
    """Until every rank of ``job`` reported a step."""
    while not job.done():
        ranks = list(getattr(job.live.job, "ranks", None) or [])
        if len(ranks) == size and all(rank.step for rank in ranks):
            return
        time.sleep(0.05)


def driver_cost(sizes: list[int], seconds: float) -> None:
    """The driver's CPU while ranks train: this process's (every thread's) per second, and the
    watch loop's turns (:class:`hvd_magics.job.watch.loop.FixedWatch`): how many, and the CPU
    of each, on the thread's own clock."""
    from hvd_magics.job.watch.loop import FixedWatch

    turns: list[float] = []
    plain = FixedWatch.turn

    def timed(self):
        began = time.thread_time()
        try:
            return plain(self)
        finally:
            turns.append(time.thread_time() - began)

    FixedWatch.turn = timed
    try:
        for size in sizes:
            job = _runner(size, engine="torch", timeout=600).start(ddp_train, seconds=seconds)
            _wait_for_steps(job, size)
            turns.clear()
            cpu, wall = time.process_time(), time.monotonic()
            while not job.done() and time.monotonic() - wall < seconds * 0.8:
                time.sleep(0.1)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            counted = list(turns)
            job.wait(timeout=600)
            print(f"scale driver ranks={size} cpu_per_s={cpu / wall:.3f} turns_per_s="
                  f"{len(counted) / wall:.1f} turn_cpu_ms={1000 * statistics.mean(counted):.2f} "
                  f"turn_cpu_per_s={sum(counted) / wall:.3f}", flush=True)
    finally:
        FixedWatch.turn = plain


def cell_lines(size: int) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        from hvd_magics import HorovodRunner

        HorovodRunner(np=size, ranks_per_task=4, engine="torch", timeout=300).run(
            ddp_train, seconds=6, epochs=3)
    text = out.getvalue()
    print(text)
    print(f"scale lines={len(text.splitlines())} ranks={size}", flush=True)


def _memory_of(pid: int) -> tuple[int, int]:
    rss = pss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


def memory(size: int) -> None:
    job = _runner(size, engine="torch", timeout=300).start(ddp_train, seconds=15)
    _wait_for_steps(job, size)
    time.sleep(2)  # the ranks train: a point in the job, not a condition waited for
    ranks = job.live.job.ranks
    per_host: dict[str, list[tuple[int, int]]] = {}
    for rank in ranks:
        if getattr(rank, "pid", None):
            per_host.setdefault(rank.host, []).append(_memory_of(rank.pid))
    job.wait(timeout=600)
    everything = [m for host in per_host.values() for m in host]
    print(f"scale memory ranks={len(everything)} rss_mb_per_rank="
          f"{statistics.median(r for r, _ in everything) / 1024:.0f} pss_mb_per_rank="
          f"{statistics.median(p for _, p in everything) / 1024:.0f} pss_mb_per_host="
          f"{statistics.median(sum(p for _, p in h) for h in per_host.values()) / 1024:.0f}",
          flush=True)


def _fault_to_end(size: int, fault) -> tuple[float, str]:
    """Start a ``size``-rank DDP job, let every rank step, do ``fault(job)``; the seconds from
    the fault to the job's end, and its error's first line."""
    from hvd_magics import HorovodRunner
    from hvd_magics.errors import HorovodJobError

    job = HorovodRunner(np=size, ranks_per_task=4, engine="torch", timeout=600,
                        start_timeout=600).start(ddp_train, seconds=300)
    _wait_for_steps(job, size)
    fault(job)
    began, first = time.monotonic(), ""
    try:
        job.wait(timeout=300)
    except HorovodJobError as error:
        first = str(error).splitlines()[0]
    ended = time.monotonic() - began
    print(f"  first line: {first}")
    return ended, first


def cut_host(size: int) -> None:
    """A host of the job's cut mid-training (its link down): seconds from the cut to the job's
    end, and whether the error's first line names that host."""
    cut: list = []

    def fault(job) -> None:
        address = job.live.job.ranks[size - 1].host
        cut.append(next(h for h in CLUSTER[0].hosts if h.address == address))
        cut[0].cut()

    ended, first = _fault_to_end(size, fault)
    cut[0].restore()
    print(f"scale cut_s={ended:.1f} named={cut[0].address in first} ranks={size}", flush=True)


def kill_rank(size: int) -> None:
    """A rank of the job SIGKILLed mid-training (no notice, as the OOM killer): seconds from the
    kill to the job's end, and whether the error's first line names that rank."""
    import signal

    victim = size // 2 + 1
    ended, first = _fault_to_end(
        size, lambda job: os.kill(job.live.job.ranks[victim].pid, signal.SIGKILL))
    print(f"scale kill_s={ended:.2f} named={f'rank {victim} ' in first} ranks={size}",
          flush=True)


#: The cluster of the run (for the cut).
CLUSTER: list = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--cores", type=int, default=4)
    parser.add_argument("--sizes", default="2,8,16,32,64")
    parser.add_argument("--engines", default="torch,horovod")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--train-s", type=float, default=20.0)
    parser.add_argument("--parts", default="start,driver,lines,memory,kill,cut")
    args = parser.parse_args()
    from tests.hosts import HostCluster

    sizes = [int(s) for s in args.sizes.split(",")]
    parts = args.parts.split(",")
    began = time.monotonic()
    os.environ.setdefault("SPARK_DAEMON_MEMORY", "256m")  # the hosts' workers' heaps
    cluster = HostCluster(hosts=args.hosts, cores=args.cores)
    CLUSTER.append(cluster)
    spark = None
    try:
        spark = _session(cluster)
        print(f"cluster of {args.hosts} hosts x {args.cores} cores up in "
              f"{time.monotonic() - began:.1f} s", flush=True)
        if "start" in parts:
            start_times(sizes, args.engines.split(","), args.runs)
        if "driver" in parts:
            driver_cost(sizes, args.train_s)
        if "lines" in parts:
            cell_lines(max(sizes))
        if "memory" in parts:
            memory(max(sizes))
        if "kill" in parts:
            kill_rank(max(sizes))
        if "cut" in parts:
            cut_host(max(sizes))
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
