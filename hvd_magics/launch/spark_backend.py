"""Run a job's ranks as one Spark barrier stage (``np > 0``): :class:`SparkBackend`, what its
tasks run and how their kept events are replayed. The session it runs on is
:mod:`~hvd_magics.launch.spark_session`'s, its slots :mod:`~hvd_magics.launch.spark_slots`'s,
Spark's failures read by :mod:`~hvd_magics.launch.spark_errors`."""
from __future__ import annotations

import base64
import functools
import heapq
import json
import sys
import threading
import time
from typing import Any
from collections.abc import Sequence

import cloudpickle

from hvd_magics.task import task_entry
from hvd_magics.errors import HorovodMagicsError
from hvd_magics.channel import EventServer, EventSink
from hvd_magics.options import DEFAULT_START_TIMEOUT_S
from hvd_magics.launch import console_bar, interrupt_guard
from hvd_magics.launch.dataframe_input import DataFrameSources, sharded_input
from hvd_magics.launch.encryption import IGNORE_SSL, check_encryption
from hvd_magics.launch.environment_shipping import EnvironmentChoice, say
from hvd_magics.launch.meeting_point import MeetingPoint
from hvd_magics.launch.package_shipping import ship_package
from hvd_magics.launch.spark_errors import (MISSING_PACKAGES_FIX, SHIPPED_MISSING_FIX,
                                            disk_full_unpacking, spark_error_text)
from hvd_magics.launch.spark_session import (CONNECT_PROBE_S, cancel_running_jobs,
                                             check_connect_session,
                                             connect_server_gone, driver_address,
                                             executors_run_this_python, give_up_retries,
                                             is_connect,
                                             local_workers_use_this_python,
                                             no_live_view_reason)
from hvd_magics.launch.spark_slots import (SLOT_WAIT_S, check_slots, local_master_slots,
                                           not_enough_slots, task_layout)
from hvd_magics.events import (DropShardsOrder, EndPoolOrder, InterruptCellOrder, Order,
                               PreemptOrder, RunCellOrder, TakeStacksOrder, Wire)
from hvd_magics.protocol import (DROP_SHARDS, END_POOL, ENV_DRIVER_HOST, ENV_LIVE,
                                 INTERRUPT_CELL, PREEMPT, RUN_CELL, TAKE_STACKS)
from hvd_magics.task.event_buffer import replay
from hvd_magics.task.spark_task import TaskSpec

#: After the channel closed (its supervisors kill their ranks), how long the stage may take to
#: end by itself before it is cancelled (3 s was too short on a loaded machine: a stopped job's
#: killed tasks then made Spark warn in the user's next cells)...
CANCEL_AFTER_S = 6.0


#: ...or, while some of its tasks have not yet reached the channel (their Python is starting;
#: each is turned away as it does and ends quietly), how long in all.
CANCEL_LATE_TASKS_AFTER_S = 15.0


#: How long the cancel of a Connect job may take (pyspark retries for ten minutes otherwise).
INTERRUPT_WAIT_S = 10.0


#: The slowest rates at which an executor is expected to fetch the shipped environment's
#: archive from the driver and write it unpacked (bytes a second), and how much larger it is
#: unpacked (venv-pack's gzip level 1 of a PyTorch and TensorFlow venv: 1.9 GB -> 4.8 GB).
FETCH_BYTES_PER_S = 10e6
UNPACK_BYTES_PER_S = 20e6
UNPACKED_PER_ARCHIVE_BYTE = 2.5

#: The one column each barrier task returns (a JSON status line).
STATUS_SCHEMA = "status string"


def barrier_function(spec: TaskSpec) -> Any:
    """The ``mapInArrow`` function each barrier task runs: it works (and reports) even on an
    executor whose Python lacks hvd_magics, since :mod:`hvd_magics.task.task_entry` travels by
    value."""
    from pyspark import cloudpickle as spark_cloudpickle

    spark_cloudpickle.register_pickle_by_value(task_entry)
    return functools.partial(task_entry.arrow_barrier_task, cloudpickle.dumps(spec))


