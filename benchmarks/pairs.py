"""What the benchmarks share: ratios that mean the same from run to run on a shared 2-core
machine, the one warm local SparkSession they measure on, and a view that times the phases of
our launch.

Each benchmark measures its candidates in interleaved pairs, alternating the order (A then B, then
B then A), and reports the median of the per-pair ratios with their min and max: drift in the
machine's speed during a run cancels within a pair instead of landing on one side.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def in_turn(run: int, candidates: Sequence[T]) -> list[T]:
    """The order of ``candidates`` in run ``run``: as given on even runs, reversed on odd ones."""
    return list(candidates) if run % 2 == 0 else list(reversed(candidates))


def jobs_in_turn(candidates: dict, jobs: Sequence, runs: int, rated: Callable,
                 wall: dict, speed: dict) -> None:
    """Run each of ``jobs`` by each candidate (``name -> run(job) -> result``), in alternating
    order, ``runs`` times; add each call's seconds to ``wall[name, job name]`` and, for the job
    ``rated``, its result's ``steps_per_s`` to ``speed[name]``; a line per call."""
    for run in range(runs):
        for job in jobs:
            for name in in_turn(run, list(candidates)):
                began = time.perf_counter()
                result = candidates[name](job)
                took = time.perf_counter() - began
                wall.setdefault((name, job.__name__), []).append(took)
                if job is rated:
                    speed.setdefault(name, []).append(result["steps_per_s"])
                print(f"run {run} {job.__name__:7s} {name:8s} {took:6.2f} s"
                      + (f", {result['steps_per_s']:6.1f} steps/s on rank 0" if job is rated
                         else ""), flush=True)


def pair_ratios(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(median, min, max)`` of ``a[i] / b[i]`` over the pairs."""
    ratios = [x / y for x, y in zip(a, b)]
    return statistics.median(ratios), min(ratios), max(ratios)


def ratio_text(name: str, a: Sequence[float], b: Sequence[float]) -> str:
    """``name=<median> name_min=<min> name_max=<max>`` for a benchmark's last line."""
    med, low, high = pair_ratios(a, b)
    return f"{name}={med:.3f} {name}_min={low:.3f} {name}_max={high:.3f}"


def local_session(app: str, driver_memory: str | None = None, master: str = "local[2]"):
    """The benchmarks' SparkSession: ``local[2]`` (or ``master``), quiet, on loopback."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1"))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def hosts_session(cluster, app: str, wait_s: float = 60, **conf: str):
    """A quiet SparkSession on the namespace hosts of ``cluster`` (tests/hosts.py), with
    ``conf`` over the cluster's own, once an executor of every host registered."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(cluster.url).appName(app)
    settings = {**cluster.session_conf(), "spark.ui.showConsoleProgress": "false", **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + wait_s
    while spark.sparkContext._jsc.sc().getExecutorIds().size() < len(cluster.hosts):
        if time.monotonic() > deadline:
            raise RuntimeError("the hosts' executors did not register")
        time.sleep(0.2)
    return spark


class PhaseTimer:
    """A JobView that notes when each phase of our launch ended (driver clock)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}
        self.seen: dict[str, set] = {}

    def on_event(self, job, event) -> None:
        kind = event["kind"]
        self.seen.setdefault(kind, set()).add(event["rank"])
        if len(self.seen[kind]) == job.size and kind not in self.marks:
            self.marks[kind] = time.monotonic() - self.start

    def on_tick(self, job) -> None:
        pass

    def on_end(self, job) -> None:
        self.marks["end"] = time.monotonic() - self.start
