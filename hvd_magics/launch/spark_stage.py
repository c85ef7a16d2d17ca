"""The Spark job that runs a backend's tasks: submitted in a background thread, in the job's own
group (a tag on Spark Connect), with hvd_magics and the notebook's environment sent along to
executors that may lack them; the tasks' status lines collected and the events they kept
replayed to the job; waited for, cancelled, and its failure said as the user reads it."""
from __future__ import annotations

import functools
import heapq
import json
import threading
import time
from typing import Any

import cloudpickle

from hvd_magics.channel import EventSink
from hvd_magics.events import Wire
from hvd_magics.launch.connect_server import ConnectServer
from hvd_magics.launch.environment_shipping import EnvironmentChoice, say
from hvd_magics.launch.package_shipping import ship_package
from hvd_magics.launch.spark_session import (CONNECT_PROBE_S, cancel_running_jobs, is_connect,
                                             local_workers_use_this_python)
from hvd_magics.launch.stage_failure import (missing_module_fix, stage_failure,
                                             unpacking_allowance)
from hvd_magics.task.event_buffer import replay
from hvd_magics.task import task_entry
from hvd_magics.task.spark_task import TaskSpec


def replay_order(buffered: dict[int, list[Wire]]) -> list[Wire]:
    """The events the tasks kept, each task's in its order, merged by their wall-clock time;
    ``recv`` is set on the driver's clock as if they had arrived when they were sent."""
    now_mono, now_wall = time.monotonic(), time.time()
    merged = list(heapq.merge(*buffered.values(), key=lambda e: e.get("time", 0.0)))
    for event in merged:
        event["recv"] = now_mono - max(now_wall - event.get("time", now_wall), 0.0)
    return merged


#: The one column each barrier task returns (a JSON status line).
STATUS_SCHEMA = "status string"


def barrier_function(spec: TaskSpec) -> Any:
    """The ``mapInArrow`` function each barrier task runs: it works (and reports) even on an
    executor whose Python lacks hvd_magics, since :mod:`hvd_magics.task.task_entry` travels by
    value."""
    from pyspark import cloudpickle as spark_cloudpickle

    spark_cloudpickle.register_pickle_by_value(task_entry)
    return functools.partial(task_entry.arrow_barrier_task, cloudpickle.dumps(spec))


class SparkStage:
    """The Spark job of a backend's ``np`` ranks on ``spark`` (what it runs is each backend's
    :meth:`_stage`).

    Parameters
    ----------
    spark : SparkSession
        Where the job runs.
    np : int
        Number of ranks.
    environment : EnvironmentChoice, optional
        The notebook's environment, packed and sent for the ranks to run in.
    """

    def __init__(self, spark: Any, np: int, environment: EnvironmentChoice | None) -> None:
        self.spark = spark
        self.np = np
        self.environment = environment
        #: Bytes of the environment's archive this job sent the executors (0: none new).
        self.sent_archive = 0
        self.connect = is_connect(spark)
        self.sc = None if self.connect else spark.sparkContext
        self.error: BaseException | None = None
        #: What each task returned through Spark (one JSON line each), once the job ended.
        self.results: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        #: Where the events the tasks kept are replayed (given when the job starts).
        self._events: EventSink | None = None
        self._group = ""
        self._connect_server = ConnectServer(spark)

    def _stage(self, spec: TaskSpec) -> Any:
        """The DataFrame whose ``collect`` runs the job's tasks (each backend's own)."""
        raise NotImplementedError

    def _submit(self, spec: TaskSpec) -> None:
        """Run the stage of ``spec`` in a background thread, in the job's group (or tag), with
        hvd_magics sent along to executors that may lack it."""
        self._group = f"hvd_magics-{spec.job_id}"
        ship_package(self.spark)
        if self.environment is not None:
            spec.env.update(self.environment.for_job(self.spark, say))
            self.sent_archive = self.environment.sent_now
        from pyspark import InheritableThread

        self._thread = InheritableThread(target=self._collect, args=(spec,), daemon=True,
                                         **({"session": self.spark} if self.connect else {}))
        self._thread.start()

    def _collect(self, spec: TaskSpec) -> None:
        try:
            if self.connect:
                self.spark.addTag(self._group)  # this thread's operations carry the tag
            else:
                assert self.sc is not None  # classic Spark: the session's SparkContext
                self.sc.setJobGroup(self._group, f"hvd_magics Horovod job, {self.np} ranks",
                                    interruptOnCancel=True)
            with local_workers_use_this_python(self.sc):  # the UDFs are wrapped here
                tasks = self._stage(spec)
            lines = [json.loads(row.status) for row in tasks.collect()]
            self.results = [line for line in lines if "events" not in line]
            kept: dict[int, list[str]] = {}
            for line in sorted((ln for ln in lines if "events" in ln), key=lambda ln: ln["chunk"]):
                kept.setdefault(line["partition"], []).append(line["events"])
            for event in replay_order({p: replay(chunks) for p, chunks in kept.items()}):
                # kept events come only from a job's tasks, whose start() gave the events
                assert self._events is not None
                self._events.put(event)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the launcher
            self.error = exc

    @property
    def finished(self) -> bool:
        """Whether the Spark job has ended (successfully or not)."""
        return self._thread is not None and not self._thread.is_alive()

    def _join_stage(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the Spark job to end (not once a Connect server is found
        gone: its job cannot end)."""
        deadline = time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive() and \
                time.monotonic() < deadline:
            self._thread.join(min(CONNECT_PROBE_S, max(deadline - time.monotonic(), 0)))
            if self.connect and self._thread.is_alive() and self._connect_server.is_gone():
                break

    def _cancel_stage(self) -> None:
        """Cancel this job's Spark stage: by its tag on Connect, else the group's jobs that run
        now, by id (a stop in the job's start comes before Spark has one to cancel)."""
        if self.connect:
            self._connect_server.interrupt(self._group)
        else:
            cancel_running_jobs(self.sc, self._group)

    @property
    def server_gone(self) -> str | None:
        """Why the Spark Connect server counts as gone (``None``: it answers, or not checked)."""
        return self._connect_server.gone

    def took_every_rank(self) -> str | None:
        """The Spark Connect server, once it was found gone (:meth:`describe_failure`)."""
        return self.server_gone if self.connect else None

    def unpacking(self) -> tuple[float, str] | None:
        """When this job sent the executors the environment's archive (the first job of the
        application after it changed): Spark fetches and unpacks it on each executor before the
        task's Python starts, which the start timeout must not count; the seconds allowed for
        it at the slowest rates a cluster is expected to have."""
        return unpacking_allowance(self.sent_archive)

    @property
    def refused(self) -> str | None:
        """Why the tasks refused the DataFrames' rows before any rank got the job (a rank
        without rows, nulls where there must be none), or ``None``."""
        return next((r["error"] for r in self.results if r.get("refused")), None)

    def describe_failure(self) -> str | None:
        """Why the Spark side failed, as the executor's Python error (never JVM frames), or
        ``None`` when it did not."""
        if self.connect and not self.finished and self._connect_server.is_gone():
            return (f"{self.server_gone}, and the ranks' tasks with it. Fix: start it again, "
                    "then get a new session (spark.stop(); spark = "
                    "SparkSession.builder.remote(...).getOrCreate())")
        return stage_failure(self.spark, self.results, self.error, self.environment)

    def missing_module_fix(self) -> str:
        """The executors lack a module: ship the environment (or install it in the notebook,
        when it is shipped); nothing on a local master, whose ranks run this very Python."""
        return missing_module_fix(self.spark, self.environment)
