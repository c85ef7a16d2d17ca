"""Run a job's ranks as one Spark barrier stage (``np > 0``)."""
from __future__ import annotations

import base64
import contextlib
import functools
import heapq
import json
import os
import queue
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import cloudpickle

from hvd_magics.task import task_entry
from hvd_magics.errors import HorovodMagicsError, NotEnoughSlotsError, SparkSessionLost
from hvd_magics.channel import EventServer
from hvd_magics.launch import console_bar, interrupt_guard
from hvd_magics.launch.dataframe_input import DataFrameSources, sharded_input
from hvd_magics.launch.meeting_point import MeetingPoint
from hvd_magics.protocol import (DROP_SHARDS, ENV_DRIVER_HOST, ENV_LIVE, ENV_PYSPARK_DRIVER_PYTHON,
                                 ENV_PYSPARK_PYTHON, END_POOL, INTERRUPT_CELL, RUN_CELL,
                                 TAKE_STACKS)
from hvd_magics.task.event_buffer import replay
from hvd_magics.task.slots import local_addresses
from hvd_magics.task.spark_task import TaskSpec

#: How long to wait for executors to register before saying the cluster is too small.
SLOT_WAIT_S = 5.0
#: After the channel closed (its supervisors kill their ranks), how long the stage may take to
#: end by itself before it is cancelled...
CANCEL_AFTER_S = 3.0
#: ...or, while some of its tasks have not yet reached the channel (their Python is starting;
#: each is turned away as it does and ends quietly), how long in all.
CANCEL_LATE_TASKS_AFTER_S = 15.0
#: How long a Spark Connect server may take to accept a connection before it counts as gone.
CONNECT_PROBE_S = 2.0
#: How long the cancel of a Connect job may take (pyspark retries for ten minutes otherwise).
INTERRUPT_WAIT_S = 10.0


def active_session() -> Any | None:
    """The active SparkSession, or ``None`` (never starts one)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    session = SparkSession.getActiveSession()
    if session is None:  # the active session is per thread: another thread's (a background
        # job's) finds the one the notebook made as the process's default
        default = getattr(SparkSession, "_instantiatedSession", None)
        if default is not None and getattr(default.sparkContext, "_jsc", None) is not None:
            return default
    if session is None:  # a Connect session made after its server restarted is only the default
        try:
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            session = ConnectSession._get_default_session()  # noqa: SLF001
        except Exception:  # noqa: BLE001 - no Connect client installed
            return None
    return session


def connect_endpoint(spark: Any) -> tuple[str, int] | None:
    """``(host, port)`` of a Spark Connect session's server, or ``None`` when unknown."""
    try:
        host, port = spark.client._builder.endpoint.rsplit(":", 1)  # noqa: SLF001
        return host.strip("[]"), int(port)
    except Exception:  # noqa: BLE001 - pyspark's internals; unknown means not checked
        return None


def connect_server_gone(spark: Any) -> str | None:
    """Why a Spark Connect session's server is gone (it accepts no connection), or ``None``.

    pyspark's own calls retry an absent server for about ten minutes; this answers at once.
    """
    endpoint = connect_endpoint(spark)
    if endpoint is None:
        return None
    try:
        with socket.create_connection(endpoint, timeout=CONNECT_PROBE_S):
            return None
    except OSError as exc:
        return (f"the Spark Connect server at {endpoint[0]}:{endpoint[1]} does not answer "
                f"({exc.strerror or type(exc).__name__}): it was stopped or lost")


#: Connect sessions whose server went away, kept for the kernel's life: pyspark closes a
#: session's gRPC channel when the session is garbage-collected, and doing that at an arbitrary
#: point of another thread's gRPC call (our stage's, still retrying) was seen to deadlock the
#: notebook when it rebound ``spark`` to a new session.
_GONE_SESSIONS: list[Any] = []


def give_up_retries(spark: Any) -> None:
    """Let the calls of a Connect session whose server is gone fail at their next retry
    instead of retrying for ten minutes (the job's own stage among them)."""
    if not any(spark is kept for kept in _GONE_SESSIONS):
        _GONE_SESSIONS.append(spark)
    try:
        spark.client._retry_policies[:] = []  # noqa: SLF001 - the list each call's retry reads
    except Exception:  # noqa: BLE001,S110 - pyspark's internals changed: pyspark retries
        pass


