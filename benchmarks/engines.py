"""Our torch engine against pyspark's TorchDistributor, side by side on one warm local[2] session.

Two DDP (Gloo) jobs, each run by three candidates in alternating order, ``--runs`` times:
  ours      hvd_magics.HorovodRunner(np=2, engine="torch").run(fn)
  dropin    hvd_magics.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)
  pyspark   pyspark.ml.torch.distributor.TorchDistributor(the same arguments).run(fn)
and, after them (it holds both task slots while it lives), a warm pool:
  pool      HorovodPool(np=2, engine="torch").run(fn), the process group kept across runs
Jobs:
  trivial   init_process_group, one all_reduce, return: the launch cost (wall time of the call)
  mlp       an MNIST-shaped MLP (784-256-10) on generated data, DDP, 3 epochs of 128 steps of
            64 rows per rank; rank 0 times epochs 2 and 3 itself: steps per second
and, last (its worker nodes hold both task slots while it lives), Ray on Spark when ray is
installed (``pip install 'ray[train]==2.60.0'``; ``--no-ray`` skips it):
  ray       ray.util.spark.setup_ray_cluster(max_worker_nodes=2) once, then each job as Ray
            Train's TorchTrainer(fn, ScalingConfig(num_workers=2)).fit(): the cluster stays up
            between jobs, as our warm pool's ranks do
Usage: .venv/bin/python benchmarks/engines.py [--runs 3] [--no-ray]
Last line: engines ours_trivial_s=<s> pyspark_trivial_s=<s> pool_trivial_s=<s> launch_ratio=<x>
dropin_launch_ratio=<x> steps_ratio=<x> (ratios: ours over pyspark, medians of per-run ratios
with their min and max); with Ray: ray_setup_s=<s> ray_first_s=<s> ray_trivial_s=<s>
cold_vs_ray=<x> (our cold job over Ray's set-up plus its first job) warm_vs_ray=<x> (our pool's
trivial job over Ray's on its standing cluster) steps_vs_ray=<x> (our steps/s over Ray's)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from pairs import jobs_in_turn, local_session, pair_ratios, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def trivial():
    """Join the process group (once: a warm pool keeps it), one all_reduce, return."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    return {"value": value.item()}


def mlp(epochs: int = 3, steps: int = 128, batch: int = 64):
    """DDP training of a 784-256-10 MLP; rank 0's steps per second over epochs 2.. ."""
    import time

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.rand(steps * batch, 784, generator=generator)
    y = torch.randint(0, 10, (steps * batch,), generator=generator)
    began = None
    for epoch in range(epochs):
        if epoch == 1:
            began = time.perf_counter()
        for step in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[step * batch:(step + 1) * batch]),
                                                     y[step * batch:(step + 1) * batch])
            loss.backward()
            optimizer.step()
    return {"steps_per_s": (epochs - 1) * steps / (time.perf_counter() - began),
            "loss": loss.item()}


def ray_job(job, result_file: str):
    """``job`` as Ray Train's training function: rank 0 leaves its result in ``result_file``
    (Ray Train 2.60's ``Result`` carries no metrics without a checkpoint)."""
    def train_loop():
        import json

        import ray.train

        result = job()
        if ray.train.get_context().get_world_rank() == 0:
            with open(result_file, "w") as out:
                json.dump(result, out)

    return train_loop


def standing_runs(name: str, run_job, runs: int, wall: dict, speed: dict) -> None:
    """``runs`` of each job through ``run_job`` (a warm pool's or a standing cluster's), timed:
    wall times into ``wall[name, job]``, the MLP's steps/s into ``speed[name]``."""
    for run in range(runs):
        for job in (trivial, mlp):
            began = time.perf_counter()
            result = run_job(job)
            took = time.perf_counter() - began
            wall.setdefault((name, job.__name__), []).append(took)
            if job is mlp:
                speed.setdefault(name, []).append(result["steps_per_s"])
            print(f"run {run} {job.__name__:7s} {name:8s} {took:6.2f} s"
                  + (f", {result['steps_per_s']:6.1f} steps/s on rank 0" if job is mlp
                     else ""), flush=True)


#: What starts the line of figures the Ray child prints (Ray prints lines of its own, later too).
_RAY_FIGURES = "ray-figures "


def ray_in_its_own_process(runs: int, wall: dict, speed: dict) -> dict[str, float]:
    """:func:`ray_candidate` in a child process with its own local session: pyspark 4.3's
    Python workers take the ``google`` package from Spark's jar (Ray's resource probe then fails
    to import protobuf) unless ``site-packages`` is on ``PYTHONPATH``, and the runs made with
    that setting for the whole benchmark hung in pyspark's TorchDistributor (a rank aborted at
    exit), so only Ray gets it. Wall times and steps/s into ``wall`` and ``speed``; the set-up
    and first times."""
    import json
    import subprocess
    import sysconfig

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (sysconfig.get_paths()["purelib"],
                                                    env.get("PYTHONPATH")) if p)
    child = subprocess.run([sys.executable, __file__, "--ray-only", "--runs", str(runs)],
                           env=env, stdout=subprocess.PIPE, text=True, check=True)
    lines = child.stdout.strip().splitlines()
    found = [line for line in lines if line.startswith(_RAY_FIGURES)]
    print("\n".join(line for line in lines if not line.startswith(_RAY_FIGURES)), flush=True)
    got = json.loads(found[-1][len(_RAY_FIGURES):])
    for job, times in got["wall"].items():
        wall[("ray", job)] = times
    speed["ray"] = got["speed"]
    return got["times"]


