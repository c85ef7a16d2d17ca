"""A host lost mid-training (issue 58), on real hosts made on this machine (tests/hosts.py: one
network namespace per host, its own address, name and /tmp, a standalone worker inside): three
one-core hosts, a DDP or Horovod job of 2 ranks with ``restarts=1`` and a checkpoint every 5
steps in a folder every host shares; once the job has checkpointed, the link of rank 1's host
is cut (``ip link set ... down``). Measured, per engine, ``--runs`` times:
  ended     seconds from the cut to the end of the attempt that lost the host, as our driver
            finds it (its ranks' supervisors beat every second; a host silent 10 s is lost)
  resumed   seconds from the cut to the next attempt's first training step
  spark     the same job with our detection off (``HVD_MAGICS_HOST_SILENT_S=100000``): seconds
            from the cut to the attempt's end as Spark (its executor heartbeat timeout) and Gloo
            find it (``--spark-runs`` of them; 0 leaves it out)
Needs root (network namespaces). Usage:
  .venv/bin/python benchmarks/lost_host.py [--runs 3] [--spark-runs 1] [--engines torch,horovod]
Last line per engine: lost_host engine=<e> ended_s=<s> resumed_s=<s> spark_ended_s=<s>
ratio_vs_spark=<ended/spark> (medians; goals: ended_s <= 20, resumed_s <= 45)
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from pairs import hosts_session  # benchmarks/pairs.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "tests" / "spark-conf"))


def one_run(engine: str, ours: bool) -> tuple[float, float | None]:
    """``(seconds from the cut to the attempt's end, to the next attempt's first step)``."""
    from hvd_magics import HorovodRunner
    from hvd_magics.errors import HorovodJobError
    from tests import engine_jobs
    from tests.hosts import HostCluster

    import cloudpickle

    cloudpickle.register_pickle_by_value(engine_jobs)
    os.environ["HVD_MAGICS_HOST_SILENT_S"] = "10" if ours else "100000"
    cluster = HostCluster(hosts=3, cores=1)
    folder = Path("/var/tmp") / f"hvd-magics-bench-{os.getpid()}-{time.monotonic_ns()}"
    spark = None
    try:
        spark = hosts_session(cluster, "lost_host")
        job = HorovodRunner(np=2, engine=engine, restarts=1 if ours else 0,
                            checkpoint_dir=folder).start(
            engine_jobs.steps_with_checkpoints, steps=400, every=5, engine=engine, step_s=0.05)
        while not list((folder / "checkpoints").glob("ckpt-1[05]-*")):
            if job.done():
                raise RuntimeError(f"the job ended before the cut: {job.wait()}")
            time.sleep(0.1)
        host = job.live.job.ranks[1].host
        next(h for h in cluster.hosts if h.address == host).cut()
        cut = time.time()
        first = job.live.record
        try:
            resumed = job.wait(timeout=600)
        except HorovodJobError:
            resumed = None
        ended = (first.ended_at.timestamp() - cut) if first.ended_at else float("nan")
        job.stop()
        return ended, (resumed["first_step_at"] - cut) if resumed else None
    finally:
        for host in cluster.hosts:
            host.restore()
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--spark-runs", type=int, default=1)
    parser.add_argument("--engines", default="torch,horovod")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        ours = [one_run(engine, True) for _ in range(args.runs)]
        spark = [one_run(engine, False)[0] for _ in range(args.spark_runs)]
        for ended, resumed in ours:
            print(f"  {engine}: attempt ended {ended:.1f} s after the cut, next attempt's first "
                  f"step {resumed:.1f} s after it" if resumed else f"  {engine}: {ended:.1f} s")
        for ended in spark:
            print(f"  {engine}, our detection off: the job ended {ended:.1f} s after the cut")
        ended_s = statistics.median(e for e, _ in ours)
        resumed_s = statistics.median(r for _, r in ours if r is not None)
        spark_s = statistics.median(spark) if spark else float("nan")
        print(f"lost_host engine={engine} ended_s={ended_s:.1f} resumed_s={resumed_s:.1f} "
              f"spark_ended_s={spark_s:.1f} ratio_vs_spark={ended_s / spark_s:.3f}")


if __name__ == "__main__":
    main()
