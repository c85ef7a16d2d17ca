"""The notebook's environment shipped to a cluster's executors (issue 39), on a standalone
cluster of two one-core workers on loopback.

  pack      ``ship_environment()`` of this project's own ``.venv`` (TensorFlow, PyTorch, Horovod,
            Spark: the environment a user would ship), packed with venv-pack into an empty
            cache: seconds and the archive's size
  first     the first job after it (Spark sends the archive and each executor unpacks it)
  shipped   later jobs of the same application (nothing sent or unpacked again)
  installed the same job with nothing shipped: the executors' own Python has everything
The jobs: a trivial DDP job (init_process_group, one all_reduce; its rank 0 checked to run the
archive's Python and PyTorch exactly when shipped), ``--runs`` pairs of shipped
and installed in alternating order.
Usage: .venv/bin/python benchmarks/environment_shipping.py [--runs 4] [--prefix PATH]
Last line: environment_shipping pack_s=<s> archive_mb=<MB> unpacked_mb=<MB> first_job_s=<s>
shipped_job_s=<s> installed_job_s=<s> launch_ratio=<x> (shipped over installed, median of the
per-pair ratios with min and max; goal <= 1.1)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pairs import in_turn, ratio_text  # benchmarks/pairs.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def trivial():
    """One all_reduce; where rank 0's Python and PyTorch came from."""
    import sys

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    return value.item(), sys.executable, torch.__file__


def checked(result, shipped: bool) -> None:
    """The job summed right, and its rank ran in the shipped archive exactly when shipped."""
    total, executable, torch_file = result
    assert total == 2.0, result
    inside = "/hvd_env_" in executable and "/hvd_env_" in torch_file
    assert inside == shipped, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--prefix", default=sys.prefix, help="the environment to ship")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="hvd-env-bench-")
    os.environ["XDG_CACHE_HOME"] = cache  # an empty cache: the pack is measured, not found
    from hvd_magics import HorovodRunner, ship_environment
    from hvd_magics.job.session import SESSION
    from hvd_magics.launch.environment_shipping import environment_facts
    from tests.standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=2)
    try:
        cluster.session("environment_shipping")
        run = HorovodRunner(np=2, engine="torch")
        checked(run.run(trivial), False)  # warm: the executors' Python workers and imports
        began = time.monotonic()
        choice = ship_environment(args.prefix)
        pack_s = time.monotonic() - began
        archive = next(Path(cache).rglob("env-*.tar.gz"))
        began = time.monotonic()
        first = run.run(trivial)
        first_s = time.monotonic() - began
        checked(first, True)
        print(f"the ranks ran {first[1]} with torch from {first[2]}")
        shipped, installed = [], []
        for index in range(args.runs):
            for kind in in_turn(index, ["shipped", "installed"]):
                SESSION.environment = choice if kind == "shipped" else None
                began = time.monotonic()
                checked(run.run(trivial), kind == "shipped")
                (shipped if kind == "shipped" else installed).append(time.monotonic() - began)
        facts = environment_facts(args.prefix, measure=True)
        print(f"pack: {pack_s:.1f} s, {archive.stat().st_size / 1e6:.0f} MB archive of "
              f"{facts.size / 1e6:.0f} MB; first job {first_s:.1f} s; shipped {shipped}; "
              f"installed {installed}")
        print(f"environment_shipping pack_s={pack_s:.1f} "
              f"archive_mb={archive.stat().st_size / 1e6:.0f} unpacked_mb={facts.size / 1e6:.0f} "
              f"first_job_s={first_s:.2f} shipped_job_s={statistics.median(shipped):.2f} "
              f"installed_job_s={statistics.median(installed):.2f} "
              + ratio_text("launch_ratio", shipped, installed))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
