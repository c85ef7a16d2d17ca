"""Spark task slots: how many a session's cluster has and has free, the refusal (at once, not
after Spark's retries) when a barrier stage of ``np`` tasks cannot run or a cluster has fewer slots
than an elastic job's minimum, and the slots of a local master read from its URL."""
from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from hvd_magics.errors import NotEnoughSlotsError
from hvd_magics.notices import say
from hvd_magics.protocol import ENV_DRIVER_HOST
from hvd_magics.options import DEFAULT_START_TIMEOUT_S, multiple_fix
from hvd_magics.launch.spark_session import is_connect, is_local

#: How long to wait for executors to register before saying the cluster is too small.
SLOT_WAIT_S = 5.0
#: On a local master, how long busy slots may take to be free before a job is refused: Spark's
#: status tracker counts the tasks of a job that just ended (its listener bus is asynchronous)
#: for a moment after the job's action returned.
LOCAL_SETTLE_S = 2.0


def task_slots(sc: Any) -> tuple[int, int]:
    """``(free task slots, total task slots)`` of the cluster behind ``sc``."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        total = int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - internal API; fall back to the public estimate
        total = int(sc.defaultParallelism)
    busy = 0
    tracker = sc.statusTracker()
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            busy += info.numActiveTasks
    return max(total - busy, 0), total


#: An executor seen this recently that is gone now may come back or be replaced: a job short
#: of slots waits for it (up to its start timeout), saying so every :data:`SAY_EVERY_S`.
GONE_RECENTLY_S = 600.0
SAY_EVERY_S = 5.0
#: Per application: each executor (``host:port``) seen, and when last (``time.monotonic()``);
#: and how many it had, when.
_SEEN: dict[str, dict[str, float]] = {}
_COUNTS: dict[str, list[tuple[float, int]]] = {}


def gone_executors(sc: Any, now: float) -> list[tuple[str, float]]:
    """Note the executors ``sc``'s application has now; when it has fewer than it had in the
    last :data:`GONE_RECENTLY_S` (one lost or decommissioned, and maybe coming back or being
    replaced: a replacement that came already is no loss), ``(host, seconds since last seen)``
    of each gone in that time, the most recent first."""
    try:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        present = {f"{info.host()}:{info.port()}" for info in infos}
        seen = _SEEN.setdefault(sc.applicationId, {})
        counts = _COUNTS.setdefault(sc.applicationId, [])
    except Exception:  # noqa: BLE001 - internal API: then nothing is known to be gone
        return []
    for key in present:
        seen[key] = now
    counts[:] = [(at, count) for at, count in counts if now - at <= GONE_RECENTLY_S]
    counts.append((now, len(present)))
    if len(present) >= max(count for _, count in counts):
        return []
    gone = [(key.rsplit(":", 1)[0], now - at) for key, at in seen.items()
            if key not in present and now - at <= GONE_RECENTLY_S]
    return sorted(gone, key=lambda item: item[1])


def check_slots(sc: Any, np: int, wait_s: float = SLOT_WAIT_S, reads_data: bool = False,
                held: int = 0, layout: TaskLayout | None = None,
                gone_wait_s: float = DEFAULT_START_TIMEOUT_S) -> None:
    """Raise at once (not after Spark's ten minutes of retries) when ``np`` tasks cannot run.

    On a cluster, executors may still be registering: wait up to ``wait_s`` for them, and up
    to ``gone_wait_s`` (the job's start timeout) when an executor seen in the last
    :data:`GONE_RECENTLY_S` is gone (lost, or decommissioned: it may come back or be
    replaced), saying every :data:`SAY_EVERY_S` what it waits for. On a local master, slots
    still busy are waited for up to :data:`LOCAL_SETTLE_S`.
    ``reads_data``: the job reads DataFrames (so the error offers no driver-only fallback).
    ``held``: slots that warm pools of this process hold, busy whatever Spark's status says.
    ``layout``: a job of several ranks per task (``np`` is then its :attr:`TaskLayout.slots`);
    its tasks must also fit the executors under its resource profile.

    Raises
    ------
    NotEnoughSlotsError
        When the slots are not there (or not free) by the end of the wait.
    """
    local = never_grows(sc)
    if local:  # no executor will register; a job that just ended may still hold its slots
        wait_s = LOCAL_SETTLE_S
    several = layout is not None and layout.ranks_per_task > 1
    began = time.monotonic()
    seen = _wait_for_slots(sc, np, held, layout if several else None, local, began, wait_s,
                           gone_wait_s)
    if seen is None:
        return
    cpus = sc.getConf().get("spark.task.cpus", "1")
    if seen.total == 0 and not local:
        raise no_executor(np, wait_s, sc.master, sc.getConf().get("spark.driver.host", "?"),
                          sc.getConf().get("spark.driver.port", "?"))
    if not several:
        error = not_enough_slots(np, seen.free, seen.total, sc.master, cpus, reads_data,
                                 held=held)
        if seen.gone:
            gone = seen.gone[0]
            error.args = (f"{error.args[0]} Waited {time.monotonic() - began:.0f} s for the "
                          f"executor on {gone[0]}, gone {gone[1]:.0f} s ago.",)
        raise error
    assert layout is not None  # several ranks per task: there is a layout
    raise _too_few_for_layout(layout, np, seen, f"(master {sc.master}, spark.task.cpus={cpus})")


@dataclass(frozen=True)
class _SlotsSeen:
    """The cluster's slots when the wait for them ended: ``free`` of ``total``, how many of a
    layout's tasks its resource profile fits (``None``: it has none, or Spark does not say),
    and the executors gone lately (see :func:`gone_executors`)."""

    free: int
    total: int
    fitting: int | None
    gone: list[tuple[str, float]]


def _wait_for_slots(sc: Any, np: int, held: int, layout: TaskLayout | None, local: bool,
                    began: float, wait_s: float, gone_wait_s: float) -> _SlotsSeen | None:
    """Wait (see :func:`check_slots`) until ``np`` slots are free, and ``layout``'s tasks (of
    several ranks each; ``None`` otherwise) fit under its profile: then ``None``; else what the
    cluster had when the wait ended."""
    deadline, said = began + wait_s, began
    last_total = None
    while True:
        free, total = task_slots(sc)
        free = min(free, max(total - held, 0))
        fitting = profile_slots(sc, layout) if layout is not None else None
        now = time.monotonic()
        gone = [] if local else gone_executors(sc, now)  # noted at every job, to be compared
        if free >= np and (fitting is None or layout is None or fitting >= layout.tasks):
            return None
        coming = None if local else slots_to_come(sc, total, np + held)
        if last_total is not None and total > last_total and not local:
            deadline = max(deadline, min(now + wait_s, began + gone_wait_s))  # growing
        last_total = total
        if gone or coming:
            deadline = max(deadline, began + gone_wait_s)
            if now - said >= SAY_EVERY_S:
                said = now
                why = coming or (f"executor on {gone[0][0]} gone {gone[0][1]:.0f} s ago (it "
                                 f"may come back or be replaced;")
                say(f"waiting for {np} task slots: {free} free; {why} up to "
                    f"{deadline - now:.0f} s more, --start-timeout)")
        if now >= deadline or (local and total - held < np):
            return _SlotsSeen(free, total, fitting, gone)  # (a local master never grows)
        time.sleep(0.05 if local else 0.25)


def _too_few_for_layout(layout: TaskLayout, slots: int, seen: _SlotsSeen,
                        where: str) -> NotEnoughSlotsError:
    """The refusal of ``layout``'s tasks of several ranks: fewer than ``slots`` free, or
    executors too small for its resource profile's tasks."""
    if seen.free < slots:
        return NotEnoughSlotsError(
            f"np={layout.np} as {layout.tasks} tasks of {layout.ranks_per_task} ranks needs "
            f"{slots} free Spark task slots at once (barrier mode), but the cluster has "
            f"{seen.free} free of {seen.total} {where}. Fix: fewer ranks, or add executors or "
            "cores.")
    return NotEnoughSlotsError(
        f"np={layout.np} as {layout.tasks} tasks of {layout.ranks_per_task} ranks: each task "
        f"asks for {layout.task_cpus} CPUs, and the executors can hold {seen.fitting} such tasks "
        f"at once {where}. Fix: executors of at least {layout.task_cpus} cores "
        "(spark.executor.cores), or fewer ranks per task (ranks_per_task).")


def check_total_slots(sc: Any, np: int, elastic_max: int, poll_s: float) -> None:
    """Refuse an elastic job (``np:elastic_max``) on a cluster whose task slots, busy or not, are
    fewer than ``np``: at once on a local master, else once :data:`SLOT_WAIT_S` passed without
    enough executors registering (looking again every ``poll_s``).

    Raises
    ------
    NotEnoughSlotsError
        When the cluster has fewer than ``np`` task slots in all.
    """
    deadline = time.monotonic() + (0.0 if is_local(sc)
                                   else SLOT_WAIT_S)
    while (total := task_slots(sc)[1]) < np:
        if time.monotonic() >= deadline:
            raise not_enough_slots(np, task_slots(sc)[0], total, sc.master,
                                   sc.getConf().get("spark.task.cpus", "1"), True, elastic_max)
        time.sleep(poll_s)


def never_grows(sc: Any) -> bool:
    """Whether ``sc``'s master is ``local`` / ``local[N]``: its slots are there from the start
    (a ``local-cluster``'s workers register as a cluster's do)."""
    return _LOCAL_MASTER.match(str(sc.master).strip()) is not None


def slots_to_come(sc: Any, total: int, needed: int) -> str | None:
    """What the job waits for when ``sc``'s cluster is still registering the executors its
    settings promise and will then have the ``needed`` slots: a ``local-cluster``'s workers,
    or ``spark.executor.instances`` executors of ``spark.executor.cores``; ``None`` when no
    more are promised (or they would still be too few)."""
    conf = sc.getConf()
    cpus = max(int(conf.get("spark.task.cpus", "1") or 1), 1)
    expected = local_master_slots(str(sc.master), cpus)
    what = "the local cluster's workers are registering"
    if expected is None:
        instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
        if not (instances and cores and str(instances).isdigit() and str(cores).isdigit()):
            return None
        expected = int(instances) * (int(cores) // cpus)
        what = f"executors are registering (spark.executor.instances={instances})"
    if total >= expected or expected < needed:
        return None
    return f"{what} ({total} of {expected} task slots so far;"


def profile_slots(sc: Any, layout: TaskLayout) -> int | None:
    """How many of ``layout``'s tasks the executors can run at once under its resource profile
    (``None``: it has none, or Spark does not say)."""
    profile = layout.resource_profile
    if profile is None:
        return None
    jsc = sc._jsc.sc()
    try:
        return int(jsc.maxNumConcurrentTasks(
            jsc.resourceProfileManager().resourceProfileFromId(profile.id)))
    except Exception:  # noqa: BLE001 - internal API: leave it to the start timeout
        return None


def no_executor(np: int, waited: float, master: str, host: str, port: str) -> NotEnoughSlotsError:
    """The error when no executor at all registered with the application: no free worker, or
    executors that cannot reach the driver at the address it advertises (they exit, and the
    cluster starts others, for ever)."""
    return NotEnoughSlotsError(
        f"np={np} needs {np} Spark task slots, but no executor has registered with this "
        f"application in {waited:.0f} s (master {master}): either the cluster has no free "
        f"worker, or its executors cannot reach the driver at the address it advertises, "
        f"{host}:{port} (spark.driver.host), and each exits as it starts. Fix: if the "
        f"cluster's workers are there, set spark.driver.host (and spark.driver.bindAddress) "
        f"to an address of this machine that the executors reach, and start the SparkSession "
        f"again (hvd_magics' own channel follows spark.driver.host, or "
        f"{ENV_DRIVER_HOST}); else add workers.")


def not_enough_slots(np: int, free: int, total: int, master: str, cpus: str,
                     reads_data: bool = False, elastic_max: int | None = None, held: int = 0
                     ) -> NotEnoughSlotsError:
    """The error for ``np`` ranks on a cluster with ``free`` of ``total`` task slots (a job that
    reads DataFrames cannot fall back to ranks on the driver, so that fix is not offered).

    ``elastic_max``: the job is elastic, ``np:elastic_max``; ``np`` is the slots it needs to start,
    and the fix is said in its terms. ``held``: slots this process's warm pools and background jobs
    hold.
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



#: The session's GPUs per task (Spark's own name for it).
TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"


@dataclass(frozen=True)
class TaskLayout:
    """How a job's ``np`` ranks sit in Spark tasks: ``ranks_per_task`` rank processes in each
    of ``tasks`` barrier tasks. ``task_cpus`` (``0``: the session's own ``spark.task.cpus``
    suffices) is what each task asks of Spark through a stage-level ``ResourceProfile``, with
    ``task_gpus`` GPUs beside them."""

    np: int
    ranks_per_task: int = 1
    task_cpus: int = 0
    task_gpus: float = 0.0
    #: The session's default task slots the job needs free: one per task (whose
    #: ``spark.task.cpus`` covers its ranks, or whose profile asks for their CPUs; the profile's
    #: own fit is checked apart), or one per rank where the ranks share a local master's cores.
    slots: int = 0

    @property
    def tasks(self) -> int:
        return self.np // self.ranks_per_task

    def describe(self) -> str:
        """``""`` for one rank per task, else ``" (2 tasks x 4 ranks)"``."""
        if self.ranks_per_task == 1:
            return ""
        return (f" ({self.tasks} task{'s' if self.tasks != 1 else ''} x "
                f"{self.ranks_per_task} ranks)")

    @functools.cached_property
    def resource_profile(self) -> Any:
        """The ``ResourceProfile`` the stage runs under (``None``: the session's default)."""
        if not self.task_cpus:
            return None
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        requests = TaskResourceRequests().cpus(self.task_cpus)
        if self.task_gpus:
            requests = requests.resource("gpu", self.task_gpus)
        return ResourceProfileBuilder().require(requests).build


def task_layout(conf: Callable[[str], str | None], master: str, np: int,
                ranks_per_task: int | None) -> TaskLayout:
    """Plan ``np`` ranks into Spark tasks on a session whose configuration ``conf`` reads.

    ``ranks_per_task`` ``None``: as many as the session gives each task GPUs
    (``spark.task.resource.gpu.amount`` above 1), else one. A task of k ranks holds k times
    ``spark.task.cpus``: asked through a stage-level ``ResourceProfile`` when the session's
    tasks hold fewer, which Spark grants on standalone, YARN and Kubernetes clusters with
    dynamic allocation off; on a local master the ranks share the machine's cores (the slot
    check counts a CPU per rank).

    Raises
    ------
    NotEnoughSlotsError
        When ``np`` is not a multiple of the ranks per task, or the cluster manager cannot give
        a task the CPUs of its ranks.
    """
    gpus = float(conf(TASK_GPU_AMOUNT) or 0)
    chosen = ranks_per_task if ranks_per_task is not None else (
        int(gpus) if gpus > 1 and gpus.is_integer() else 1)
    if np % chosen:
        why = ("" if ranks_per_task is not None else
               f" (the default: {TASK_GPU_AMOUNT}={conf(TASK_GPU_AMOUNT)}, a rank per GPU)")
        raise NotEnoughSlotsError(
            f"np={np} ranks do not fill tasks of {chosen} ranks each{why}. Fix: "
            f"{multiple_fix(np, chosen)}, or "
            f"ranks_per_task=1 (--ranks-per-task 1) for one rank per task.")
    cpus = int(conf("spark.task.cpus") or 1)
    if cpus >= chosen:
        return TaskLayout(np, chosen, slots=np // chosen)
    if local_master_slots(master) is not None and not master.startswith("local-cluster"):
        return TaskLayout(np, chosen, slots=np)  # one machine: a core per rank
    if (conf("spark.dynamicAllocation.enabled") or "false").lower() == "true":
        raise NotEnoughSlotsError(
            f"ranks_per_task={chosen} needs each Spark task to hold {chosen * cpus} CPUs, and "
            f"spark.task.cpus is {cpus}; with dynamic allocation on, Spark cannot give one "
            f"stage's tasks more (stage-level scheduling needs it off). Fix: start the session "
            f"with spark.task.cpus={chosen * cpus}, or with spark.dynamicAllocation.enabled="
            "false.")
    cores = conf("spark.executor.cores")
    if cores and cores.isdigit() and int(cores) < chosen * cpus:
        # Spark would refuse the stage with "The number of cores per executor (=1) has to be
        # >= the number of cpus per task = 2"
        raise NotEnoughSlotsError(
            f"ranks_per_task={chosen} needs each Spark task to hold {chosen * cpus} CPUs "
            f"({chosen} ranks of spark.task.cpus={cpus}), and the executors have "
            f"spark.executor.cores={cores}: no executor can run such a task. Fix: "
            f"ranks_per_task={max(1, int(cores) // cpus)} (--ranks-per-task), or executors of "
            f"at least {chosen * cpus} cores (spark.executor.cores={chosen * cpus} when the "
            f"session starts).")
    return TaskLayout(np, chosen, chosen * cpus, gpus, slots=np // chosen)