def replay_order(buffered: dict[int, list[Wire]]) -> list[Wire]:
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
    environment : EnvironmentChoice, optional
        The notebook's environment, packed and sent for the ranks to run in
        (``hvd_magics.ship_environment()``).
    ranks_per_task : int, optional
        Rank processes per Spark task (``None``: one per GPU the session gives a task, else
        one); see :func:`~hvd_magics.launch.spark_slots.task_layout`.
    ignore_ssl : str
        The setting that allows the job on a session with ``spark.ssl.enabled=true``
        (:func:`~hvd_magics.launch.encryption.check_encryption`): pyspark's
        ``TorchDistributor`` one, or its ``DeepspeedTorchDistributor`` one for that drop-in.

    Raises
    ------
    EncryptionRequired
        When the session asks for TLS and ``ignore_ssl`` is not ``true`` there.
    SparkSessionLost
        When a Spark Connect session's server is gone.
    """

    #: A cold job's ranks end with it (a warm pool's backend keeps them).
    keeps_ranks = False
    #: What a warm pool says after a cell's error when it had to restart its ranks.
    restart_note = ""

    def __init__(self, spark: Any, np: int, env: dict[str, str],
                 sources: DataFrameSources | None = None, pool: bool = False,
                 slot_wait_s: float = SLOT_WAIT_S, held_slots: int = 0,
                 background: bool = False, environment: EnvironmentChoice | None = None,
                 ranks_per_task: int | None = None,
                 gone_wait_s: float = DEFAULT_START_TIMEOUT_S,
                 ignore_ssl: str = IGNORE_SSL) -> None:
        self.spark = spark
        #: How long a job short of slots waits for an executor gone lately (its start timeout).
        self.gone_wait_s = gone_wait_s
        self.environment = environment
        #: Bytes of the environment's archive this job sent the executors (0: none new).
        self.sent_archive = 0
        #: Hosts the driver took for lost (:meth:`lose_host`).
        self.lost_hosts: list[str] = []
        #: Executors being decommissioned that ran ranks of this job (told by a notice): asked
        #: to go once the job has stopped.
        self.decommissioned: set[str] = set()
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
        master = check_connect_session(spark) if self.sc is None else self.sc.master
        # every job on Spark tasks (cold, a pool's, elastic, the drop-ins') passes here
        check_encryption(spark, ignore_ssl)
        #: How the ranks sit in the stage's tasks.
        self.layout = task_layout(self._conf, master, np, ranks_per_task)
        self.where = (f"spark {master}" + (" (Connect)" if self.connect else "") +
                      self.layout.describe())
        #: Why the job's events come back only at its end (``None``: they stream live).
        self.no_live_view = no_live_view_reason(spark)
        self.error: BaseException | None = None
        #: What each task returned through Spark (one JSON line each), once the job ended.
        self.results: list[dict[str, Any]] = []
        self._server: EventServer | None = None
        self._thread: threading.Thread | None = None
        self._events: EventSink | None = None
        self._group = ""
        #: Why the Spark Connect server counts as gone (``None``: it answers, or not checked).
        self.server_gone: str | None = None
        #: A warm pool's stage is kept from Spark's console bar and from pyspark's Ctrl-C
        #: handler until it ends (:meth:`_guard_pool`).
        self._pool_guarded = False
        self._bar_paused = False

    def _conf(self, key: str) -> str | None:
        """The session's setting ``key`` (``None`` when unset)."""
        if self.sc is not None:
            return self.sc.getConf().get(key, None)
        return self.spark.conf.get(key, None)

    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:
        """Check the slots, open the event channel and submit the stage.

        (A Connect session can count only a local master's slots, and not the busy ones:
        elsewhere the start timeout says when the cluster is too small.)"""
        self._check_slots(self.layout.slots)
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
                                                        if s.no_nulls},
                              ranks_per_task=self.layout.ranks_per_task))

    def _order_all(self, order: Order) -> None:
        if self._server is not None:
            for rank in range(self.np):
                self._server.send_order(rank, order)

    def send_cell(self, frames: Sequence[bytes]) -> None:
        """A warm pool: give each rank its next cell (``frames[rank]``, one stdin frame, as an
        order)."""
        if self._server is not None:
            for rank, frame in enumerate(frames):
                self._server.send_order(rank, RunCellOrder(
                    kind=RUN_CELL, frame=base64.b64encode(frame).decode()))

    def drop_shards(self, deal: str) -> None:
        """A warm pool: the ranks' tasks delete the shards of ``deal``."""
        self._order_all(DropShardsOrder(kind=DROP_SHARDS, deal=deal))

    @property
    def channel_secret(self) -> bytes:
        """The secret of the job's event channel (a warm pool's dealers sign with it too)."""
        if self._server is None:
            raise RuntimeError("the job has no event channel")
        return self._server.address.secret

    def request_stacks(self, request: str) -> None:
        """Ask every rank for its stacks (``stacks`` events carrying ``request``); without an
        event channel (``HVD_MAGICS_LIVE=0``) nobody answers."""
        self._order_all(TakeStacksOrder(kind=TAKE_STACKS, request=request))

    def interrupt_cell(self) -> None:
        """A warm pool: interrupt the cell every rank runs."""
        self._order_all(InterruptCellOrder(kind=INTERRUPT_CELL))

    def end_pool(self) -> None:
        """A warm pool: end the ranks' input; they leave Horovod together and exit."""
        self._order_all(EndPoolOrder(kind=END_POOL))

    def _check_slots(self, np: int) -> None:
        """Raise at once when the cluster cannot run ``np`` tasks at the same time."""
        if self.sc is not None:
            check_slots(self.sc, np, self.slot_wait_s, self.reads_data, self.held_slots,
                        self.layout, self.gone_wait_s)
        else:  # Spark Connect: only a local master tells its size
            master = self.spark.conf.get("spark.master", "")
            cpus = self.spark.conf.get("spark.task.cpus", "1")
            total = local_master_slots(master, int(cpus))
            if total is not None and np > total - self.held_slots:
                raise not_enough_slots(np, max(total - self.held_slots, 0), total, master, cpus,
                                       self.reads_data, self.elastic_max, self.held_slots)

    def _open_channel(self, job_id: str, events: EventSink) -> EventServer:
        """Listen for the tasks' events on the address the executors reach; the channel (also
        kept as the job's)."""
        address = driver_address(self.spark)
        try:
            self._server = EventServer(address, job_id,
                                       MeetingPoint(events, self.np, self._order_all))
        except OSError as exc:
            raise OSError(f"cannot listen for the ranks' events on {address} ({exc}); set "
                          f"{ENV_DRIVER_HOST} to an address of this machine, or {ENV_LIVE}=0 "
                          "to run without a live view") from None
        return self._server

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

    def _stage(self, spec: TaskSpec) -> Any:
        """One barrier stage through the DataFrame API: a partition per task, over the rows of
        the job's DataFrames (or over nothing), under the layout's resource profile."""
        tasks = self.layout.tasks
        ranks = (sharded_input(self.sources, tasks) if self.reads_data
                 else self.spark.range(0, tasks, 1, tasks))
        profile = self.layout.resource_profile
        return ranks.mapInArrow(barrier_function(spec), STATUS_SCHEMA, barrier=True,
                                **({"profile": profile} if profile is not None else {}))

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
        next cells); at once when a host was lost (its tasks cannot end)."""
        if self._server is not None:
            self._server.close(linger=not self.finished)  # closed for good once it ended
        if self._thread is not None and self.live and not self.lost_hosts:
            began = time.monotonic()
            self._thread.join(CANCEL_AFTER_S)
            while self._thread.is_alive() and self._server is not None and \
                    len(self._server.greeted) < self.np and \
                    time.monotonic() - began < CANCEL_LATE_TASKS_AFTER_S:
                self._thread.join(0.1)
        if self._group and not self.finished:
            self._cancel_stage()
        if self._server is not None and self.finished:
            self._server.close()  # no task connects any more
        if self.decommissioned:  # they would keep the application's cores until they die:
            self._kill_executors(sorted(self.decommissioned))  # the cluster starts others now

    def _cancel_stage(self) -> None:
        """Cancel this job's Spark stage: by its tag on Connect, else the group's jobs that run
        now, by id (a stop in the job's start comes before Spark has one to cancel)."""
        if self.connect:
            self._interrupt_connect()
        else:
            cancel_running_jobs(self.sc, self._group)

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

    def heard_ago(self, now: float) -> dict[int, float]:
        """Per rank whose task reached the event channel: seconds since its last frame."""
        if self._server is None:
            return {}
        return {rank: now - heard for rank, heard in list(self._server.heard.items())}

    def probe_link(self, rank: int, order: dict[str, Any]) -> bool:
        """Send the link probe ``order`` to the task of ``rank`` over the event channel."""
        return self._server is not None and self._server.send_order(rank, order)

    def took_every_rank(self) -> str | None:
        """The Spark Connect server, once it was found gone (:meth:`describe_failure`)."""
        return self.server_gone if self.connect else None

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:
        """Ranks whose executor Spark's scheduler has pending decommission (its
        ``executorsPendingDecommission``, looked up through the ranks' task ids)."""
        if self.sc is None or not tasks:  # Spark Connect: the server's scheduler is out of reach
            return {}
        try:
            scheduler = self.sc._jsc.sc().taskScheduler()  # noqa: SLF001 - Spark's own state
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
            self.decommissioned.update(executor for executor, _ in found.values())
            return found
        except Exception:  # noqa: BLE001 - a scheduler of another kind: no notice, as before
            return {}

    def preempt(self, at: int, notice: str) -> None:
        self._order_all(PreemptOrder(kind=PREEMPT, at=at, notice=notice))

    def lose_host(self, host: str) -> None:
        """Ask Spark to remove the executors of ``host`` from the application (it still offers
        them for its own heartbeat timeout, a minute or more; a restart's tasks sent there wait
        for it), keeping the application's number of executors, so that the cluster starts
        others in their place, there once the host is back (``SparkContext.killExecutor``
        lowers it: the host's slots never came back)."""
        self.lost_hosts.append(host)  # its tasks will not end by themselves: no wait at the stop
        if self.sc is None:  # Spark Connect: the server's scheduler is out of reach
            return
        try:
            jsc = self.sc._jsc.sc()  # noqa: SLF001 - Spark's own executor list
            executors = jsc.statusStore().executorList(True)
            listed = [executors.apply(i) for i in range(executors.size())]
            lost = [executor.id() for executor in listed if executor.id() != "driver"
                    and executor.hostPort().split(":")[0] == host]
        except Exception as exc:  # noqa: BLE001 - Spark's heartbeat timeout still removes it
            say(f"could not ask Spark to remove the executors of {host} ({exc}); Spark's own "
                "heartbeat timeout will")
            return
        if lost:
            self._kill_executors(lost, f"the executors of {host}")

    def _kill_executors(self, executors: list[str], what: str = "") -> None:
        """Ask Spark to remove ``executors`` from the application, keeping its number of
        executors (the cluster starts others in their place)."""
        try:
            # executors known from the SparkContext's scheduler (none on Spark Connect)
            assert self.sc is not None
            jsc = self.sc._jsc.sc()  # noqa: SLF001 - Spark's own kill call
            ids = self.sc._jvm.java.util.ArrayList()  # noqa: SLF001
            for executor in executors:
                ids.add(executor)
            seq = self.sc._jvm.scala.jdk.javaapi.CollectionConverters.asScala(  # noqa: SLF001
                ids).toSeq()
            # (ids, adjustTargetNumExecutors, countFailures, force)
            jsc.schedulerBackend().killExecutors(seq, False, False, True)
        except Exception as exc:  # noqa: BLE001 - they go when their machine does
            say(f"could not ask Spark to remove {what or 'executors ' + ', '.join(executors)} "
                f"({exc}); they go when their machine does")

    def unpacking(self) -> tuple[float, str] | None:
        """When this job sent the executors the environment's archive (the first job of the
        application after it changed): Spark fetches and unpacks it on each executor before the
        task's Python starts, which the start timeout must not count; the seconds allowed for
        it at the slowest rates a cluster is expected to have."""
        if not self.sent_archive:
            return None
        seconds = self.sent_archive / FETCH_BYTES_PER_S + UNPACKED_PER_ARCHIVE_BYTE * \
            self.sent_archive / UNPACK_BYTES_PER_S
        return seconds, (f"the executors fetch and unpack the notebook's environment "
                         f"({self.sent_archive / 1e9:.1f} GB packed) before its ranks start")

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
        full = (disk_full_unpacking(str(self.error), self.environment.archive_bytes())
                if self.error is not None and self.environment is not None else None)
        if setup:
            text = setup[0]["error"]
        elif full is not None:
            return full
        elif self.error is not None:
            text = spark_error_text(self.error)
        else:
            return None
        if "cannot import hvd_magics" in text or "No module named" in text:
            text += self.missing_module_fix()
        return text

    def missing_module_fix(self) -> str:
        """The executors lack a module: ship the environment (or install it in the notebook,
        when it is shipped); nothing on a local master, whose ranks run this very Python."""
        if executors_run_this_python(self.spark):
            return ""
        return SHIPPED_MISSING_FIX if self.environment is not None else MISSING_PACKAGES_FIX

