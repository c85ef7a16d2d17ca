"""Run a job's ranks as processes on the driver (``np < 0``), with no Spark job at all."""
from __future__ import annotations

import os
import threading
import time
from typing import Any
from collections.abc import Sequence

from hvd_magics.channel import EventSink
from hvd_magics.events import Event, TaskStartedEvent
from hvd_magics.protocol import CUDA_VISIBLE_DEVICES, ENGINE_HOROVOD, TASK_STARTED
from hvd_magics.task.engines import PortOffer, engine_of, meet_env, offers_port, start_env
from hvd_magics.task.gpus import local_gpu_count, rank_devices, visible_devices
from hvd_magics.task.supervisor import RankProcess, rank_environment
from hvd_magics.task.slots import plan_ranks, start_rendezvous, stop_rendezvous
from hvd_magics.task.threads import driver_cores, with_thread_share

_HOST = "localhost"


class DriverBackend:
    """Start ``size`` rank processes on this machine with a fresh rendezvous.

    Parameters
    ----------
    size : int
        Number of ranks.
    env : dict
        Extra environment for the ranks.
    pool : bool
        A warm pool: the ranks keep running the cells of :meth:`send_cell`.
    """

    #: A cold job's ranks end with it (a warm pool's backend keeps them).
    keeps_ranks = False
    #: What a warm pool says after a cell's error when it had to restart its ranks.
    restart_note = ""

    def __init__(self, size: int, env: dict[str, str], pool: bool = False) -> None:
        self.size = size
        self.env = env
        self.pool = pool
        self.where = "driver"
        self.error: BaseException | None = None
        self._procs: list[RankProcess] = []
        self._waiters: list[threading.Thread] = []
        self._server: Any = None

    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:
        """Start the rendezvous and the ranks (from the calling thread, which outlives them)."""
        slots = plan_ranks([_HOST] * self.size)
        engine = engine_of(self.env)
        offers = {s.rank: PortOffer() for s in slots if offers_port(engine, s.rank)}
        port = 0
        if engine == ENGINE_HOROVOD:
            self._server, port = start_rendezvous(slots)
        addresses = [("127.0.0.1", offers[r].port if r in offers else port)
                     for r in range(self.size)]
        for offer in offers.values():
            offer.release()
        gpus = local_gpu_count()
        # a GPU each (shared round-robin when there are more ranks than GPUs)
        host_gpus = [visible_devices([s.local_rank % gpus], os.environ).split(",")
                     for s in slots] if gpus else []
        base = with_thread_share(os.environ, self.env, driver_cores(), self.size, keep_base=True)
        for slot in slots:
            env = {**rank_environment(base, self.env),
                   **start_env(engine, slot, "127.0.0.1", "lo"),
                   **meet_env(engine, slot.rank, addresses)}
            devices = rank_devices(engine, host_gpus, slot.local_rank) if gpus else None
            if devices is not None and CUDA_VISIBLE_DEVICES not in self.env:
                env[CUDA_VISIBLE_DEVICES] = devices
            sink = _QueueSink(events, slot.rank)
            sink(TaskStartedEvent(kind=TASK_STARTED, partition=slot.rank,
                                  local_rank=slot.local_rank, pid=os.getpid()))
            proc = RankProcess(env, payload, sink, pool=self.pool)
            self._procs.append(proc)
            waiter = threading.Thread(target=proc.wait, name="hvd-rank-wait", daemon=True)
            waiter.start()
            self._waiters.append(waiter)

    @property
    def finished(self) -> bool:
        return bool(self._waiters) and not any(w.is_alive() for w in self._waiters)

    #: Events go straight onto the queue: nothing is ever on its way once the ranks ended.
    drained = True
    #: Ranks on the driver read no DataFrame rows: nothing is refused.
    refused: str | None = None
    #: Ranks on the driver never read DataFrames, and their events always stream live.
    reads_data = False
    live = True

    def stop(self) -> None:
        """Kill every rank and its children."""
        for proc in self._procs:
            proc.kill()

    def send_cell(self, frames: Sequence[bytes]) -> None:
        """A warm pool: give each rank its next cell (``frames[rank]``, one stdin frame)."""
        for proc, frame in zip(self._procs, frames):
            proc.send_frame(frame)

    def request_stacks(self, request: str) -> None:
        """Ask every rank for its stacks (``stacks`` events carrying ``request``)."""
        for proc in self._procs:
            proc.request_stacks(request)

    def interrupt_cell(self) -> None:
        """A warm pool: interrupt the cell every rank runs."""
        for proc in self._procs:
            proc.interrupt()

    def end_pool(self) -> None:
        """A warm pool: end the ranks' input; they leave Horovod together and exit."""
        for proc in self._procs:
            proc.end_input()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for waiter in self._waiters:
            waiter.join(max(deadline - time.monotonic(), 0))
        if self.finished and self._server is not None:
            stop_rendezvous(self._server)
            self._server = None
        return self.finished

    def describe_failure(self) -> str | None:
        return str(self.error) if self.error else None

    def silence_note(self, ranks: list[int]) -> str:  # noqa: ARG002 - no channel to name
        """Ranks on the driver have no event channel to name in a start timeout."""
        return ""

    def unpacking(self) -> tuple[float, str] | None:
        """Ranks on the driver unpack nothing."""
        return None

    def heard_ago(self, now: float) -> dict[int, float]:  # noqa: ARG002
        """Ranks on the driver share its host: none is lost apart from it."""
        return {}

    def lose_host(self, host: str) -> None:  # noqa: ARG002
        """Never called: no host of the driver's ranks is lost apart from it."""

    def probe_link(self, rank: int, order: dict[str, Any]) -> bool:  # noqa: ARG002
        """Ranks on the driver share its host: no link to measure."""
        return False

    def took_every_rank(self) -> str | None:
        """Ranks on the driver have no server to lose."""
        return None

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:  # noqa: ARG002
        """Ranks on the driver have no executor to lose."""
        return {}

    def preempt(self, at: int, notice: str) -> None:  # noqa: ARG002
        """Never called (nothing is decommissioned)."""

    def missing_module_fix(self) -> str:
        """Ranks on the driver run the notebook's own Python: its import error says it all."""
        return ""


class _QueueSink:
    """Stamp a rank's events the way the channel does and put them on the driver's queue."""

    def __init__(self, events: EventSink, rank: int) -> None:
        self._events = events
        self._rank = rank

    def __call__(self, event: Event) -> None:
        self._events.put({"kind": event["kind"], "rank": self._rank, "host": _HOST,
                          "time": time.time(), "recv": time.monotonic(), **event})
