"""Run a job's ranks as one Spark barrier stage (``np > 0``): :class:`SparkBackend` and what its
tasks run. Its Spark job (submitted, its kept events replayed, cancelled, its failure said) is a
:class:`~hvd_magics.launch.spark_stage.SparkStage`, what it tells the ranks over the event
channel :class:`~hvd_magics.launch.rank_orders.RankOrders`'. The session it runs on is
:mod:`~hvd_magics.launch.spark_session`'s, its slots :mod:`~hvd_magics.launch.spark_slots`'s,
Spark's failures read by :mod:`~hvd_magics.launch.spark_errors`, its executors asked of through
:mod:`~hvd_magics.launch.spark_executors`."""
from __future__ import annotations

import sys
import time
from typing import Any


from hvd_magics.errors import HorovodMagicsError
from hvd_magics.channel import EventServer, EventSink
from hvd_magics.options import DEFAULT_START_TIMEOUT_S
from hvd_magics.launch.dataframe_input import DataFrameSources, sharded_input
from hvd_magics.launch.encryption import IGNORE_SSL, check_encryption
from hvd_magics.launch.environment_shipping import EnvironmentChoice
from hvd_magics.launch.meeting_point import MeetingPoint
from hvd_magics.launch.rank_orders import RankOrders
from hvd_magics.launch.spark_executors import (kill_executors, pending_decommission,
                                               remove_host_executors)
from hvd_magics.launch.spark_session import (check_connect_session, driver_address,
                                             no_live_view_reason)
from hvd_magics.launch.spark_slots import (SLOT_WAIT_S, check_slots, local_master_slots,
                                           not_enough_slots, task_layout)
from hvd_magics.launch.spark_stage import STATUS_SCHEMA, SparkStage, barrier_function, replay_order
from hvd_magics.launch.stage_guard import StageGuard
from hvd_magics.protocol import ENV_DRIVER_HOST, ENV_LIVE
from hvd_magics.task.spark_task import TaskSpec

__all__ = ["CANCEL_AFTER_S", "CANCEL_LATE_TASKS_AFTER_S", "STATUS_SCHEMA", "SparkBackend",
           "barrier_function", "replay_order"]

#: After the channel closed (its supervisors kill their ranks), how long the stage may take to
#: end by itself before it is cancelled (3 s was too short on a loaded machine: a stopped job's
#: killed tasks then made Spark warn in the user's next cells)...
CANCEL_AFTER_S = 6.0


#: ...or, while some of its tasks have not yet reached the channel (their Python is starting;
#: each is turned away as it does and ends quietly), how long in all.
CANCEL_LATE_TASKS_AFTER_S = 15.0




class SparkBackend(SparkStage, RankOrders):
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
        super().__init__(spark, np, environment)
        #: How long a job short of slots waits for an executor gone lately (its start timeout).
        self.gone_wait_s = gone_wait_s
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
        self._server: EventServer | None = None
        #: The stage is kept from Spark's console bar (and a warm pool's or background job's
        #: from pyspark's Ctrl-C handler) until it ends.
        self._guard = StageGuard()

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
        if self.sc is not None:
            self._guard.hold(self.sc, f"hvd_magics-{job_id}", self.pool or self.background)
        self._submit(TaskSpec(payload, self._server.address if self._server else None, self.env,
                              job_id, {source.index: source.name for source in self.sources},
                              pool=self.pool, no_nulls={s.index: s.no_nulls for s in self.sources
                                                        if s.no_nulls},
                              ranks_per_task=self.layout.ranks_per_task))

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

    def _stage(self, spec: TaskSpec) -> Any:
        """One barrier stage through the DataFrame API: a partition per task, over the rows of
        the job's DataFrames (or over nothing), under the layout's resource profile."""
        tasks = self.layout.tasks
        ranks = (sharded_input(self.sources, tasks) if self.reads_data
                 else self.spark.range(0, tasks, 1, tasks))
        profile = self.layout.resource_profile
        return ranks.mapInArrow(barrier_function(spec), STATUS_SCHEMA, barrier=True,
                                **({"profile": profile} if profile is not None else {}))

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
            kill_executors(self.sc, sorted(self.decommissioned))  # the cluster starts others now

    def join(self, timeout: float) -> bool:
        """Wait for the Spark job to end; ``True`` when it did (``False`` at once when a
        Connect server is gone: its job cannot end)."""
        self._join_stage(timeout)
        if self._server is not None and self.finished:
            self._server.close()
        if self.finished:
            self._guard.release(self._group)
        return self.finished

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:
        """Ranks whose executor Spark's scheduler has pending decommission (its
        ``executorsPendingDecommission``, looked up through the ranks' task ids)."""
        if self.sc is None or not tasks:  # Spark Connect: the server's scheduler is out of reach
            return {}
        found = pending_decommission(self.sc, tasks)
        self.decommissioned.update(executor for executor, _ in found.values())
        return found

    def lose_host(self, host: str) -> None:
        """Ask Spark to remove the executors of ``host`` from the application (it still offers
        them for its own heartbeat timeout, a minute or more; a restart's tasks sent there wait
        for it), keeping the application's number of executors, so that the cluster starts
        others in their place, there once the host is back (``SparkContext.killExecutor``
        lowers it: the host's slots never came back)."""
        self.lost_hosts.append(host)  # its tasks will not end by themselves: no wait at the stop
        if self.sc is not None:  # (Spark Connect: the server's scheduler is out of reach)
            remove_host_executors(self.sc, host)