def ray_candidate(runs: int, wall: dict, speed: dict) -> dict[str, float]:
    """Ray on Spark: its set-up, its first job, then ``runs`` of each job on the standing
    cluster (wall times into ``wall``, steps/s into ``speed``); the set-up and first times."""
    import json
    import tempfile

    import ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    result_file = os.path.join(tempfile.mkdtemp(), "result.json")
    # `ray start` is run from PATH: the one beside this Python when the venv is not activated
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable),
                                          os.environ.get("PATH", "")])

    def fit(job) -> dict:
        TorchTrainer(ray_job(job, result_file),
                     scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()
        with open(result_file) as got:
            return json.load(got)

    began = time.perf_counter()
    setup_ray_cluster(max_worker_nodes=2, collect_log_to_path=tempfile.mkdtemp())
    ray.init(log_to_driver=False)
    times = {"setup": time.perf_counter() - began}
    began = time.perf_counter()
    fit(trivial)
    times["first"] = time.perf_counter() - began
    print(f"ray      set-up {times['setup']:6.2f} s, first job {times['first']:6.2f} s",
          flush=True)
    try:
        standing_runs("ray", fit, runs, wall, speed)
    finally:
        ray.shutdown()
        shutdown_ray_cluster()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true", help="leave Ray on Spark out")
    parser.add_argument("--ray-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray_only:  # the child of ray_in_its_own_process: its figures as JSON, last
        import json

        local_session("engines-ray")
        wall: dict = {}
        speed: dict = {}
        times = ray_candidate(args.runs, wall, speed)
        print(_RAY_FIGURES + json.dumps({"times": times, "speed": speed["ray"],
                                         "wall": {job: t for (_, job), t in wall.items()}}),
              flush=True)
        return
    try:
        import ray  # noqa: F401
        with_ray = not args.no_ray
    except ImportError:
        print("ray: not installed, left out (pip install 'ray[train]==2.60.0')")
        with_ray = False

    from pyspark.ml.torch.distributor import TorchDistributor as PysparkDistributor

    from hvd_magics import HorovodPool, HorovodRunner, TorchDistributor

    local_session("engines")
    candidates = {
        "ours": lambda fn: HorovodRunner(np=2, engine="torch").run(fn),
        "dropin": lambda fn: TorchDistributor(num_processes=2, local_mode=False,
                                              use_gpu=False).run(fn),
        "pyspark": lambda fn: PysparkDistributor(num_processes=2, local_mode=False,
                                                 use_gpu=False).run(fn),
    }
    wall: dict[tuple[str, str], list[float]] = {}
    speed: dict[str, list[float]] = {name: [] for name in candidates}
    for name, run_job in candidates.items():  # warm up: Python workers, imports, page cache
        run_job(trivial)
    jobs_in_turn(candidates, (trivial, mlp), args.runs, mlp, wall, speed)
    with HorovodPool(np=2, engine="torch") as pool:
        pool.run(trivial)  # the first run joins the process group
        standing_runs("pool", pool.run, args.runs, wall, speed)
    ray_times = ray_in_its_own_process(args.runs, wall, speed) if with_ray else None
    for name in [*candidates, "pool", *(["ray"] if ray_times else [])]:
        print(f"{name:8s} trivial median {statistics.median(wall[name, 'trivial']):5.2f} s, mlp "
              f"median {statistics.median(wall[name, 'mlp']):5.2f} s at "
              f"{statistics.median(speed[name]):6.1f} steps/s")
    launch = pair_ratios(wall["ours", "trivial"], wall["pyspark", "trivial"])
    print(f"engines ours_trivial_s={statistics.median(wall['ours', 'trivial']):.2f} "
          f"pyspark_trivial_s={statistics.median(wall['pyspark', 'trivial']):.2f} "
          f"pool_trivial_s={statistics.median(wall['pool', 'trivial']):.3f} "
          f"launch_ratio={launch[0]:.3f} launch_ratio_min={launch[1]:.3f} "
          f"launch_ratio_max={launch[2]:.3f} "
          + ratio_text("dropin_launch_ratio", wall["dropin", "trivial"],
                       wall["pyspark", "trivial"]) + " "
          + ratio_text("mlp_wall_ratio", wall["ours", "mlp"], wall["pyspark", "mlp"]) + " "
          + ratio_text("steps_ratio", speed["ours"], speed["pyspark"]))
    if ray_times:
        cold = [t / (ray_times["setup"] + ray_times["first"]) for t in wall["ours", "trivial"]]
        print(f"ray ray_setup_s={ray_times['setup']:.2f} ray_first_s={ray_times['first']:.2f} "
              f"ray_trivial_s={statistics.median(wall['ray', 'trivial']):.2f} "
              f"cold_vs_ray={statistics.median(cold):.3f} "
              + ratio_text("warm_vs_ray", wall["pool", "trivial"], wall["ray", "trivial"]) + " "
              + ratio_text("steps_vs_ray", speed["ours"], speed["ray"]))


if __name__ == "__main__":
    main()
