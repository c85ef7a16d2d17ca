"""Warm ranks: a Horovod pool whose rank processes live across cells.

A pool is a job whose function is :func:`hvd_magics.rank.pool_loop.serve_cells`: on Spark one
barrier stage that holds ``np`` task slots, on the driver ``-np`` processes. Each cell (or
function) run on it travels as one more stdin frame to every rank (on Spark as an order over the
event channel) and is followed by :func:`hvd_magics.job.runner.launch` like a cold job, through
:class:`PoolCell`, a backend whose ranks already run. Each rank keeps one namespace across cells
(:func:`hvd_magics.rank_namespace`).

The ranks' events reach the pool's :class:`CellEvents`, which hands them to the cell that runs
and turns each rank's end of a cell (its ``result`` or ``error``, then its ``cell_end`` after the
cell's output) into the ``exit`` a cold job's rank sends last. A cell that fails or is interrupted
leaves the pool as it is once every rank is back; a rank that does not come back (stuck in a
collective its peer never entered) makes the pool restart its ranks, and the cell says so.
"""
from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time
import uuid
from datetime import datetime
from typing import Any, cast
from collections.abc import Callable, Mapping

from hvd_magics.channel import EventSink
from hvd_magics.errors import HorovodJobError, PayloadError, PoolError, StartTimeoutError
from hvd_magics.job.runner import HorovodRunner
from hvd_magics.job.verdicts.preemption import notice_text
from hvd_magics.job.session import SESSION
from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.launch.local_ranks import reap_local_ranks
from hvd_magics.launch.dataframe_input import DataFrameSources
from hvd_magics.launch.payload import sent_value, serialize_job
from hvd_magics.launch.pool_data import PoolShards
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_session import active_session, start_local_session
from hvd_magics.launch.spark_slots import SLOT_WAIT_S
from hvd_magics.option_table import POOL_OPTIONS, check_all, declared
from hvd_magics.options import (DEFAULT_IDLE_TIMEOUT_S, DEFAULT_START_TIMEOUT_S, ElasticSize,
                                validate_ranks_per_task, validate_restarts)
from hvd_magics.protocol import (CELL_END, CHANNEL_CLOSED, ENGINE_HOROVOD, ENV_ENGINE,
                                 ENV_HOROVOD_TIMELINE, ENV_SHARDS, ERROR,
                                 EXIT, RESULT, STARTED, TASK_ERROR, TASK_STARTED, TIMELINE_DYNAMIC,
                                 encode_job)
from hvd_magics.common.kept_values import SentValue
from hvd_magics.rank_names import ranks_named
from hvd_magics.rank.pool_loop import serve_cells

#: After a cell was interrupted (or a rank failed), how long the other ranks get to come back
#: before the pool restarts them.
CELL_STOP_WAIT_S = 5.0
#: How long the ranks get to leave Horovod together and exit when the pool ends.
POOL_END_WAIT_S = 30.0


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


def _end_pools_at_exit() -> None:
    """The kernel shuts down: stop every pool's ranks at once (no graceful leaving)."""
    for pool in list(SESSION.live_pools):
        pool.ended = "the notebook's process ended"
        try:
            pool.backend.stop()
        except Exception:  # noqa: BLE001,S112 - the process ends anyway
            continue


atexit.register(_end_pools_at_exit)


