"""Horovod's side of an elastic job, run in the notebook: its :class:`ElasticDriver`, told to report
each formation of the ranks and why a re-forming failed, and to forget a lost host's workers; its
log records sent to the job's log; and its ``create_worker_fn``, which starts a slot's rank in
that slot's Spark task and waits for its end."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from hvd_magics.channel import EventServer, EventSink
from hvd_magics.events import DriverLogEvent, StartRankOrder, to_wire
from hvd_magics.launch.elastic_slots import LOST_CODE, TaskSlots
from hvd_magics.protocol import DRIVER_LOG, ENV_HOROVOD_ELASTIC, ENV_HOROVOD_GLOO_IFACE, START_RANK
from hvd_magics.task.slots import quiet_request_errors, slot_env

#: After the elastic driver stopped a rank's slot, how long the rank's exit may take to arrive.
EXIT_WAIT_S = 10.0


class DriverListener(Protocol):
    """What Horovod's driver tells the job (:func:`reporting_driver_class`)."""

    def on_ranks_assigned(self, ranks: dict[int, Any]) -> None:
        """The driver formed the ranks anew (``ranks``: its slot of each rank)."""

    def on_resume_failed(self, exc: BaseException) -> None:
        """The ranks could not re-form (Horovod then stops the job without saying why)."""


def reporting_driver_class() -> type:
    """Horovod's :class:`ElasticDriver`, told to report each new set of ranks and why a
    re-forming failed (imported late: Horovod loads only when an elastic job runs)."""
    from horovod.runner.elastic.driver import ElasticDriver

    class ReportingDriver(ElasticDriver):
        def __init__(self, backend: DriverListener, *args: Any, **kwargs: Any) -> None:
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


class SlotWorker:
    """Horovod's ``create_worker_fn`` for slots that are Spark tasks: the rank of a slot started
    by an order on its task's channel (``server``), its end waited for.

    Parameters
    ----------
    slots : TaskSlots
        The job's slots.
    server : EventServer
        The job's event channel.
    address : str
        Where the ranks reach Horovod's rendezvous (the channel's host), and its ``port``.
    """

    def __init__(self, slots: TaskSlots, server: EventServer, address: str, port: int) -> None:
        self.slots, self.server, self.address, self.port = slots, server, address, port

    def __call__(self, slot_info: Any, stop_when: list[threading.Event]) -> tuple[int, float]:
        """Start the rank of ``slot_info`` in its task, wait for its end; return ``(exit code,
        time)``."""
        task = self.slots.task_of(slot_info.hostname)
        env = slot_env(slot_info, self.address, self.port)
        env.pop(ENV_HOROVOD_GLOO_IFACE)  # the task knows its own interface
        env[ENV_HOROVOD_ELASTIC] = "1"
        server = self.server
        if task is None or not server.send_order(task, StartRankOrder(kind=START_RANK, env=env)):
            return LOST_CODE, time.time()
        code = self.slots.wait_exit(slot_info.hostname, stop_when)
        if code is None:  # the driver stopped this slot (job over, or its host blacklisted)
            server.drop(task)
            code = self.slots.exit_of(slot_info.hostname, EXIT_WAIT_S)
        return (code if code is not None else LOST_CODE), time.time()


def quiet_rendezvous(rendezvous: Any, events: EventSink) -> None:
    """A request that fails on Horovod's rendezvous (a rank killed while it talked to it)
    becomes a line of the job's log, not a traceback in the cell."""
    quiet_request_errors(rendezvous, lambda text: events.put(to_wire(DriverLogEvent(
        kind=DRIVER_LOG, rank=None, time=time.time(), text=text))))
