"""Run an elastic job (``np=MIN:MAX``): Horovod's own elastic driver and rendezvous in the
notebook, one Spark task per slot.

What is Horovod's: :class:`horovod.runner.elastic.driver.ElasticDriver` decides who runs which
rank, blacklists failed hosts, counts resets and tells rank 0 when hosts were added;
the ranks re-form through its rendezvous server (``hvd.elastic.run`` on their side). What is ours:

- the slots are Spark tasks (:mod:`hvd_magics.task.elastic_task`) of one ordinary stage of
  ``MAX`` tasks; each task attempt is one host with one slot, discovered when it offers itself on
  the event channel and gone when its channel closes (its executor was lost) or its rank ended;
- a rank is started by an order on that task's channel, and its end is its ``exit`` event;
- every change of the ranks is a ``resize`` event for the views, with its causes;
- the bounds (start timeout, elastic timeout, reset limit) end the job with errors that name them.

A task that Spark runs again after its executor was lost is a new slot: the job grows back at
its next commit.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from hvd_magics.channel import EventSink
from hvd_magics.events import DriverLogEvent, Event, ResizeEvent, StartRankOrder, to_wire
from hvd_magics.errors import HorovodMagicsError
from hvd_magics.options import ElasticSize
from hvd_magics.launch.spark_backend import (CANCEL_AFTER_S, STATUS_SCHEMA, SparkBackend,
                                             barrier_function)
from hvd_magics.launch.environment_shipping import EnvironmentChoice
from hvd_magics.launch.spark_errors import spark_error_text
from hvd_magics.launch.spark_session import is_local
from hvd_magics.launch.spark_slots import SLOT_WAIT_S, not_enough_slots, task_slots
from hvd_magics.protocol import (CHANNEL_CLOSED, DRIVER_LOG, ENV_GLOO_TIMEOUT,
                                 ENV_HOROVOD_ELASTIC, ENV_HOROVOD_GLOO_IFACE, ENV_LIVE, EXIT,
                                 RESIZE, SLOT_OFFER, START_RANK, is_event)
from hvd_magics.rank_names import TASK, rank_named, ranks_named
from hvd_magics.task.elastic_task import slot_host_prefix
from hvd_magics.task.slots import quiet_request_errors, slot_env
from hvd_magics.task.spark_task import TaskSpec

#: The Gloo timeout of an elastic job's ranks unless the job sets its own. When a rank dies,
#: a survivor that does not talk to it directly notices only when its own wait times out, so
#: this bounds the time from a loss to the reset; it must still cover the time a new rank takes
#: to reach ``hvd.init()`` after it was started.
ELASTIC_GLOO_TIMEOUT_S = 15
#: Exit code recorded for a rank whose task vanished without reporting one.
LOST_CODE = -1
#: After the elastic driver stopped a rank's slot, how long the rank's exit may take to arrive.
EXIT_WAIT_S = 10.0
#: How often the waits of this module look again at what they wait for.
POLL_S = 0.1


class TaskSlots:
    """The slots Horovod's elastic driver may use: tasks that offered themselves and whose rank
    has not ended. It is the driver's host discovery (each task attempt is one host, one slot).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: dict[str, int] = {}  # slot host -> task (partition)
        self._task_host: dict[int, str] = {}  # task -> its current slot host
        self._exits: dict[str, int] = {}  # slot host -> exit code of its rank
        self.offers = 0

    # -- HostDiscovery -------------------------------------------------------------------------
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{slot host: 1}`` for every task ready to run a rank (Horovod's discovery API)."""
        with self._cond:
            return {host: 1 for host in self._ready}

    # -- what the tasks say --------------------------------------------------------------------
    def offer(self, slot_host: str, task: int) -> None:
        """A task is ready to run a rank under the name ``slot_host``."""
        with self._cond:
            self._ready[slot_host] = task
            self._task_host[task] = slot_host
            self.offers += 1
            self._cond.notify_all()

    def ended(self, task: int, code: int) -> str | None:
        """The rank (or the whole task) of ``task`` ended with ``code``; return its slot host
        (``None`` when the task had not offered a slot, or its end was known already)."""
        with self._cond:
            host = self._task_host.get(task)
            if host is None or host in self._exits:
                return None
            if code != 0:  # a rank that ended well stays, lest its end look like a lost host
                self._ready.pop(host, None)
            self._exits[host] = code
            self._cond.notify_all()
            return host

    # -- what the driver asks ------------------------------------------------------------------
    def tasks_on(self, host: str) -> list[int]:
        """The tasks whose slot is on ``host``, an address."""
        prefix = slot_host_prefix(host)
        with self._cond:
            return [task for task, slot in self._task_host.items() if slot.startswith(prefix)]

    def task_of(self, slot_host: str) -> int | None:
        with self._cond:
            return self._ready.get(slot_host)

    @property
    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def wait_ready(self, count: int, deadline: float, stop: threading.Event) -> int:
        """Wait until ``count`` slots are ready (or the deadline, or ``stop``); return how many."""
        with self._cond:
            while len(self._ready) < count and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, POLL_S))
            return len(self._ready)

    def wait_exit(self, slot_host: str, stop_when: list[threading.Event]) -> int | None:
        """The exit code of the rank on ``slot_host``; ``None`` as soon as one of
        ``stop_when`` is set first."""
        with self._cond:
            while slot_host not in self._exits:
                if any(event.is_set() for event in stop_when):
                    return None
                self._cond.wait(POLL_S)
            return self._exits[slot_host]

    def exit_of(self, slot_host: str, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: slot_host in self._exits, timeout)
            return self._exits.get(slot_host)


