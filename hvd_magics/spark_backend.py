"""Run a job's ranks as one Spark barrier stage (``np > 0``)."""
from __future__ import annotations

import functools
import os
import queue
import socket
import sys
import threading
import time
from typing import Any

from hvd_magics.errors import NotEnoughSlotsError
from hvd_magics.events import EventServer
from hvd_magics.spark_task import TaskSpec, barrier_task

#: How long to wait for executors to register before saying the cluster is too small.
SLOT_WAIT_S = 5.0


def active_session() -> Any | None:
    """The active SparkSession, or ``None`` (never starts one)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


def start_local_session(np: int) -> Any:
    """Start an embedded local-mode SparkSession sized for ``np`` ranks; say so."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("np > 0 runs ranks as Spark tasks and needs pyspark: "
                          "pip install 'pyspark>=4' (or use np < 0 to run on the driver only)") from exc
    # Spark's Python workers must use this interpreter, which has horovod and hvd_magics.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = max(np, os.cpu_count() or 1)
    print(f"hvd_magics: no active SparkSession; starting an embedded local one (local[{cores}]).",
          file=sys.stderr)
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("hvd_magics")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")  # our own session: keep Spark's chatter out of cells
    return spark


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


def check_slots(sc: Any, np: int, wait_s: float = SLOT_WAIT_S) -> None:
    """Raise at once (not after Spark's ten minutes of retries) when ``np`` tasks cannot run.

    On a cluster, executors may still be registering: wait up to ``wait_s`` for them.
    """
    if str(sc.master).startswith("local"):
        wait_s = 0.0
    deadline = time.monotonic() + wait_s
    while True:
        free, total = task_slots(sc)
        if free >= np:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    cpus = sc.getConf().get("spark.task.cpus", "1")
    raise NotEnoughSlotsError(
        f"np={np} needs {np} free Spark task slots at once (barrier mode), but the cluster has "
        f"{free} free of {total} (master {sc.master}, spark.task.cpus={cpus}). Fix: use np<={free}, "
        f"add executors or cores, or use np=-{np} to run all ranks on the driver.")


def _driver_address(sc: Any) -> str:
    host = sc.getConf().get("spark.driver.host") or socket.gethostname()
    return socket.gethostbyname(host)


class SparkBackend:
    """Submit the barrier stage in a background thread; cancel it by job group.

    Parameters
    ----------
    spark : SparkSession
        Where the job runs.
    np : int
        Number of ranks (Spark tasks).
    env : dict
        Extra environment for the ranks.
    """

    def __init__(self, spark: Any, np: int, env: dict[str, str]) -> None:
        self.spark = spark
        self.sc = spark.sparkContext
        self.np = np
        self.env = env
        self.where = f"spark {self.sc.master}"
        self.error: BaseException | None = None
        self._server: EventServer | None = None
        self._thread: threading.Thread | None = None
        self._group = ""

    def start(self, payload: bytes, job_id: str, events: queue.Queue) -> None:
        """Check the slots, open the event channel and submit the stage."""
        check_slots(self.sc, self.np)
        self._server = EventServer(_driver_address(self.sc), job_id, events)
        self._group = f"hvd_magics-{job_id}"
        spec = TaskSpec(payload, self._server.address, self.env)
        from pyspark import InheritableThread

        self._thread = InheritableThread(target=self._collect, args=(spec,), daemon=True)
        self._thread.start()

    def _collect(self, spec: TaskSpec) -> None:
        try:
            self.sc.setJobGroup(self._group, f"hvd_magics Horovod job, {self.np} ranks",
                                interruptOnCancel=True)
            rdd = self.sc.parallelize(range(self.np), self.np).barrier()
            rdd.mapPartitions(functools.partial(barrier_task, spec)).collect()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the launcher
            self.error = exc

    @property
    def finished(self) -> bool:
        """Whether the Spark job has ended (successfully or not)."""
        return self._thread is not None and not self._thread.is_alive()

    def stop(self) -> None:
        """Stop every rank: close the channel (supervisors kill their ranks), cancel the stage."""
        if self._server is not None:
            self._server.close()
        if self._group and not self.finished:
            self.sc.cancelJobGroup(self._group)

    def join(self, timeout: float) -> bool:
        """Wait for the Spark job to end; ``True`` when it did."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self._server is not None and self.finished:
            self._server.close()
        return self.finished

    def describe_failure(self) -> str:
        """The Spark-side error, shortened to its useful last lines."""
        text = str(self.error or "")
        if "No module named 'hvd_magics'" in text or "No module named 'horovod'" in text:
            return ("the Spark executors cannot import hvd_magics or horovod: install both (and the "
                    "frameworks) on every executor, or set PYSPARK_PYTHON to an interpreter that "
                    "has them.\n" + _tail(text))
        return _tail(text)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
