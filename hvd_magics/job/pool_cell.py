"""A warm pool's cells: the pool's event queue, which hands the ranks' events to the cell that
runs and turns each rank's end of a cell into the ``exit`` a cold job's rank sends last, and the
backend a job follows for one cell on ranks that already run."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol, cast
from collections.abc import Mapping

from hvd_magics.channel import EventSink
from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.protocol import CELL_END, CHANNEL_CLOSED, ERROR, EXIT, RESULT, encode_job
from hvd_magics.rank_names import ranks_named

#: After a cell was interrupted (or a rank failed), how long the other ranks get to come back
#: before the pool restarts them.
CELL_STOP_WAIT_S = 5.0


class CellEvents:
    """The pool's event queue (backends only ``put``): the ranks' events go to the cell that
    runs, each rank's end of a cell becoming its ``exit``; between cells they wait in
    :attr:`idle` (the pool reads its start from there)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._target: EventSink | None = None
        self._outcome: dict[int, int] = {}
        self._closed: set[int] = set()
        #: Ranks whose process ended (the pool is broken), with their exit codes.
        self.exited: dict[int, int | None] = {}
        #: Ranks whose cell ended (``exit`` sent to the cell).
        self.done: set[int] = set()

    def begin(self, target: EventSink) -> None:
        """A cell starts: its events go to ``target`` from now on (what came between cells,
        such as a library's late warning, is dropped)."""
        with self._lock:
            self._target, self._outcome, self._closed, self.done = target, {}, set(), set()
            while not self.idle.empty():
                self.idle.get_nowait()

    def end(self) -> None:
        """The cell is over: what arrives now waits in :attr:`idle`."""
        with self._lock:
            self._target = None

    @property
    def succeeded(self) -> bool:
        """Every rank ended the cell with its result (none raised or was interrupted)."""
        with self._lock:
            return (len(self.done) == self.size
                    and all(self._outcome.get(rank) == 0 for rank in range(self.size)))

    @property
    def cell_over(self) -> bool:
        """Every rank ended the cell, or one rank process ended (the pool is broken)."""
        return len(self.done) == self.size or bool(self.exited)

    def put(self, event: dict[str, Any]) -> None:
        # the events that end a rank or its cell (exit, result, error, cell_end, its channel
        # closed) carry its rank
        kind, rank = event.get("kind"), cast(int, event.get("rank"))
        out = [event]
        with self._lock:
            if kind == EXIT:
                self.exited[rank] = event.get("code")
            elif kind == CHANNEL_CLOSED and not event.get("clean"):  # its executor was lost
                self.exited.setdefault(rank, None)
            elif kind in (RESULT, ERROR) and self._target is not None:
                self._outcome[rank] = 0 if kind == RESULT else 1
            elif kind == CELL_END:
                self._closed.add(rank)
                out = []
            if (kind in (RESULT, ERROR, CELL_END) and rank in self._outcome
                    and rank in self._closed and rank not in self.done):
                self.done.add(rank)
                out.append({**event, "kind": EXIT, "code": self._outcome[rank]})
            target = self._target
        for item in out:
            (target if target is not None else self.idle).put(item)


class CellPool(Protocol):
    """What a cell asks of its pool (:class:`hvd_magics.job.pool.HorovodPool`)."""

    np: int
    where: str
    events: CellEvents
    backend: DriverBackend | SparkBackend
    #: Whether a cell runs on it now.
    busy: bool

    @property
    def ranks(self) -> str: ...

    def ranks_to_replace(self) -> tuple[str, str]: ...

    def leaving(self) -> dict[int, tuple[str, str]]: ...

    def restart(self) -> None: ...

    def values_arrived(self, every_rank_ran_it: bool) -> None: ...

    def finished_cell(self) -> None: ...


class PoolCell:
    """The backend a job follows for one cell on a pool
    (:class:`hvd_magics.job.pool.HorovodPool`)."""

    keeps_ranks = True
    drained = True
    reads_data = False
    live = True
    #: A cell's rows were dealt (and checked) before it started: nothing is refused here.
    refused: str | None = None

    def __init__(self, pool: CellPool, env: Mapping[str, str],
                 rank_envs: list[dict[str, str]]) -> None:
        self.pool = pool
        self.env = dict(env)
        #: What each rank's environment gets besides ``env`` (its shards).
        self.rank_envs = rank_envs
        self.where = f"{pool.where} (warm pool)"
        #: Said after the cell's error when the ranks had to be restarted.
        self.restart_note = ""

    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:  # noqa: ARG002
        self.pool.busy = True
        self.pool.events.begin(events)
        self.pool.backend.send_cell([encode_job(payload, {**self.env, **extra})
                                     for extra in self.rank_envs])

    def request_stacks(self, request: str) -> None:
        """Ask the pool's ranks for their stacks (``stacks`` events carrying ``request``)."""
        self.pool.backend.request_stacks(request)

    @property
    def finished(self) -> bool:
        return self.pool.events.cell_over or self.pool.backend.finished

    def stop(self) -> None:
        """Interrupt the ranks still in the cell; restart them if they do not come back (or
        when one of them is gone, or its executor is being decommissioned)."""
        if self.restart_note:
            return
        if not self.finished:
            self.pool.backend.interrupt_cell()
            deadline = time.monotonic() + CELL_STOP_WAIT_S
            while not self.finished and time.monotonic() < deadline:
                time.sleep(0.05)
        lost, going = self.pool.ranks_to_replace()
        if self.finished and not lost and not going:
            return
        stuck = sorted(set(range(abs(self.pool.np))) - self.pool.events.done)
        why = (f"the pool lost {lost}" if lost else going or
               f"{ranks_named(stuck)} did not come "
               f"back within {CELL_STOP_WAIT_S:.0f} s of the interrupt (stuck in a collective "
               "a peer never entered?)")
        self.pool.events.end()
        self.pool.restart()
        self.restart_note = (f"the ranks were restarted: {why}; their variables are gone "
                             f"(the pool is ready again, {self.pool.ranks.replace(' ', ' new ')}).")

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.finished and time.monotonic() < deadline and not self.restart_note:
            time.sleep(0.02)
        self.pool.events.end()
        if any(self.pool.ranks_to_replace()):  # a rank or its executor is gone, or going
            self.stop()
        self.pool.values_arrived(self.pool.events.succeeded and not self.restart_note)
        self.pool.finished_cell()
        return True

    def describe_failure(self) -> str | None:
        return None

    def silence_note(self, ranks: list[int]) -> str:  # noqa: ARG002
        return ""

    def unpacking(self) -> tuple[float, str] | None:
        return None  # the pool's ranks run already

    def heard_ago(self, now: float) -> dict[int, float]:  # noqa: ARG002
        return {}  # a pool's lost rank ends the cell through its channel; not yet by its beats

    def lose_host(self, host: str) -> None:  # noqa: ARG002
        pass  # never called (heard_ago says nothing)

    def probe_link(self, rank: int, order: dict[str, Any]) -> bool:  # noqa: ARG002
        return False  # a cell's steps are not judged by host (heard_ago says nothing)

    def took_every_rank(self) -> str | None:
        return self.pool.backend.took_every_rank()

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:  # noqa: ARG002
        """The pool's ranks whose executor is being decommissioned (the cell's own rows know
        no task: the pool's tasks started before it)."""
        return self.pool.leaving()

    def preempt(self, at: int, notice: str) -> None:
        self.pool.backend.preempt(at, notice)

    def missing_module_fix(self) -> str:
        return self.pool.backend.missing_module_fix()