def _horovod_driver_class() -> type:
    """Horovod's :class:`ElasticDriver`, told to report each new set of ranks and why a
    re-forming failed (imported late: Horovod loads only when an elastic job runs)."""
    from horovod.runner.elastic.driver import ElasticDriver

    class ReportingDriver(ElasticDriver):
        def __init__(self, backend: ElasticSparkBackend, *args: Any, **kwargs: Any) -> None:
            self._backend = backend
            super().__init__(*args, **kwargs)

        def _update_host_assignments(self, current_hosts: Any) -> Any:
            pending = super()._update_host_assignments(current_hosts)
            self._backend.on_ranks_assigned(dict(self._rank_assignments))
            return pending

        def resume(self) -> None:
            try:
                super().resume()
            except Exception as exc:  # Horovod then stops the job without saying why
                self._backend.on_resume_failed(exc)
                raise

        def forget_workers_on(self, prefix: str) -> None:
            """Drop the notification clients of the slots whose name begins with ``prefix``
            (a lost host's). The driver tells the coordinator (rank 0) of each change of hosts
            while it holds the lock that re-forming waits for; a coordinator behind a cut link
            never answers, and the survivors waited 39 s for that connection to give up
            before they re-formed. Without its client the driver skips the notice: the
            survivors have already failed their collective and ask for their new ranks."""
            for key in [key for key in list(self._worker_clients) if key[0].startswith(prefix)]:
                self._worker_clients.pop(key, None)

    return ReportingDriver


class HorovodLogToJob(logging.Filter):
    """Horovod's elastic driver logs through the root logger (``logging.error('failure count ==
    2 -> stop running')``), which a kernel prints into the cell: while the job runs, its records
    go to the job's log file instead (as ``driver_log`` events)."""

    def __init__(self, events: EventSink) -> None:
        super().__init__()
        self._events = events

    def filter(self, record: logging.LogRecord) -> bool:
        if "horovod" not in record.pathname.replace("\\", "/").split("/"):
            return True
        self._events.put(to_wire(DriverLogEvent(
            kind=DRIVER_LOG, rank=None, time=record.created,
            text=f"{record.levelname} horovod: {record.getMessage()}")))
        return False


