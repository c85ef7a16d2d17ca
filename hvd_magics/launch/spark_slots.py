"""Spark task slots: how many a session's cluster has and has free, the refusal (at once, not
after Spark's retries) when a barrier stage of ``np`` tasks cannot run, and the slots of a local
master read from its URL."""
from __future__ import annotations

import os
import re
import time
from typing import Any

from hvd_magics.errors import NotEnoughSlotsError
from hvd_magics.launch.spark_session import is_connect, is_local

#: How long to wait for executors to register before saying the cluster is too small.
SLOT_WAIT_S = 5.0


def task_slots(sc: Any) -> tuple[int, int]:
    """``(free task slots, total task slots)`` of the cluster behind ``sc``."""
    jsc = sc._jsc.sc()
    try:
        total = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - internal API; fall back to the public estimate
        total = int(sc.defaultParallelism)
    busy = 0
    tracker = sc.statusTracker()
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            busy += info.numActiveTasks
    return max(total - busy, 0), total


def check_slots(sc: Any, np: int, wait_s: float = SLOT_WAIT_S, reads_data: bool = False,
                held: int = 0) -> None:
    """Raise at once (not after Spark's ten minutes of retries) when ``np`` tasks cannot run.

    On a cluster, executors may still be registering: wait up to ``wait_s`` for them.
    ``reads_data``: the job reads DataFrames (so the error offers no driver-only fallback).
    ``held``: slots that warm pools of this process hold, busy whatever Spark's status says.
    """
    if is_local(sc):
        wait_s = 0.0
    deadline = time.monotonic() + wait_s
    while True:
        free, total = task_slots(sc)
        free = min(free, max(total - held, 0))
        if free >= np:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    raise not_enough_slots(np, free, total, sc.master, sc.getConf().get("spark.task.cpus", "1"),
                           reads_data, held=held)


def not_enough_slots(np: int, free: int, total: int, master: str, cpus: str,
                     reads_data: bool = False, elastic_max: int | None = None, held: int = 0
                     ) -> NotEnoughSlotsError:
    """The error for ``np`` ranks on a cluster with ``free`` of ``total`` task slots (a job that
    reads DataFrames cannot fall back to ranks on the driver, so that fix is not offered).

    ``elastic_max``: the job is elastic, ``np:elastic_max``; ``np`` is the slots it needs to
    start, and the fix is said in its terms. ``held``: slots this process's warm pools and background jobs hold.
    """
    where = f"(master {master}, spark.task.cpus={cpus})"
    if elastic_max is not None:
        fix = (f"np={total}:{elastic_max}" if 0 < total else
               "a cluster with executors")
        return NotEnoughSlotsError(
            f"np={np}:{elastic_max} is an elastic job that needs at least {np} Spark task "
            f"slots to start (it takes up to {elastic_max} as they free up), but the cluster "
            f"has {total} {where}. Fix: lower the minimum ({fix}), or add executors or cores.")
    fallback = "" if reads_data else f", or use np=-{np} to run all ranks on the driver"
    pools = ("" if not held else
             f" This notebook's warm pools and background jobs hold {held} of the slots: run "
             "the cell on the pool (%%horovod without np, or HorovodRunner(np, pool=pool)) or "
             "free them with %hvd_pool stop (pool.close()); wait for the background job "
             "(job.wait()) or end it (job.stop()).")
    return NotEnoughSlotsError(
        f"np={np} needs {np} free Spark task slots at once (barrier mode), but the cluster has "
        f"{free} free of {total} {where}. Fix: {f'use np<={free}, ' if free > 0 else ''}"
        f"add executors or cores{fallback}.{pools}")


_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,")


def local_master_slots(master: str, task_cpus: int = 1) -> int | None:
    """Task slots of a local master (``local``, ``local[N]``, ``local[*]``, ``local-cluster``),
    or ``None`` for any other master (its size cannot be read from the URL)."""
    match = _LOCAL_MASTER.match(master.strip())
    if match:
        cores = match.group(1)
        count = 1 if cores is None else (os.cpu_count() or 1) if cores == "*" else int(cores)
        return count // max(task_cpus, 1)
    match = _LOCAL_CLUSTER.match(master.strip())
    if match:
        return int(match.group(1)) * (int(match.group(2)) // max(task_cpus, 1))
    return None


def all_task_slots(spark: Any) -> int | None:
    """Task slots of ``spark``'s cluster (``None`` when a Spark Connect server's master does not
    tell them)."""
    if not is_connect(spark):
        return task_slots(spark.sparkContext)[1]
    cpus = int(spark.conf.get("spark.task.cpus", "1") or 1)
    return local_master_slots(spark.conf.get("spark.master", "") or "", cpus)