def session_lost(spark: Any, why: str) -> SparkSessionLost:
    """The error for a Connect session that cannot be used, with how to get a new one (pyspark's
    ``getOrCreate`` gives the old session back until it is stopped)."""
    endpoint = connect_endpoint(spark)
    url = f"sc://{endpoint[0]}:{endpoint[1]}" if endpoint else "..."
    return SparkSessionLost(
        f"{why}. Fix: start the Spark Connect server again if it is down, then get a new "
        f"session (spark.stop(); spark = SparkSession.builder.remote({url!r}).getOrCreate()) "
        "and run the cell again.")


def _gist(exc: BaseException) -> str:
    """The telling line of a pyspark or gRPC error (a gRPC error's ``details``)."""
    text = str(exc).strip()
    found = re.search(r'details = "([^"]+)"', text)
    if found:
        return found.group(1)[:300]
    return text.splitlines()[0][:300] if text else type(exc).__name__


def check_connect_session(spark: Any) -> str:
    """The master of a Connect session, asked of its server: refused at once (never pyspark's
    ten minutes of retries) when the server is gone, or when it no longer knows the session
    (it was restarted).

    Raises
    ------
    SparkSessionLost
        Naming the server and the fix.
    """
    gone = connect_server_gone(spark)
    if gone:
        give_up_retries(spark)
        raise session_lost(spark, gone)
    try:
        return spark.conf.get("spark.master", "?")
    except Exception as exc:  # noqa: BLE001 - pyspark's Connect errors have no common base here
        give_up_retries(spark)
        raise session_lost(spark, f"the Spark Connect session cannot be used ({_gist(exc)})"
                           ) from None


def embedded_spark_log() -> Path:
    """Where the JVM of an embedded SparkSession writes its own output."""
    return Path(tempfile.gettempdir()) / "hvd_magics" / f"spark-driver-{os.getpid()}.log"


