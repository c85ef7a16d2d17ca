"""Warm ranks: a Horovod pool whose rank processes live across cells.

A pool is a job whose function is :func:`hvd_magics.rank.pool_loop.serve_cells`: on Spark one
barrier stage that holds ``np`` task slots, on the driver ``-np`` processes. Each cell (or
function) run on it travels as one more stdin frame to every rank (on Spark as an order over the
event channel) and is followed like a cold job's attempt, through
:class:`hvd_magics.job.pool_cell.PoolCell`, a backend whose ranks already run. Each rank keeps
one namespace across cells (:func:`hvd_magics.rank_namespace`).

The ranks' events reach the pool's :class:`hvd_magics.job.pool_cell.CellEvents`, which hands
them to the cell that runs and turns each rank's end of a cell (its ``result`` or ``error``,
then its ``cell_end`` after the cell's output) into the ``exit`` a cold job's rank sends last. A
cell that fails or is interrupted leaves the pool as it is once every rank is back; a rank that
does not come back (stuck in a collective its peer never entered) makes the pool restart its
ranks, and the cell says so.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import uuid
from datetime import datetime
from typing import Any
from collections.abc import Callable, Mapping

from hvd_magics.errors import PayloadError, PoolError
from hvd_magics.job.runner import HorovodRunner
from hvd_magics.job.verdicts.preemption import notice_text
from hvd_magics.job.session import SESSION
from hvd_magics.launch.dataframe_input import DataFrameSources
from hvd_magics.launch.pool_data import PoolShards
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_slots import SLOT_WAIT_S
from hvd_magics.option_table import POOL_OPTIONS, check_all, declared
from hvd_magics.options import (DEFAULT_IDLE_TIMEOUT_S, DEFAULT_START_TIMEOUT_S, ElasticSize,
                                validate_ranks_per_task, validate_restarts)
from hvd_magics.protocol import ENGINE_HOROVOD, ENV_ENGINE, ENV_SHARDS
from hvd_magics.job.pool_cell import CellEvents, PoolCell
from hvd_magics.job.pool_values import HeldValues
from hvd_magics.job.pool_start import POOL_END_WAIT_S, StartedRanks, start_ranks
from hvd_magics.rank_names import ranks_named



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
        #: Whether a cell runs on it now.
        self.busy = False
        self._start()
        SESSION.live_pools.add(self)
        threading.Thread(target=self._watch_idle, name="hvd-pool-idle", daemon=True).start()

    # -- life ------------------------------------------------------------------------------
    def _start(self, slot_wait_s: float = SLOT_WAIT_S) -> None:
        self.job_id = uuid.uuid4().hex[:12]
        self.events = CellEvents(abs(self.np))
        began = time.monotonic()
        self.started: StartedRanks = start_ranks(
            self.np, self.engine, self.env, self.ranks_per_task, self.job_id, self.events,
            self.start_timeout, slot_wait_s)
        started = self.started
        self.backend, self.where = started.backend, started.backend.where
        self.ranks_per_task = started.ranks_per_task
        #: Each rank's process id and host, from its ``started`` event.
        self.pids, self.hosts = started.pids, started.hosts
        #: Each rank's Spark task attempt id (on Spark): how a decommissioned executor's ranks
        #: are found.
        self.tasks = started.tasks
        self.started_at = datetime.now()
        #: The DataFrames dealt to the ranks (on Spark; a restart starts without any).
        self.shards = (PoolShards(started.backend, started.data_targets)
                       if isinstance(started.backend, SparkBackend) else None)
        self.start_s = time.monotonic() - began
        self.last_used = time.monotonic()
        #: The notebook values every rank holds (a restart starts without any).
        self.held = HeldValues()

    def _kill(self) -> None:
        self.started.kill(POOL_END_WAIT_S)

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
            if not self.busy and self.ended is None and idle > self.idle_timeout:
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
        if self.busy:
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
        """A cell's notebook values as they travel (:meth:`HeldValues.pack`)."""
        return self.held.pack(values)

    def values_arrived(self, every_rank_ran_it: bool) -> None:
        """After a cell (:meth:`HeldValues.arrived`)."""
        self.held.arrived(every_rank_ran_it)

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

    def finished_cell(self) -> None:
        self.cells += 1
        self.last_used = time.monotonic()
        self.busy = False

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