class HorovodPool:
    """Ranks that stay: run cells and functions on the same Horovod processes, one after another.

    Parameters
    ----------
    np : int
        ``np > 0``: ``np`` ranks as the tasks of one long-lived Spark barrier stage (they hold
        their task slots until the pool ends); ``np < 0``: ``-np`` processes on the driver.
    env : mapping, optional
        Extra environment variables for the rank processes.
    start_timeout : float
        Seconds to wait for every rank to start.
    idle_timeout : float
        A pool that ran nothing for this many seconds ends and gives its slots back.
    engine : {"horovod", "torch", "tf"}, optional
        What the ranks run on (see :class:`hvd_magics.HorovodRunner`; default ``"horovod"``);
        the first cell starts it (``hvd.init()``, ``init_process_group()``,
        ``MultiWorkerMirroredStrategy()``) and later cells use it as it is.
    ranks_per_task : int, optional
        Rank processes in each of the pool's Spark tasks (as
        :class:`hvd_magics.HorovodRunner`'s).
    restarts : int
        Only 0: a pool replaces a lost rank at its next cell, and a job that must go on after a
        loss runs cold (``HorovodRunner(np, restarts=N)``, ``%%horovod --cold --restarts N``).
    checkpoint_dir : str or path, optional
        The folder that holds the checkpoint folders of the pool's cells and functions, one
        each (``%hvd_pool start --checkpoint-dir``). Default: the driver's temporary folder; on
        a cluster, give a folder every executor shares. A job's own ``checkpoint_dir`` is its
        folder itself.

    Raises
    ------
    ValueError
        A bad option (``restarts`` above 0 among them), with the fix.

    Examples
    --------
    >>> with HorovodPool(np=2) as pool:                      # doctest: +SKIP
    ...     pool.run(build_model)                             # keeps it in rank_namespace()
    ...     pool.run(train, epochs=2)                         # trains the kept model
    """

    def __init__(self, np: int, env: Mapping[str, str] | None = None,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S, engine: str | None = None,
                 ranks_per_task: int | None = None, restarts: int = 0,
                 checkpoint_dir: str | os.PathLike | None = None) -> None:
        # every keyword is a declared option (hvd_magics.option_table), checked once
        value = check_all(declared(locals(), POOL_OPTIONS), POOL_OPTIONS)
        if isinstance(value["np"], ElasticSize):
            raise ValueError(f"np={np}: a warm pool has a fixed number of ranks. Fix: start it "
                             f"with np={value['np'].max_np}, or run the elastic job cold "
                             f"(%%horovod np={np}).")
        self.np: int = value["np"]
        self.start_timeout: float = value["start_timeout"]
        self.idle_timeout: float = value["idle_timeout"]
        validate_restarts(value["restarts"], pool=True)  # refused with the way: a cold job
        #: Rank processes per Spark task (settled by the first start: 1 on the driver).
        self.ranks_per_task = validate_ranks_per_task(value["ranks_per_task"], self.np)
        self.engine: str = value["engine"] or ENGINE_HOROVOD
        self.env: dict[str, str] = value["env"]
        #: Where the pool's jobs keep their checkpoint folders (``None``: the temporary folder).
        self.checkpoint_dir: str | None = value["checkpoint_dir"]
        self.env[ENV_ENGINE] = self.engine
        self.cells = 0
        self.restarts = 0
        #: Why the pool ended (``None`` while it runs).
        self.ended: str | None = None
        self._lock = threading.Lock()
        self._busy = False
        self._start()
        SESSION.live_pools.add(self)
        threading.Thread(target=self._watch_idle, name="hvd-pool-idle", daemon=True).start()

    # -- life ------------------------------------------------------------------------------
    def _start(self, slot_wait_s: float = SLOT_WAIT_S) -> None:
        self.job_id = uuid.uuid4().hex[:12]
        self.events = CellEvents(abs(self.np))
        # a cell can then record a timeline (hvd_magics.rank.instruments.cell_timeline)
        env = ({ENV_HOROVOD_TIMELINE: TIMELINE_DYNAMIC, **self.env}
               if self.engine == ENGINE_HOROVOD else dict(self.env))
        if self.np < 0:
            self.backend: DriverBackend | SparkBackend = DriverBackend(-self.np, env, pool=True)
            self.ranks_per_task = 1
        else:
            spark = active_session() or start_local_session(self.np)
            self.backend = SparkBackend(spark, self.np, env, pool=True, slot_wait_s=slot_wait_s,
                                        environment=SESSION.environment,
                                        ranks_per_task=self.ranks_per_task)
            self.ranks_per_task = self.backend.layout.ranks_per_task
        self.where = self.backend.where
        #: Each rank's process id and host, from its ``started`` event.
        self.pids: dict[int, int] = {}
        self.hosts: dict[int, str] = {}
        #: Where each rank's task receives the shards of DataFrames cells read (on Spark).
        self.data_targets: dict[int, tuple[str, int]] = {}
        #: Each rank's Spark task attempt id (on Spark): how a decommissioned executor's ranks
        #: are found.
        self.tasks: dict[int, int] = {}
        began = time.monotonic()
        self.backend.start(serialize_job(serve_cells, {}).blob, self.job_id, self.events)
        try:
            self._wait_started(began)
        except BaseException:
            self._kill()
            raise
        self.started_at = datetime.now()
        #: The DataFrames dealt to the ranks (on Spark; a restart starts without any).
        self.shards = (PoolShards(self.backend, self.data_targets)
                       if isinstance(self.backend, SparkBackend) else None)
        self.start_s = time.monotonic() - began
        self.last_used = time.monotonic()
        #: name -> digest of the notebook values every rank holds (after a cell that succeeded).
        self._held_values: dict[str, str] = {}
        self._sending_values: dict[str, str] = {}

    def _wait_started(self, began: float) -> None:
        pids = self.pids
        errors: list[str] = []
        while len(pids) < abs(self.np):
            try:
                event = self.events.idle.get(timeout=0.1)
            except queue.Empty:
                event = {}
            if event.get("kind") == STARTED:
                pids[event["rank"]] = event.get("pid")
                self.hosts[event["rank"]] = event.get("host", "")
            elif event.get("kind") == TASK_STARTED:
                if event.get("data"):
                    host, port = event["data"]
                    self.data_targets[event["rank"]] = (host, int(port))
                if event.get("task") is not None:
                    self.tasks[event["rank"]] = int(event["task"])
            elif event.get("kind") == TASK_ERROR:
                errors.append(event.get("traceback", ""))
            if errors or self.events.exited or self.backend.finished:
                exited = ranks_named(sorted(self.events.exited))
                why = (errors[0] if errors else self.backend.describe_failure()
                       or f"{exited} exited before the pool started")
                raise HorovodJobError(f"The warm pool could not start on {self.where}: {why}")
            if time.monotonic() - began > self.start_timeout:
                raise StartTimeoutError(
                    f"Timed out after {self.start_timeout:.0f} s waiting for the warm pool's "
                    f"ranks to start ({len(pids)} of {abs(self.np)} started on {self.where}). "
                    "If the cluster needs longer, raise start_timeout (--start-timeout).")

    def _kill(self) -> None:
        self.backend.stop()
        self.backend.join(POOL_END_WAIT_S)
        reap_local_ranks([(pid, self.hosts.get(rank, "")) for rank, pid in self.pids.items()])

    def close(self, why: str = "it was stopped") -> None:
        """End the pool: the ranks leave Horovod together and exit; its slots are free again."""
        with self._lock:
            if self.ended is not None:
                return
            self.ended = why
        SESSION.live_pools.discard(self)
        self.backend.end_pool()
        if not self.backend.join(POOL_END_WAIT_S):
            self._kill()

    def restart(self) -> None:
        """End the ranks (whatever they run) and start new ones: every kept variable is gone.

        A lost executor may take a while to come back: the new ranks wait for their slots up to
        the start timeout. When they cannot start, the pool ends (saying why) and this raises.
        """
        with self._lock:
            self._kill()
            self.restarts += 1
            try:
                self._start(slot_wait_s=self.start_timeout)
            except BaseException as exc:
                self.ended = f"its ranks could not be restarted ({type(exc).__name__}: {exc})"
                SESSION.live_pools.discard(self)
                raise
            self.ended = None

    def __enter__(self) -> HorovodPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_idle(self) -> None:
        while self.ended is None:
            time.sleep(min(1.0, self.idle_timeout / 10))
            idle = time.monotonic() - self.last_used
            if not self._busy and self.ended is None and idle > self.idle_timeout:
                self.close(f"it ran nothing for {self.idle_timeout:.0f} s (its idle timeout)")

    # -- work ------------------------------------------------------------------------------
    @property
    def ranks(self) -> str:
        """``"2 ranks"``, ``"1 rank"``."""
        return f"{abs(self.np)} rank{'' if abs(self.np) == 1 else 's'}"

    @property
    def alive(self) -> bool:
        return self.ended is None

    def check_usable(self) -> None:
        """Raise :class:`PoolError` when the pool has ended (saying why and what to do)."""
        if self.ended is not None:
            raise PoolError(f"the warm pool of {self.ranks} on {self.where} has ended: "
                            f"{self.ended}; its slots are free. Fix: start it again "
                            f"(%hvd_pool start np={self.np}, or HorovodPool(np={self.np})), or "
                            f"run the cell cold with %%horovod np={self.np}.")

    def cell(self, env: Mapping[str, str], sources: DataFrameSources | None = None
             ) -> PoolCell:
        """The backend of the next cell (``env``: set on the ranks for it; ``sources``: the
        DataFrames it reads, dealt to the ranks now unless the pool holds them); refused while
        another cell runs on the pool."""
        self.check_usable()
        if self._busy:
            raise PoolError("the warm pool is running another cell (a background one? its "
                            "handle's wait() or stop()); wait for it to end.")
        lost, going = self.ranks_to_replace()
        if lost or going:
            self.restart()
            what = (f"the warm pool lost {lost} since its last cell; its ranks were restarted"
                    if lost else f"{going}: the warm pool's ranks were restarted away from it")
            print(f"hvd_magics: {what}, so their variables are gone.", file=sys.stderr)
        rank_envs: list[dict[str, str]] = [{ENV_SHARDS: "[]"}] * abs(self.np)
        if sources is not None and len(sources):
            if self.shards is None:
                raise PayloadError(
                    f"the job reads the DataFrame {sources.sources[0].name!r}, whose rows reach "
                    "the ranks through Spark tasks, but this pool's ranks run on the driver "
                    f"without Spark. Fix: start the pool with np={-self.np} "
                    f"(%hvd_pool restart np={-self.np}).")
            rank_envs, notes = self.shards.rank_env(sources, SESSION.held_slots())
            for note in notes:
                print(f"hvd_magics: {note}", file=sys.stderr)
        return PoolCell(self, env, rank_envs)

    def pack_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A cell's notebook values as they travel: each the ranks hold unchanged (same name,
        same pickle) as its digest only (:mod:`hvd_magics.common.kept_values`)."""
        packed: dict[str, Any] = {}
        self._sending_values = {}
        for name, value in values.items():
            sent = sent_value(value)
            if sent is None:
                packed[name] = value
                continue
            self._sending_values[name] = sent.digest
            held = self._held_values.get(name) == sent.digest
            packed[name] = SentValue(sent.digest) if held else sent
        return packed

    def _values_arrived(self, every_rank_ran_it: bool) -> None:
        """After a cell: what it sent is held when every rank ran it; else nothing is taken as
        held (a rank may have stopped before it kept a value): the next cell sends everything."""
        if every_rank_ran_it:
            self._held_values.update(self._sending_values)
        else:
            self._held_values.clear()
        self._sending_values = {}

    def forget_shards(self) -> int:
        """Delete the DataFrames' shards the ranks hold: the next cell that reads one deals it
        again (after the data under an unchanged plan changed); how many were dropped."""
        self.check_usable()
        return self.shards.forget() if self.shards is not None else 0

    def lost_since_last_cell(self) -> str:
        """What the pool lost while no cell ran (a rank process, an executor), or ``""``."""
        exited = sorted(self.events.exited)
        if exited:
            return ranks_named(exited)
        if self.backend.finished:
            return f"its ranks ({self.backend.describe_failure() or 'the Spark job ended'})"
        return ""

    def leaving(self) -> dict[int, tuple[str, str]]:
        """The pool's ranks whose executor Spark is decommissioning (a spot instance taken
        back), as rank -> ``(executor, host)``: ranks that stayed there would be lost with it."""
        return self.backend.decommissioning(self.tasks) if self.tasks else {}

    def ranks_to_replace(self) -> tuple[str, str]:
        """What the pool lost since its last cell (:meth:`lost_since_last_cell`), else
        ``"executor 3 (host X, rank 1) is being decommissioned"`` (:meth:`leaving`): each
        ``""`` when nothing."""
        lost = self.lost_since_last_cell()
        leaving = {} if lost else self.leaving()
        return lost, notice_text(leaving) if leaving else ""

    def _finished_cell(self) -> None:
        self.cells += 1
        self.last_used = time.monotonic()
        self._busy = False

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank of the pool; return what rank 0 returned.

        What ``main`` keeps in :func:`hvd_magics.rank_namespace` is there for the next run.
        """
        return HorovodRunner(self.np, env=self.env, pool=self).run(main, **kwargs)

    def __repr__(self) -> str:
        engine = f", engine={self.engine!r}" if self.engine != ENGINE_HOROVOD else ""
        if self.ended is not None:
            return f"HorovodPool(np={self.np}{engine}): ended, {self.ended}"
        idle = time.monotonic() - self.last_used
        size, word = self.ranks.split()
        return (f"HorovodPool(np={self.np}{engine}): {size} warm {word} on {self.where}, started "
                f"{self.started_at:%H:%M:%S} (in {self.start_s:.1f} s), {self.cells} cells run, "
                f"idle for {idle:.0f} s (ends after {self.idle_timeout:.0f} s idle)"
                + (f", restarted {self.restarts} times" if self.restarts else ""))


class PoolCell:
    """The backend :func:`hvd_magics.job.runner.launch` follows for one cell on a pool."""

    keeps_ranks = True
    drained = True
    reads_data = False
    live = True
    #: A cell's rows were dealt (and checked) before it started: nothing is refused here.
    refused: str | None = None

    def __init__(self, pool: HorovodPool, env: Mapping[str, str],
                 rank_envs: list[dict[str, str]]) -> None:
        self.pool = pool
        self.env = dict(env)
        #: What each rank's environment gets besides ``env`` (its shards).
        self.rank_envs = rank_envs
        self.where = f"{pool.where} (warm pool)"
        #: Said after the cell's error when the ranks had to be restarted.
        self.restart_note = ""

    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:  # noqa: ARG002
        self.pool._busy = True
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
        self.pool._values_arrived(self.pool.events.succeeded and not self.restart_note)
        self.pool._finished_cell()
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
