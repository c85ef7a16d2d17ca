"""A large allreduce across real hosts against the ring bound (issue 58), per engine: two hosts of
two cores made on this machine (tests/hosts.py: a network namespace per host, its own address,
name and /tmp, a standalone worker inside), what the second host receives limited to ``--rate``
(a token bucket on its link), four ranks, two per host. Each engine sums a ``--mb`` MB float32
tensor over the four ranks ``--runs`` times (after one warm-up sum), and the median is set against
the ring bound: a ring allreduce sends 2(p-1)/p of the tensor over each link of the ring, and two
of its links cross between the hosts, so ``2(p-1)/p x bytes / rate`` over the slowest link.
Needs root (network namespaces, tc). Usage:
  .venv/bin/python benchmarks/allreduce_hosts.py [--mb 64] [--rate 50mbit] [--runs 2]
      [--engines horovod,torch,tf]
Last line per engine: allreduce_hosts engine=<e> mb=<mb> rate=<rate> seconds=<median>
ring_bound_s=<s> ratio_vs_ring_bound=<seconds/bound> (1.0 is the link's own limit)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "tests" / "spark-conf"))


def timed_sums(engine: str, megabytes: int, runs: int) -> list[float]:
    """On every rank: ``runs`` timed sums of a ``megabytes`` MB tensor (one untimed first), as
    rank 0 measures them, each started together (a small sum before it)."""
    import time

    count = megabytes * 1024 * 1024 // 4
    took = []
    if engine == "tf":
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        for run in range(runs + 1):
            strategy.reduce("SUM", strategy.run(lambda: tf.ones([1])), axis=None)
            began = time.perf_counter()
            total = strategy.reduce("SUM", strategy.run(lambda: tf.ones([count])), axis=None)
            assert float(total[0]) == strategy.num_replicas_in_sync
            if run:
                took.append(time.perf_counter() - began)
        return took
    import torch

    tensor = torch.ones(count)
    if engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
        size = hvd.size()

        def sum_of(value):
            return hvd.allreduce(value, op=hvd.Sum)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        size = dist.get_world_size()

        def sum_of(value):
            value = value.clone()
            dist.all_reduce(value)
            return value
    for run in range(runs + 1):
        sum_of(torch.ones(1))
        began = time.perf_counter()
        total = sum_of(tensor)
        assert float(total[0]) == size
        if run:
            took.append(time.perf_counter() - began)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--engines", default="horovod,torch,tf")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from hvd_magics import HorovodRunner
    from tests.hosts import HostCluster

    rate_bits = float(args.rate.removesuffix("mbit")) * 1e6
    ranks = 4
    bound = 2 * (ranks - 1) / ranks * args.mb * 1024 * 1024 * 8 / rate_bits
    cluster = HostCluster(hosts=2, cores=2)
    spark = None
    try:
        builder = SparkSession.builder.master(cluster.url).appName("allreduce_hosts")
        for key, value in {**cluster.session_conf(),
                           "spark.ui.showConsoleProgress": "false"}.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        while spark.sparkContext._jsc.sc().getExecutorIds().size() < len(cluster.hosts):
            time.sleep(0.2)
        cluster.hosts[1].limit(args.rate)
        for engine in args.engines.split(","):
            took = HorovodRunner(np=ranks, engine=engine, timeout=900).run(
                timed_sums, engine=engine, megabytes=args.mb, runs=args.runs)
            seconds = statistics.median(took)
            print(f"  {engine}: {', '.join(f'{t:.2f}' for t in took)} s")
            print(f"allreduce_hosts engine={engine} mb={args.mb} rate={args.rate} "
                  f"seconds={seconds:.2f} ring_bound_s={bound:.2f} "
                  f"ratio_vs_ring_bound={seconds / bound:.3f}", flush=True)
    finally:
        cluster.hosts[1].limit(None)
        if spark is not None:
            spark.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
