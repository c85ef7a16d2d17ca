"""A warm pool's ranks started: their backend (Spark tasks, or processes on the driver) given
the loop that serves cells, and waited for until every rank said it started (its process id,
host, Spark task and where its task receives DataFrame shards)."""
from __future__ import annotations

import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from hvd_magics.errors import HorovodJobError, StartTimeoutError
from hvd_magics.job.pool_cell import CellEvents
from hvd_magics.job.session import SESSION
from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.launch.local_ranks import reap_local_ranks
from hvd_magics.launch.payload import serialize_job
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_session import active_session, start_local_session
from hvd_magics.protocol import (ENGINE_HOROVOD, ENV_HOROVOD_TIMELINE, STARTED, TASK_ERROR,
                                 TASK_STARTED, TIMELINE_DYNAMIC)
from hvd_magics.rank.pool_loop import serve_cells
from hvd_magics.rank_names import ranks_named

#: How long the ranks get to leave Horovod together and exit when the pool ends.
POOL_END_WAIT_S = 30.0


@dataclass
class StartedRanks:
    """A pool's ranks as they started."""

    backend: DriverBackend | SparkBackend
    #: Rank processes in each Spark task (1 on the driver).
    ranks_per_task: int
    #: Each rank's process id and host, from its ``started`` event.
    pids: dict[int, int] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    #: Where each rank's task receives the shards of DataFrames cells read (on Spark).
    data_targets: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: Each rank's Spark task attempt id (on Spark).
    tasks: dict[int, int] = field(default_factory=dict)

    def kill(self, wait_s: float) -> None:
        """Stop the backend, wait up to ``wait_s`` for it, and leave no rank on this host."""
        self.backend.stop()
        self.backend.join(wait_s)
        reap_local_ranks([(pid, self.hosts.get(rank, "")) for rank, pid in self.pids.items()])


def start_ranks(np: int, engine: str, env: Mapping[str, str], ranks_per_task: int | None,
                job_id: str, events: CellEvents, start_timeout: float,
                slot_wait_s: float) -> StartedRanks:
    """Start ``np`` ranks serving cells (``np < 0``: on the driver) and wait until each said it
    started; on a failure to start, none is left running."""
    # a cell can then record a timeline (hvd_magics.rank.instruments.cell_timeline)
    env = ({ENV_HOROVOD_TIMELINE: TIMELINE_DYNAMIC, **env} if engine == ENGINE_HOROVOD
           else dict(env))
    backend: DriverBackend | SparkBackend
    if np < 0:
        backend, ranks_per_task = DriverBackend(-np, env, pool=True), 1
    else:
        spark = active_session() or start_local_session(np)
        backend = SparkBackend(spark, np, env, pool=True, slot_wait_s=slot_wait_s,
                               environment=SESSION.environment, ranks_per_task=ranks_per_task)
        ranks_per_task = backend.layout.ranks_per_task
    started = StartedRanks(backend, ranks_per_task or 1)
    began = time.monotonic()
    backend.start(serialize_job(serve_cells, {}).blob, job_id, events)
    try:
        _wait_started(started, abs(np), events, began, start_timeout)
    except BaseException:
        started.kill(POOL_END_WAIT_S)
        raise
    return started


def _wait_started(started: StartedRanks, size: int, events: CellEvents, began: float,
                  start_timeout: float) -> None:
    pids, backend = started.pids, started.backend
    errors: list[str] = []
    while len(pids) < size:
        try:
            event = events.idle.get(timeout=0.1)
        except queue.Empty:
            event = {}
        if event.get("kind") == STARTED:
            pids[event["rank"]] = event.get("pid")
            started.hosts[event["rank"]] = event.get("host", "")
        elif event.get("kind") == TASK_STARTED:
            if event.get("data"):
                host, port = event["data"]
                started.data_targets[event["rank"]] = (host, int(port))
            if event.get("task") is not None:
                started.tasks[event["rank"]] = int(event["task"])
        elif event.get("kind") == TASK_ERROR:
            errors.append(event.get("traceback", ""))
        if errors or events.exited or backend.finished:
            exited = ranks_named(sorted(events.exited))
            why = (errors[0] if errors else backend.describe_failure()
                   or f"{exited} exited before the pool started")
            raise HorovodJobError(f"The warm pool could not start on {backend.where}: {why}")
        if time.monotonic() - began > start_timeout:
            raise StartTimeoutError(
                f"Timed out after {start_timeout:.0f} s waiting for the warm pool's "
                f"ranks to start ({len(pids)} of {size} started on {backend.where}). "
                "If the cluster needs longer, raise start_timeout (--start-timeout).")
