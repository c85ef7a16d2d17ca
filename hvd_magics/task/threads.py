"""How many threads a rank's frameworks use: its share of the cores it runs on.

Left alone, every rank's OpenMP pool (PyTorch's intra-op threads, NumPy's BLAS) takes every core
of its host, and ranks that share a host spin on each other's cores: two PyTorch ranks on two
cores, 200 small steps, used 14.4 CPU seconds over 7.6 s with a pool of two threads each, 4.6
over 2.5 s with one. Each rank's ``OMP_NUM_THREADS`` is therefore its share of the cores given
to it, as torchrun (one thread per process when it starts several) and Ray (the CPUs of the
worker) set it: the driver's cores over its ``np<0`` ranks; in a Spark task, the task's CPUs
(``spark.task.cpus``) over the ranks it runs (Spark 4 gives each Python worker the task's CPUs,
which a task of several ranks would give each of them). A rank alone (``np=-1``, a task of one
rank) is left as it was: it has the cores, and the variable is part of its zygote's key
(frameworks read it on import), which then stays what it was. A value the job's environment sets
(``--env OMP_NUM_THREADS=8``, ``HorovodRunner(env=...)``) wins, and on the driver so does the
notebook's own.
"""
from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping

from hvd_magics.protocol import ENV_OMP_THREADS


def thread_share(cores: int, ranks: int) -> int:
    """Each of ``ranks`` ranks' share of ``cores`` cores: at least one thread."""
    return max(1, cores // max(1, ranks))


def driver_cores() -> int:
    """The cores this process may run on (its affinity, as a container or ``taskset`` limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def task_cpus(context: Any) -> int:
    """The CPUs Spark gave the task of ``context`` (its ``TaskContext``; ``None`` outside a
    task, or a Spark too old to say: the cores of this process)."""
    try:
        return max(1, int(context.cpus())) if context is not None else driver_cores()
    except Exception:  # noqa: BLE001 - a Spark without TaskContext.cpus()
        return driver_cores()


def with_thread_share(base: Mapping[str, str], job_env: Mapping[str, str], cores: int,
                      ranks: int, keep_base: bool) -> dict[str, str]:
    """``base`` with ``OMP_NUM_THREADS`` set to each rank's share of ``cores`` over ``ranks``
    when there are several, unless ``job_env`` sets it, or ``keep_base`` and ``base`` does (the
    notebook's own setting; a Spark worker's is Spark's default, the task's CPUs, and is
    replaced)."""
    env = dict(base)
    if ranks <= 1 or ENV_OMP_THREADS in job_env or (keep_base and ENV_OMP_THREADS in env):
        return env  # a rank alone has the cores: left as it was, its zygote too
    env[ENV_OMP_THREADS] = str(thread_share(cores, ranks))
    return env