def start_local_session(np: int) -> Any:
    """Start an embedded local-mode SparkSession sized for ``np`` ranks (or the machine's cores)
    and one task more (a warm pool of them deals DataFrames through it); say so in one line.

    The JVM's own output (log4j, JVM warnings) goes to :func:`embedded_spark_log`, not the cell.
    """
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("np > 0 runs ranks as Spark tasks and needs pyspark: "
                          "pip install 'pyspark>=4' (or use np < 0 to run on the driver only)") from exc
    # Spark's Python workers must use this interpreter, which has horovod and hvd_magics.
    os.environ.setdefault(ENV_PYSPARK_PYTHON, sys.executable)
    os.environ.setdefault(ENV_PYSPARK_DRIVER_PYTHON, sys.executable)
    # one slot beyond the ranks: a warm pool of all of them still has one to deal DataFrames
    cores = max(np, os.cpu_count() or 1) + 1
    settings = {"spark.master": f"local[{cores}]", "spark.app.name": "hvd_magics",
                "spark.ui.showConsoleProgress": "false", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1"}
    log = embedded_spark_log()
    if SparkContext._gateway is None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # the JVM keeps its own copy of the descriptor
            gateway = launch_gateway(SparkConf().setAll(settings.items()),
                                     popen_kwargs={"stdout": out, "stderr": out})
        SparkContext._ensure_initialized(gateway=gateway)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")  # our own session: keep Spark's chatter out of cells
    print(f"hvd_magics: no active SparkSession; started an embedded local[{cores}] one "
          f"(its log: {log}).", file=sys.stderr)
    return spark


def _is_local(sc: Any) -> bool:
    """Whether the executors of ``sc`` run on this machine (``local``, ``local-cluster``)."""
    return str(sc.master).startswith("local")


@contextlib.contextmanager
def local_workers_use_this_python(sc: Any) -> Iterator[None]:
    """Python functions wrapped inside this block run in this very interpreter (which has
    hvd_magics) when the executors run on this machine.

    A local master's session started without ``PYSPARK_PYTHON`` would otherwise give them the
    system's ``python3``. On a cluster the session's own choice stands; a Connect session
    (``sc`` is ``None``) chooses on its server.
    """
    if sc is None or not _is_local(sc):
        yield
        return
    saved = sc.pythonExec
    sc.pythonExec = sys.executable
    try:
        yield
    finally:
        sc.pythonExec = saved


#: The one column each barrier task returns (a JSON status line).
STATUS_SCHEMA = "status string"


def barrier_function(spec: TaskSpec) -> Any:
    """The ``mapInArrow`` function each barrier task runs: it works (and reports) even on an
    executor whose Python lacks hvd_magics, since :mod:`hvd_magics.task.task_entry` travels by
    value."""
    from pyspark import cloudpickle as spark_cloudpickle

    spark_cloudpickle.register_pickle_by_value(task_entry)
    return functools.partial(task_entry.arrow_barrier_task, cloudpickle.dumps(spec))


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
    if _is_local(sc):
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


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _driver_address(spark: Any) -> str:
    """The notebook's address as executors reach it: ``HVD_MAGICS_DRIVER_HOST`` when set, else
    the session's driver host (the notebook's own, for a classic session)."""
    host = (os.environ.get(ENV_DRIVER_HOST) or spark.conf.get("spark.driver.host", None)
            or socket.gethostname())
    return socket.gethostbyname(host)


def connect_server_host(spark: Any) -> str | None:
    """The host of a Spark Connect session's server (``None`` for a classic session)."""
    client = getattr(spark, "_client", None)
    return getattr(client, "host", None) if client is not None else None


def no_live_view_reason(spark: Any) -> str | None:
    """Why the executors cannot send the job's events to this notebook as they happen, or
    ``None`` when they can."""
    if os.environ.get(ENV_LIVE, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV_LIVE}=0 is set"
    host = connect_server_host(spark) if is_connect(spark) else None
    if host is not None and not os.environ.get(ENV_DRIVER_HOST):
        try:
            address = socket.gethostbyname(host)
        except OSError:
            address = host
        if host not in local_addresses() and address not in local_addresses() \
                and not address.startswith("127."):
            return (f"the Spark Connect server {host} runs the executors on machines that "
                    f"cannot be assumed to reach this notebook (set {ENV_DRIVER_HOST} to an "
                    "address of this machine that they reach for a live view)")
    return None


def replay_order(buffered: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The events the tasks kept, each task's in its order, merged by their wall-clock time;
    ``recv`` is set on the driver's clock as if they had arrived when they were sent."""
    now_mono, now_wall = time.monotonic(), time.time()
    merged = list(heapq.merge(*buffered.values(), key=lambda e: e.get("time", 0.0)))
    for event in merged:
        event["recv"] = now_mono - max(now_wall - event.get("time", now_wall), 0.0)
    return merged


class SparkBackend:
    """Submit the barrier stage in a background thread; cancel it by job group (a tag on a
    Spark Connect session).

    Parameters
    ----------
    spark : SparkSession
        Where the job runs.
    np : int
        Number of ranks (Spark tasks).
    env : dict
        Extra environment for the ranks.
    sources : DataFrameSources, optional
        The DataFrames the job reads (each rank gets its shard of each); without any, the
        stage runs over ``spark.range(np)``.
    pool : bool
        A warm pool: the stage holds its tasks and their ranks run the cells of
        :meth:`send_cell`, sent as orders over the event channel.
    slot_wait_s : float
        On a cluster, how long to wait for executors to register (or come back) before saying
        the cluster is too small.
    held_slots : int
        Task slots the warm pools of this process hold (never free for this job).
    background : bool
        A background job: while it runs, Spark's console bar is off and an interrupt of another
        cell does not cancel it (as for a pool).
    """

    #: A cold job's ranks end with it (a warm pool's backend keeps them).
    keeps_ranks = False
    #: What a warm pool says after a cell's error when it had to restart its ranks.
    restart_note = ""

    def __init__(self, spark: Any, np: int, env: dict[str, str],
                 sources: DataFrameSources | None = None, pool: bool = False,
                 slot_wait_s: float = SLOT_WAIT_S, held_slots: int = 0,
                 background: bool = False) -> None:
        self.spark = spark
        self.pool = pool
        #: A background job: its stage, like a pool's, runs while other cells do.
        self.background = background
        self.slot_wait_s = slot_wait_s
        self.held_slots = held_slots
        self.sources = sources if sources is not None else DataFrameSources()
        self.connect = is_connect(spark)
        self.sc = None if self.connect else spark.sparkContext
        self.np = np
        self.env = env
        master = check_connect_session(spark) if self.connect else self.sc.master
        self.where = f"spark {master}" + (" (Connect)" if self.connect else "")
        #: Why the job's events come back only at its end (``None``: they stream live).
        self.no_live_view = no_live_view_reason(spark)
        self.error: BaseException | None = None
        #: What each task returned through Spark (one JSON line each), once the job ended.
        self.results: list[dict[str, Any]] = []
        self._server: EventServer | None = None
        self._thread: threading.Thread | None = None
        self._events: queue.Queue | None = None
        self._group = ""
        #: Why the Spark Connect server counts as gone (``None``: it answers, or not checked).
        self.server_gone: str | None = None
        #: A warm pool's stage is kept from Spark's console bar and from pyspark's Ctrl-C
        #: handler until it ends (:meth:`_guard_pool`).
        self._pool_guarded = False
        self._bar_paused = False

    def start(self, payload: bytes, job_id: str, events: queue.Queue) -> None:
        """Check the slots, open the event channel and submit the stage.

        (A Connect session can count only a local master's slots, and not the busy ones:
        elsewhere the start timeout says when the cluster is too small.)"""
        self._check_slots(self.np)
        self._events = events
        if self.live:
            self._open_channel(job_id, events)
        elif self.pool:
            raise HorovodMagicsError(
                f"a warm pool sends its cells over the notebook's event channel, which the "
                f"executors cannot use here: {self.no_live_view}. Fix: run cold jobs "
                "(%%horovod np=N), or let the executors reach the notebook.")
        else:
            print(f"hvd_magics: no live view: {self.no_live_view}. The ranks' output, errors and "
                  "the value come back when the job ends.", file=sys.stderr)
        if self.sc is not None and not self._bar_paused:
            # Spark's console bar would draw the job's stage into the cell (a pool's and a
            # background job's into whichever cell runs then)
            self._bar_paused = console_bar.pause(self.sc)
        if (self.pool or self.background) and self.sc is not None and not self._pool_guarded:
            self._guard_pool(job_id)
        self._submit(TaskSpec(payload, self._server.address if self._server else None, self.env,
                              job_id, {source.index: source.name for source in self.sources},
                              pool=self.pool, no_nulls={s.index: s.no_nulls for s in self.sources
                                                        if s.no_nulls}))

    def _order_all(self, order: dict[str, Any]) -> None:
        if self._server is not None:
            for rank in range(self.np):
                self._server.send_order(rank, order)

    def send_cell(self, frames: Sequence[bytes]) -> None:
        """A warm pool: give each rank its next cell (``frames[rank]``, one stdin frame, as an
        order)."""
        if self._server is not None:
            for rank, frame in enumerate(frames):
                self._server.send_order(rank, {"kind": RUN_CELL,
                                               "frame": base64.b64encode(frame).decode()})

    def drop_shards(self, deal: str) -> None:
        """A warm pool: the ranks' tasks delete the shards of ``deal``."""
        self._order_all({"kind": DROP_SHARDS, "deal": deal})

    @property
    def channel_secret(self) -> bytes:
        """The secret of the job's event channel (a warm pool's dealers sign with it too)."""
        if self._server is None:
            raise RuntimeError("the job has no event channel")
        return self._server.address.secret

    def request_stacks(self, request: str) -> None:
        """Ask every rank for its stacks (``stacks`` events carrying ``request``); without an
        event channel (``HVD_MAGICS_LIVE=0``) nobody answers."""
        self._order_all({"kind": TAKE_STACKS, "request": request})

    def interrupt_cell(self) -> None:
        """A warm pool: interrupt the cell every rank runs."""
        self._order_all({"kind": INTERRUPT_CELL})

    def end_pool(self) -> None:
        """A warm pool: end the ranks' input; they leave Horovod together and exit."""
        self._order_all({"kind": END_POOL})

    def _check_slots(self, np: int) -> None:
        """Raise at once when the cluster cannot run ``np`` tasks at the same time."""
        if self.sc is not None:
            check_slots(self.sc, np, self.slot_wait_s, self.reads_data, self.held_slots)
        else:  # Spark Connect: only a local master tells its size
            master = self.spark.conf.get("spark.master", "")
            cpus = self.spark.conf.get("spark.task.cpus", "1")
            total = local_master_slots(master, int(cpus))
            if total is not None and np > total - self.held_slots:
                raise not_enough_slots(np, max(total - self.held_slots, 0), total, master, cpus,
                                       self.reads_data, self.elastic_max, self.held_slots)

    def _open_channel(self, job_id: str, events: queue.Queue) -> None:
        """Listen for the tasks' events on the address the executors reach."""
        address = _driver_address(self.spark)
        try:
            self._server = EventServer(address, job_id,
                                       MeetingPoint(events, self.np, self._order_all))
        except OSError as exc:
            raise OSError(f"cannot listen for the ranks' events on {address} ({exc}); set "
                          f"{ENV_DRIVER_HOST} to an address of this machine, or {ENV_LIVE}=0 "
                          "to run without a live view") from None

    def _submit(self, spec: TaskSpec) -> None:
        """Run the stage of ``spec`` in a background thread, in the job's group (or tag)."""
        self._group = f"hvd_magics-{spec.job_id}"
        from pyspark import InheritableThread

        self._thread = InheritableThread(target=self._collect, args=(spec,), daemon=True,
                                         **({"session": self.spark} if self.connect else {}))
        self._thread.start()

    def _stage(self, spec: TaskSpec) -> Any:
        """One barrier stage through the DataFrame API: np partitions, one task each, over the
        rows of the job's DataFrames (or over nothing)."""
        ranks = (sharded_input(self.sources, self.np) if self.reads_data
                 else self.spark.range(0, self.np, 1, self.np))
        return ranks.mapInArrow(barrier_function(spec), STATUS_SCHEMA, barrier=True)

    def _collect(self, spec: TaskSpec) -> None:
        try:
            if self.connect:
                self.spark.addTag(self._group)  # this thread's operations carry the tag
            else:
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
                self._events.put(event)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the launcher
            self.error = exc

    @property
    def live(self) -> bool:
        """Whether the ranks' events stream to the notebook as they happen."""
        return self.no_live_view is None

    #: The maximum of an elastic job (its slot errors are said in its terms), else ``None``.
    elastic_max: int | None = None

    @property
    def reads_data(self) -> bool:
        """Whether the job reads DataFrames (its tasks start after the user's Spark stages)."""
        return len(self.sources) > 0

    @property
    def finished(self) -> bool:
        """Whether the Spark job has ended (successfully or not)."""
        return self._thread is not None and not self._thread.is_alive()

    @property
    def drained(self) -> bool:
        """Whether every rank's event connection has ended (all it sent has arrived)."""
        return self._server is None or self._server.open_connections == 0

    def stop(self) -> None:
        """Stop every rank: close the channel (supervisors kill their ranks and their tasks
        return), and cancel the stage only if it has not ended by itself within
        ``CANCEL_AFTER_S`` (a cancelled stage makes Spark warn of killed tasks in the user's
        next cells)."""
        if self._server is not None:
            self._server.close(linger=not self.finished)  # closed for good once it ended
        if self._thread is not None and self.live:
            began = time.monotonic()
            self._thread.join(CANCEL_AFTER_S)
            while self._thread.is_alive() and self._server is not None and \
                    len(self._server.greeted) < self.np and \
                    time.monotonic() - began < CANCEL_LATE_TASKS_AFTER_S:
                self._thread.join(0.1)
        if self._group and not self.finished:
            if self.connect:
                self._interrupt_connect()
            else:
                self.sc.cancelJobGroup(self._group)
        if self._server is not None and self.finished:
            self._server.close()  # no task connects any more

    def _server_is_gone(self) -> bool:
        """Whether this Connect session's server is gone (asked once it is: it stays gone); its
        calls then stop retrying."""
        if self.server_gone is None:
            self.server_gone = connect_server_gone(self.spark)
            if self.server_gone:
                give_up_retries(self.spark)
        return self.server_gone is not None

    def _interrupt_connect(self) -> None:
        """Cancel the stage by its tag, waiting at most ``INTERRUPT_WAIT_S`` (not at all when
        the server is gone: pyspark would retry it for ten minutes)."""
        if self._server_is_gone():
            return

        def interrupt() -> None:
            try:
                self.spark.interruptTag(self._group)
            except Exception:  # noqa: BLE001,S110 - the server went away meanwhile
                pass

        thread = threading.Thread(target=interrupt, name="hvd-interrupt-tag", daemon=True)
        thread.start()
        thread.join(INTERRUPT_WAIT_S)

    def join(self, timeout: float) -> bool:
        """Wait for the Spark job to end; ``True`` when it did (``False`` at once when a
        Connect server is gone: its job cannot end)."""
        deadline = time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive() and \
                time.monotonic() < deadline:
            self._thread.join(min(CONNECT_PROBE_S, max(deadline - time.monotonic(), 0)))
            if self.connect and self._thread.is_alive() and self._server_is_gone():
                break
        if self._server is not None and self.finished:
            self._server.close()
        if self._pool_guarded and self.finished:
            self._release_pool()
        if self._bar_paused and self.finished:
            self._bar_paused = False
            console_bar.resume()
        return self.finished

    def _guard_pool(self, job_id: str) -> None:
        """A warm pool or background job on classic Spark: its stage runs while other cells
        do, and an interrupt of theirs (pyspark cancels every job) would end it; held off until
        the stage ends."""
        self._pool_guarded = True
        interrupt_guard.protect(self.sc, f"hvd_magics-{job_id}")

    def _release_pool(self) -> None:
        self._pool_guarded = False
        interrupt_guard.release(self._group)

    def silence_note(self, ranks: list[int]) -> str:
        """What a start timeout says of ``ranks``, whose tasks never reached the channel."""
        if not ranks or self._server is None:
            return ""
        address = self._server.address
        note = (f"Nothing reached the notebook's event channel ({address.host}:{address.port}) "
                f"from the Spark tasks of ranks {', '.join(map(str, ranks))}: Spark did not run "
                "them, or they cannot reach this machine")
        if self._server.rejected:
            note += (f"; the channel closed {self._server.rejected} connections that did not "
                     "authenticate (another process connecting to it?)")
        return note + ". "

    @property
    def refused(self) -> str | None:
        """Why the tasks refused the DataFrames' rows before any rank got the job (a rank
        without rows, nulls where there must be none), or ``None``."""
        return next((r["error"] for r in self.results if r.get("refused")), None)

    def describe_failure(self) -> str | None:
        """Why the Spark side failed, as the executor's Python error (never JVM frames), or
        ``None`` when it did not."""
        setup = [r for r in self.results if r.get("setup")]
        if self.connect and not self.finished and self._server_is_gone():
            return (f"{self.server_gone}, and the ranks' tasks with it. Fix: start it again, "
                    "then get a new session (spark.stop(); spark = "
                    "SparkSession.builder.remote(...).getOrCreate())")
        if setup:
            text = setup[0]["error"]
        elif self.error is not None:
            text = spark_error_text(self.error)
        else:
            return None
        if "cannot import hvd_magics" in text or "No module named" in text:
            text += MISSING_PACKAGES_FIX
        return text


#: What to do when the executors' Python lacks a package the job needs.
MISSING_PACKAGES_FIX = (
    "\nFix: install hvd_magics, horovod, pyarrow and the frameworks on every executor, or point "
    "PYSPARK_PYTHON (spark.pyspark.python) at an interpreter that has them, then start the "
    "SparkSession again.")


_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(([^)]*)\)(?:\s*Reason: ([^\n]*))?")
#: Where the Python traceback inside a JVM exception's text ends (pyspark 4.0 and 4.3 forms).
_TRACEBACK_ENDS = ("\n\tat ", "\nJVM stacktrace", "\n\n\n")
#: Lines of a Python traceback from an executor that are shown.
TRACEBACK_LINES = 15


def executor_lost_reason(text: str) -> str | None:
    """``"executor 1 exited ...: Command exited with code 137"`` from a Spark error, if any."""
    match = _EXECUTOR_LOST.search(text)
    if match is None:
        return None
    return f"{match.group(1)}" + (f": {match.group(2).strip()}" if match.group(2) else "")


def python_traceback(text: str) -> str | None:
    """The executor's Python traceback inside a Spark (JVM) error's text, or ``None`` (after
    ``PythonException`` in the JVM's text, or pyspark's own ``An exception was thrown from the
    Python worker`` that a retried task's failure becomes)."""
    start = max(text.find("PythonException"), text.find("thrown from the Python worker"))
    start = text.find("Traceback (most recent call last):", max(start, 0)) if start >= 0 else -1
    if start < 0:
        return None
    ends = [i for i in (text.find(marker, start) for marker in _TRACEBACK_ENDS) if i >= 0]
    return text[start:min(ends, default=len(text))].rstrip()


def spark_error_text(exc: BaseException) -> str:
    """A Spark-side failure as a user should see it: the executor's Python traceback when there
    is one, else the Spark message's own lines without JVM frames."""
    text = str(exc)
    traceback_text = python_traceback(text)
    if traceback_text:
        lines = [ln for ln in traceback_text.splitlines() if ln.strip()]
        shown = lines[-TRACEBACK_LINES:]
        if len(lines) > len(shown):
            shown = [lines[0], "  ..."] + shown
        return "the executor's Python failed:\n" + "\n".join(shown)
    lost = executor_lost_reason(text)
    if lost:
        return f"an executor was lost ({lost})"
    lines = [ln for ln in text.strip().splitlines()
             if ln.strip() and not ln.startswith(("\tat ", "\t... ")) and "py4j" not in ln]
    return "\n".join(lines[:5])
