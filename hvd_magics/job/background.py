"""Jobs that run while the notebook does other things: ``HorovodRunner(np).start(main)`` and
``%%horovod --background``.

The job runs exactly as a foreground one (:func:`hvd_magics.job.runner.launch`), in a thread of
its own: the cell that started it returns at once with a :class:`BackgroundJob`, its dashboard
keeps updating where it was drawn, and the kernel is free for other cells. A kernel interrupt
does not reach it (``job.stop()`` does); a kernel shutdown stops it, and nothing is left running.
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import Any
from collections.abc import Callable

from hvd_magics.job.live_job import HANDLE_STOP_WAIT_S, LiveJob
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.session import SESSION
from hvd_magics.job.readings.stacks import STACKS_WAIT_S, JobStacks
from hvd_magics.launch import interrupt_guard
from hvd_magics.launch.spark_session import active_session, is_connect



class BackgroundJob:
    """A job that runs in the background; returned by :meth:`HorovodRunner.start`.

    Like a future: :meth:`done`, :meth:`wait` (the value, or the job's error raised),
    :meth:`stop`; and where its ranks are now, :meth:`stacks`. :attr:`record` is the job's
    :class:`~hvd_magics.job.records.run_record.RunRecord`, ``running`` until it ends.

    Examples
    --------
    >>> job = HorovodRunner(np=2).start(train, epochs=5)   # doctest: +SKIP
    >>> job.stacks()                                        # doctest: +SKIP
    >>> model = job.wait()                                  # doctest: +SKIP
    """

    def __init__(self, run: Callable[[LiveJob], RunRecord], np: int, spark_slots: int,
                 on_success: Callable[[RunRecord], None] | None = None) -> None:
        self.np = np
        self._spark_slots = spark_slots
        session = active_session() if spark_slots else None
        if session is not None and not is_connect(session):  # from the main thread, now
            interrupt_guard.install(session.sparkContext)
        self._live = LiveJob()
        self._done = threading.Event()
        self._result: RunRecord | None = None
        self._error: BaseException | None = None
        self._on_success = on_success
        self.started_at = time.monotonic()
        SESSION.background_jobs.add(self)
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                        name="hvd-background-job")
        self._thread.start()
        while not (self._live.started.wait(0.05) or self._done.is_set()):
            pass  # what refuses the job (slots, its input) is raised here, at once
        if self._error is not None and not self._live.started.is_set():
            raise self._error

    @property
    def live(self) -> LiveJob:
        """The job as its running thread fills it in."""
        return self._live

    @property
    def spark_slots(self) -> int:
        """Spark task slots the job's ranks hold (0 on the driver, on a warm pool, or before
        its stage was submitted)."""
        return self._spark_slots if self._live.started.is_set() and not self.done() else 0

    def _run(self, run: Callable[[LiveJob], RunRecord]) -> None:
        try:
            self._result = run(self._live)
            if self._on_success is not None:
                self._on_success(self._result)
        except BaseException as exc:  # noqa: BLE001 - kept for wait()
            self._error = exc
        finally:
            SESSION.background_jobs.discard(self)
            self._done.set()

    @property
    def record(self) -> RunRecord | None:
        """The job's record (``None`` until its ranks are being started)."""
        return self._result or self._live.record

    def done(self) -> bool:
        """Whether the job has ended (succeeded, failed or stopped)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the end; return what rank 0 returned (a cell: its last value).

        Raises
        ------
        TimeoutError
            When the job still runs after ``timeout`` seconds (it goes on running).
        HorovodJobError
            The job's own error when it failed (``JobInterrupted`` when it was stopped).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the job still runs after {timeout:g} s; it goes on (wait "
                               "again, or job.stop() to end it)")
        if self._error is not None:
            raise self._error
        return self._result.value if self._result is not None else None

    def stop(self) -> None:
        """Stop the job as an interrupt would (every rank stopped; a pool keeps its ranks);
        return once it wound down. ``wait()`` then raises ``JobInterrupted``."""
        self._live.stop.set()
        self._thread.join(HANDLE_STOP_WAIT_S)

    def stacks(self, wait: float = STACKS_WAIT_S) -> JobStacks:
        """Where each rank is now: its Python stacks, taken without stopping it."""
        job, backend = self._live.job, self._live.backend
        if self.done() or job is None or backend is None:
            return JobStacks()
        began = time.monotonic()
        running, starting = set(job.running_ranks()), job.starting_ranks()
        if not running:
            return JobStacks(starting=starting)
        request = job.stacks.ask(backend)
        answers: dict[int, Any] = {}
        while time.monotonic() - began < wait and not self.done():
            answers = dict(job.stacks.answers.get(request, {}))
            if running <= set(answers):
                break
            time.sleep(0.02)
        job.stacks.answers.pop(request, None)
        return JobStacks(answers, sorted(running - set(answers)), time.monotonic() - began,
                         starting, job.splits.now(job.unit))

    def timeline_so_far(self) -> str | None:
        """The job's Horovod Timeline so far (a valid copy), while it runs and records one;
        ``None`` when it records none, or rank 0 writes it on another host."""
        job = self._live.job
        if self.done() or job is None:
            return None
        path = job.timeline.so_far()
        return str(path) if path is not None else None

    def __repr__(self) -> str:
        record = self.record
        state = ("running" if not self.done() else
                 "failed" if self._error is not None else "succeeded")
        job_id = f" {record.job_id}" if record is not None else ""
        where = f" on {record.where}" if record is not None else ""
        ranks = f"{abs(self.np)} rank{'s' if abs(self.np) != 1 else ''}"
        return (f"<BackgroundJob{job_id}: {ranks}{where}, {state} "
                f"({time.monotonic() - self.started_at:.0f} s)>")


def jobs() -> list[BackgroundJob]:
    """The background jobs of this notebook that still run, oldest first."""
    return sorted(SESSION.background_jobs, key=lambda job: job.started_at)


def _stop_jobs_at_exit() -> None:
    """The kernel shuts down: stop every background job (its ranks, its Spark job)."""
    for job in jobs():
        job._live.stop.set()
    for job in jobs():
        job._thread.join(HANDLE_STOP_WAIT_S)


atexit.register(_stop_jobs_at_exit)
