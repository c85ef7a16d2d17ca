"""What a job asks of Spark's executors through the SparkContext's scheduler (never on Spark
Connect, whose scheduler is out of reach): which of them Spark is decommissioning, and their
removal from the application, keeping its number of executors (the cluster starts others in
their place)."""
from __future__ import annotations

from typing import Any

from hvd_magics.notices import say


def pending_decommission(sc: Any, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:
    """Of the ranks of ``tasks`` (rank -> its task's id), those whose executor Spark's scheduler
    has pending decommission (its ``executorsPendingDecommission``): ``(executor, host)`` each
    (``{}`` when the scheduler is of another kind)."""
    try:
        scheduler = sc._jsc.sc().taskScheduler()  # noqa: SLF001 - Spark's own state
        pending = scheduler.executorsPendingDecommission()
        if pending.isEmpty():
            return {}
        found: dict[int, tuple[str, str]] = {}
        executors = scheduler.taskIdToExecutorId()
        for rank, task in tasks.items():
            executor = executors.get(task)
            if executor.isDefined() and pending.contains(executor.get()):
                host = pending.apply(executor.get()).workerHost()
                found[rank] = (str(executor.get()),
                               str(host.get()) if host.isDefined() else "")
        return found
    except Exception:  # noqa: BLE001 - a scheduler of another kind: no notice, as before
        return {}


def remove_host_executors(sc: Any, host: str) -> None:
    """Ask Spark to remove the executors of ``host`` (saying so when it cannot be asked: its
    heartbeat timeout then removes them)."""
    try:
        jsc = sc._jsc.sc()  # noqa: SLF001 - Spark's own executor list
        executors = jsc.statusStore().executorList(True)
        listed = [executors.apply(i) for i in range(executors.size())]
        lost = [executor.id() for executor in listed if executor.id() != "driver"
                and executor.hostPort().split(":")[0] == host]
    except Exception as exc:  # noqa: BLE001 - Spark's heartbeat timeout still removes it
        say(f"could not ask Spark to remove the executors of {host} ({exc}); Spark's own "
            "heartbeat timeout will")
        return
    if lost:
        kill_executors(sc, lost, f"the executors of {host}")


def kill_executors(sc: Any, executors: list[str], what: str = "") -> None:
    """Ask Spark to remove ``executors`` from the application, keeping its number of executors
    (the cluster starts others in their place); ``what`` names them when that fails."""
    try:
        jsc = sc._jsc.sc()  # noqa: SLF001 - Spark's own kill call
        ids = sc._jvm.java.util.ArrayList()  # noqa: SLF001
        for executor in executors:
            ids.add(executor)
        seq = sc._jvm.scala.jdk.javaapi.CollectionConverters.asScala(ids).toSeq()  # noqa: SLF001
        # (ids, adjustTargetNumExecutors, countFailures, force)
        jsc.schedulerBackend().killExecutors(seq, False, False, True)
    except Exception as exc:  # noqa: BLE001 - they go when their machine does
        say(f"could not ask Spark to remove {what or 'executors ' + ', '.join(executors)} "
            f"({exc}); they go when their machine does")
