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
from hvd_magics.events import to_wire
from hvd_magics.errors import HorovodMagicsError
from hvd_magics.options import ElasticSize
from hvd_magics.launch.elastic_bounds import reset_limit_failure, resume_failure, too_few_started
from hvd_magics.launch.elastic_formations import Formations
from hvd_magics.launch.elastic_slots import LOST_CODE, POLL_S, TaskSlots
from hvd_magics.launch.horovod_elastic import (HorovodLogToJob, SlotWorker, quiet_rendezvous,
                                              reporting_driver_class)
from hvd_magics.launch.spark_backend import (CANCEL_AFTER_S, STATUS_SCHEMA, SparkBackend,
                                             barrier_function)
from hvd_magics.launch.environment_shipping import EnvironmentChoice
from hvd_magics.launch.spark_errors import spark_error_text
from hvd_magics.launch.spark_slots import check_total_slots, task_slots
from hvd_magics.protocol import ENV_GLOO_TIMEOUT, ENV_LIVE, is_event
from hvd_magics.task.elastic_task import slot_host_prefix
from hvd_magics.task.spark_task import TaskSpec

#: The Gloo timeout of an elastic job's ranks unless the job sets its own. When a rank dies,
#: a survivor that does not talk to it directly notices only when its own wait times out, so
#: this bounds the time from a loss to the reset; it must still cover the time a new rank takes
#: to reach ``hvd.init()`` after it was started.
ELASTIC_GLOO_TIMEOUT_S = 15


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
        #: Every formation of the ranks, and what will make them re-form.
        self.formations = Formations()
        self._driver: Any = None
        self._rendezvous: Any = None
        #: Starts each slot's rank for Horovod's driver (made once the channel is open).
        self._worker: SlotWorker | None = None
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
        self._rendezvous = RendezvousServer(verbose=0)
        self._driver = reporting_driver_class()(
            self, self._rendezvous, self.slots, self.size.min_np, self.size.max_np,
            timeout=self.elastic_timeout, reset_limit=self.reset_limit)
        self._worker = SlotWorker(self.slots, server, server.address.host,
                                  self._rendezvous.start(create_rendezvous_handler(self._driver)))
        quiet_rendezvous(self._rendezvous, events)
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
        else:
            check_total_slots(self.sc, self.size.min_np, self.size.max_np, POLL_S)

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
            if is_event(event) and (cause := self.slots.learn(event)):
                self.formations.note(cause)
            assert self._events is not None  # start() gave them before it started this thread
            self._events.put(event)

    def on_ranks_assigned(self, ranks: dict[int, Any]) -> None:
        """Horovod's driver formed the ranks anew: tell the views (a ``resize`` event)."""
        by_task = {}
        for rank, slot in ranks.items():
            task = self.slots.task_of(slot.hostname)
            if task is not None:
                by_task[task] = rank
        formation = self.formations.formed(by_task, len(ranks))
        assert self._events is not None  # Horovod's driver forms ranks only after start()
        self._events.put(to_wire(formation.copy()))

    def on_resume_failed(self, exc: BaseException) -> None:
        """Why the ranks could not re-form, in the job's own terms."""
        self.failure = resume_failure(exc, self.size, self.elastic_timeout)

    # -- the job's life on Horovod's side ---------------------------------------------------------
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
                self.failure = too_few_started(ready, self.size, self.start_timeout)
                return
            self._driver.wait_for_available_slots(min(ready, initial))
            self._driver.start(self.size.min_np, self._worker)
            results = self._driver.get_results()
            if results.error_message and self.failure is None:
                self.failure = reset_limit_failure(results.error_message, self.reset_limit)
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
                self.formations.host_lost(task, host)
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