class ElasticSparkBackend(SparkBackend):
    """An elastic job's Spark side and Horovod's elastic driver (see the module docstring).

    Parameters
    ----------
    spark : SparkSession
        Where the job runs.
    size : ElasticSize
        ``MIN:MAX`` ranks.
    env : dict
        Extra environment for the ranks.
    start_timeout : float
        Seconds to wait for ``MIN`` slots at the start.
    elastic_timeout : float
        Seconds the job may wait with fewer than ``MIN`` slots after it started.
    reset_limit : int or None
        Most times the ranks may re-form (``None``: no limit).
    """

    def __init__(self, spark: Any, size: ElasticSize, env: dict[str, str], start_timeout: float,
                 elastic_timeout: float, reset_limit: int | None,
                 environment: EnvironmentChoice | None = None) -> None:
        # one rank per task: an elastic job gains and loses ranks one task at a time
        super().__init__(spark, size.max_np, {ENV_GLOO_TIMEOUT: str(ELASTIC_GLOO_TIMEOUT_S),
                                              **env}, environment=environment, ranks_per_task=1)
        self.size = size
        self.elastic_max = size.max_np
        self.start_timeout = start_timeout
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.slots = TaskSlots()
        #: Why the job failed as a whole (``None``: it did not, or the ranks' errors say it).
        self.failure: str | None = None
        #: Every formation of the ranks: ``{"reset", "size", "ranks", "causes", "time"}``.
        self.formations: list[ResizeEvent] = []
        self._causes: list[str] = []
        self._driver: Any = None
        self._rendezvous: Any = None
        self._rendezvous_port = 0
        self._address = ""
        self._conductor: threading.Thread | None = None
        self._log_filter: logging.Filter | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._cancelled = False  # the stage was cancelled by us, once the job was over

    # -- start ---------------------------------------------------------------------------------
    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:
        """Check the cluster can ever run ``MIN`` ranks, start Horovod's elastic driver and
        rendezvous, open the channel and submit the stage of ``MAX`` tasks."""
        if not self.live:
            raise HorovodMagicsError(
                f"an elastic job hands out ranks over the notebook's event channel, which the "
                f"executors cannot use here: {self.no_live_view}. Fix: set it up for a live "
                f"view (unset {ENV_LIVE}=0), or run a fixed-size job (np=N).")
        self._check_total_slots()
        self._events = events
        self._log_filter = HorovodLogToJob(events)
        logging.getLogger().addFilter(self._log_filter)
        try:
            self._start_elastic(payload, job_id, events)
        except BaseException:
            logging.getLogger().removeFilter(self._log_filter)
            if self._driver is not None:
                self._driver.stop()
            raise

    def _start_elastic(self, payload: bytes, job_id: str, events: EventSink) -> None:
        from horovod.runner.elastic.rendezvous import create_rendezvous_handler
        from horovod.runner.http.http_server import RendezvousServer

        inbox: queue.Queue = queue.Queue()
        server = self._open_channel(job_id, inbox)
        self._address = server.address.host
        self._rendezvous = RendezvousServer(verbose=0)
        self._driver = _horovod_driver_class()(
            self, self._rendezvous, self.slots, self.size.min_np, self.size.max_np,
            timeout=self.elastic_timeout, reset_limit=self.reset_limit)
        self._rendezvous_port = self._rendezvous.start(create_rendezvous_handler(self._driver))
        quiet_request_errors(self._rendezvous, lambda text: events.put(to_wire(DriverLogEvent(
            kind=DRIVER_LOG, rank=None, time=time.time(), text=text))))
        threading.Thread(target=self._pump, args=(inbox,), name="hvd-elastic-events",
                         daemon=True).start()
        self._submit(TaskSpec(payload, server.address, self.env, job_id, elastic=True))
        self._conductor = threading.Thread(target=self._conduct, name="hvd-elastic-driver",
                                           daemon=True)
        self._conductor.start()

    def _check_total_slots(self) -> None:
        """Refuse at once a cluster whose task slots (busy or not) are fewer than ``MIN``."""
        if self.sc is None:
            self._check_slots(self.size.min_np)
            return
        deadline = time.monotonic() + (0.0 if is_local(self.sc)
                                       else SLOT_WAIT_S)
        while (total := task_slots(self.sc)[1]) < self.size.min_np:
            if time.monotonic() >= deadline:
                raise not_enough_slots(self.size.min_np, task_slots(self.sc)[0], total,
                                       self.sc.master, self.sc.getConf().get("spark.task.cpus",
                                                                            "1"), True,
                                       self.elastic_max)
            time.sleep(POLL_S)

    def _stage(self, spec: TaskSpec) -> Any:
        """``MAX`` ordinary tasks over nothing: Spark runs those it has slots for, and runs a
        lost one again when a slot frees up."""
        return (self.spark.range(0, self.np, 1, self.np)
                .mapInArrow(barrier_function(spec), STATUS_SCHEMA))

    # -- events --------------------------------------------------------------------------------
    def _pump(self, inbox: queue.Queue) -> None:
        """Learn the slots from the tasks' events, then pass every event on to the job."""
        while True:
            event = inbox.get()
            if event is None:
                return
            if is_event(event):
                self._learn(event)
            assert self._events is not None  # start() gave them before it started this thread
            self._events.put(event)

    def _learn(self, event: Event) -> None:
        """What a task's event says of its slot: offered, or ended (its rank's exit, its
        channel's end); a slot's end says why the ranks re-form."""
        task = event.get("rank")
        if task is None:  # every task's event names it (its channel stamps it)
            return
        if event["kind"] == SLOT_OFFER:
            self.slots.offer(event["slot_host"], task)
        elif event["kind"] == EXIT:
            code = event.get("code")
            if self.slots.ended(task, code if code is not None else LOST_CODE) and code:
                self._causes.append(
                    f"the rank of {rank_named(task, TASK)} exited with code {code}")
        elif event["kind"] == CHANNEL_CLOSED:
            clean = event.get("clean")
            if self.slots.ended(task, 0 if clean else LOST_CODE) and not clean:
                self._causes.append(
                    f"{rank_named(task, TASK)} was lost (its executor went away)")

    def on_ranks_assigned(self, ranks: dict[int, Any]) -> None:
        """Horovod's driver formed the ranks anew: tell the views (a ``resize`` event)."""
        by_task = {}
        for rank, slot in ranks.items():
            task = self.slots.task_of(slot.hostname)
            if task is not None:
                by_task[task] = rank
        previous = self.formations[-1]["ranks"] if self.formations else {}
        causes, self._causes = self._causes, []
        joined = sorted(set(by_task) - set(previous))
        if self.formations and joined:
            causes.append(f"{ranks_named(joined, TASK)} joined")
        formation = ResizeEvent(kind=RESIZE, rank=None, recv=time.monotonic(),
                                reset=len(self.formations), size=len(ranks), ranks=by_task,
                                causes=causes, time=time.time())
        self.formations.append(formation)
        assert self._events is not None  # Horovod's driver forms ranks only after start()
        self._events.put(to_wire(formation.copy()))

    def on_resume_failed(self, exc: BaseException) -> None:
        """Why the ranks could not re-form, in the job's own terms."""
        from horovod.runner.common.util.timeout import TimeoutException

        if isinstance(exc, TimeoutException):
            self.failure = (
                f"fewer than the minimum of {self.size.min_np} ranks (np={self.size}) were left "
                f"for longer than elastic_timeout={self.elastic_timeout:.0f} s "
                f"(--elastic-timeout), so the job stopped. Fix: add executors, lower the "
                f"minimum, or raise elastic_timeout.")
        else:
            self.failure = f"the ranks could not re-form: {exc}"

    # -- the driver's side of a slot -----------------------------------------------------------
    def _create_worker(self, slot_info: Any, stop_when: list[threading.Event]) -> tuple[int, float]:
        """Horovod's ``create_worker_fn``: start the rank of ``slot_info`` in its task, wait for
        its end; return ``(exit code, time)``."""
        task = self.slots.task_of(slot_info.hostname)
        env = slot_env(slot_info, self._address, self._rendezvous_port)
        env.pop(ENV_HOROVOD_GLOO_IFACE)  # the task knows its own interface
        env[ENV_HOROVOD_ELASTIC] = "1"
        server = self._server
        assert server is not None  # Horovod's driver starts workers only after start()
        if task is None or not server.send_order(task, StartRankOrder(kind=START_RANK, env=env)):
            return LOST_CODE, time.time()
        code = self.slots.wait_exit(slot_info.hostname, stop_when)
        if code is None:  # the driver stopped this slot (job over, or its host blacklisted)
            server.drop(task)
            code = self.slots.exit_of(slot_info.hostname, EXIT_WAIT_S)
        return (code if code is not None else LOST_CODE), time.time()

    def _conduct(self) -> None:
        """Wait for the first ranks, run Horovod's elastic driver to its end, judge how it
        ended; then let the tasks go."""
        try:
            initial = self._initial_size()
            deadline = time.monotonic() + self.start_timeout
            ready = 0
            while time.monotonic() < deadline and not self._stopping.is_set():
                ready = self.slots.wait_ready(initial, min(deadline, time.monotonic() + 0.5),
                                              self._stopping)
                if ready >= initial:
                    break
                if super().finished and ready < self.size.min_np:
                    self.failure = self._stage_ended_early()  # e.g. executors lack our packages
                    return
            if self._stopping.is_set():
                return
            if ready < self.size.min_np:
                self.failure = (
                    f"only {ready} of the minimum of {self.size.min_np} ranks (np={self.size}) "
                    f"could start within start_timeout={self.start_timeout:.0f} s "
                    f"(--start-timeout). Fix: add executors or cores, lower the minimum, or "
                    f"raise start_timeout.")
                return
            self._driver.wait_for_available_slots(min(ready, initial))
            self._driver.start(self.size.min_np, self._create_worker)
            results = self._driver.get_results()
            if results.error_message and self.failure is None:
                self.failure = self._reset_limit_message(results.error_message)
        except BaseException as exc:  # noqa: BLE001 - reported by the launcher
            if self.failure is None:
                self.failure = f"the elastic driver failed: {type(exc).__name__}: {exc}"
        finally:
            if self._driver is not None and not self._driver.finished():
                self._driver.stop()
            if self._server is not None:
                self._server.close()  # tasks still waiting for a rank end now
            self._end_stage()
            if self._log_filter is not None:  # (set by start(), before this thread began)
                logging.getLogger().removeFilter(self._log_filter)
            self._done.set()

    def _end_stage(self) -> None:
        """Let the stage end by itself: its tasks saw the channel close, and tasks that get a
        slot only now find it closed and return at once. Cancel it only when tasks that Spark
        has no slot for keep it waiting."""
        if self._thread is not None:
            self._thread.join(CANCEL_AFTER_S)
        if self._group and self._thread is not None and self._thread.is_alive():
            self._cancelled = True
            self._cancel_stage()

    def _initial_size(self) -> int:
        """How many ranks to start with: the free task slots now, within ``MIN:MAX``."""
        free = self.np
        if self.sc is not None:
            free = task_slots(self.sc)[0]
        return max(self.size.min_np, min(self.size.max_np, free))

    def _reset_limit_message(self, horovod_message: str) -> str:
        from horovod.runner.elastic.constants import RESET_LIMIT_EXCEEDED_MESSAGE

        if horovod_message == RESET_LIMIT_EXCEEDED_MESSAGE.format(self.reset_limit):
            return (f"the ranks had to re-form once more after {self.reset_limit} resets, which "
                    f"is the job's reset_limit={self.reset_limit} (--reset-limit), so it "
                    f"stopped. Fix: find why ranks keep leaving (the resets above name each "
                    f"cause), or raise reset_limit.")
        return horovod_message

    # -- the launcher's view -------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether the elastic driver and the Spark stage have both ended."""
        return self._done.is_set() and super().finished

    def stop(self) -> None:
        """Stop the elastic driver, every rank and the stage."""
        self._stopping.set()
        if self._driver is not None and not self._driver.finished():
            self._driver.stop()
        super().stop()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if self._conductor is not None:
            self._conductor.join(timeout)
        ended = super().join(max(deadline - time.monotonic(), 0.0))
        return ended and self._done.is_set()

    def took_every_rank(self) -> str | None:
        """Said by :meth:`describe_failure` (an elastic job's own end)."""
        return None

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:  # noqa: ARG002
        """No notice: an elastic job goes on without the executor's ranks once it is gone."""
        return {}

    def lose_host(self, host: str) -> None:
        """The supervisors of ``host``'s tasks went silent (its link or machine was lost): their
        slots end as lost, so that Horovod's elastic driver blacklists them and the others
        re-form without them, rather than wait for a channel that a cut link never closes; and
        Spark is asked to remove the host's executors."""
        super().lose_host(host)
        if self._driver is not None:
            self._driver.forget_workers_on(slot_host_prefix(host))
        for task in self.slots.tasks_on(host):
            if self.slots.ended(task, LOST_CODE):
                self._causes.append(f"{rank_named(task, TASK)} on {host} stopped answering: "
                                    "its link or machine was lost")
            assert self._server is not None  # its tasks offered their slots over the channel
            self._server.drop(task)

    def describe_failure(self) -> str | None:
        """Why the job failed as a whole. Tasks that ran after the job was over (and found the
        channel closed), or a stage cancelled for its waiting tasks, are not failures."""
        if self.failure:
            return self.failure
        if self.error is not None and not self._cancelled:
            return spark_error_text(self.error)
        return None

    def _stage_ended_early(self) -> str:
        """Why the stage ended before the job could start (every task returned)."""
        return (SparkBackend.describe_failure(self)
                or "every Spark task of the job ended before the ranks could start")
