"""The watch loop: turn by turn, the job's events applied, its monitors asked, its phase moved
on, until every rank exited or the job's end is certain (its outcome is then judged).

A job is in one :class:`Phase` at a time: running (every monitor judges), saving (the ranks that
ended did so on a preemption notice, and rank 0 still writes the checkpoint), failing (a rank
failed: the others' errors are gathered for :data:`FAILURE_GRACE_S`, then the job is stopped).
Beside it, the Spark stage's own end is followed (:class:`StageEnd`).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from enum import Enum

from hvd_magics.job.job_state import JobState
from hvd_magics.job.verdicts.deadline import Deadline
from hvd_magics.job.verdicts.left_behind import LeftBehind, Mismatch
from hvd_magics.job.verdicts.links import Links
from hvd_magics.job.verdicts.lost_host import LostHost
from hvd_magics.job.verdicts.notice import (PreemptionNotice, notice_save_wait, save_too_long,
                                            saving_on_notice)
from hvd_magics.job.verdicts.stalled import StalledRanks
from hvd_magics.job.verdicts.startup import Startup
from hvd_magics.job.following import drain, follow
from hvd_magics.job.verdicts.monitor import Monitor, Turn
from hvd_magics.job.watch.outcome import elastic_failure_of, failure_of
from hvd_magics.launch.backend import Backend

#: After the first rank fails, how long to gather the other ranks' errors before stopping them.
FAILURE_GRACE_S = 1.0
#: After the Spark job ended, how long the ranks' event connections may take to deliver what is
#: still on its way (a large result) before the job is judged on what arrived.
DRAIN_WAIT_S = 120.0


class Phase(Enum):
    """Where a job of a fixed size is on its way to its end."""

    RUNNING = "running"
    SAVING = "saving"
    FAILING = "failing"


@dataclass
class StageEnd:
    """The Spark stage's end, and everything its ranks sent having arrived since."""

    ended_at: float | None = None
    drained_at: float | None = None

    def drained(self, backend: Backend, now: float) -> bool:
        """Whether the stage ended and what its ranks sent has arrived (or never will)."""
        if backend.finished and self.ended_at is None:
            self.ended_at = now
        if self.ended_at is not None and self.drained_at is None and (
                backend.drained or now - self.ended_at >= DRAIN_WAIT_S):
            self.drained_at = now
        return self.drained_at is not None

    def over(self, backend: Backend, now: float) -> bool:
        """Drained for :data:`FAILURE_GRACE_S`: some ranks never reported their exit."""
        return self.drained(backend, now) and now - (self.drained_at or now) >= FAILURE_GRACE_S


@dataclass
class JobPhase:
    """The job's :class:`Phase` and when it began."""

    phase: Phase = Phase.RUNNING
    since: float = 0.0

    def step(self, turn: Turn) -> bool:
        """Move on from what this turn shows; ``True`` once the failing job's grace is over.
        Raises the verdict on a notice's save that takes too long."""
        job, now = turn.job, turn.now
        if self.phase is not Phase.FAILING and job.any_failed:
            if saving_on_notice(job):  # ranks ended on the notice; rank 0 still writes
                if self.phase is Phase.RUNNING:
                    self.phase, self.since = Phase.SAVING, now
                if now - self.since > notice_save_wait():
                    raise save_too_long(turn, now - self.since)
            else:
                self.phase, self.since = Phase.FAILING, now
        return self.phase is Phase.FAILING and now - self.since >= FAILURE_GRACE_S


class FixedWatch:
    """Follows a job of a fixed size, a turn at a time, until every rank exited or its end is
    certain; then :meth:`outcome` raises when it failed (the caller stops it)."""

    def __init__(self, job: JobState, backend: Backend, events: queue.Queue,
                 start_timeout: float, timeout: float | None = None,
                 stop: threading.Event | None = None) -> None:
        self.job, self.backend, self.events, self.stop = job, backend, events, stop
        started = time.monotonic()
        #: Every verdict on the job, asked in this order each turn.
        self.monitors: list[Monitor] = [
            StalledRanks(), LostHost(), Links(), PreemptionNotice(), LeftBehind(), Mismatch(),
            *([Deadline(timeout, started)] if timeout is not None else []),
            Startup(start_timeout, started, backend.unpacking())]
        self.phase, self.stage = JobPhase(since=started), StageEnd()

    def turn(self) -> bool:
        """Apply what arrived, ask the monitors, move the phase on; ``True`` once the job's end
        is certain. Raises a monitor's verdict, and ``KeyboardInterrupt`` when stopped from
        another thread."""
        job, backend = self.job, self.backend
        if job.all_exited:
            return True
        now = follow(job, self.events)
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt  # stopped from another thread: ended as an interrupt
        turn = Turn(job, backend, self.events, now)
        failing = self.phase.phase is Phase.FAILING
        for monitor in self.monitors:
            if monitor.while_failing or not failing:
                error = monitor.check(turn)
                if error is not None:
                    raise error
        return self.phase.step(turn) or self.stage.over(backend, now) or job.all_exited

    def outcome(self) -> None:
        """Raise the error the job ended with, if it failed."""
        error = failure_of(self.job, self.backend)
        if error is not None:
            raise error


class ElasticWatch:
    """Follows an elastic job, a turn at a time, until Horovod's elastic driver and the stage
    ended; then :meth:`outcome` raises when the job failed as a whole (a rank lost on the way
    is a reset, not a failure)."""

    def __init__(self, job: JobState, backend: Backend, events: queue.Queue,
                 stop: threading.Event | None = None) -> None:
        self.job, self.backend, self.events, self.stop = job, backend, events, stop
        self.lost, self.stage = LostHost(), StageEnd()

    def turn(self) -> bool:
        """Apply what arrived; ``True`` once the stage ended and what it sent arrived."""
        now = follow(self.job, self.events)
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt
        if self.stage.ended_at is None:  # a reset without its ranks, not an end
            self.lost.check(Turn(self.job, self.backend, self.events, now))
        return self.stage.drained(self.backend, now)

    def outcome(self) -> None:
        """Raise the error the job ended with as a whole, if it failed."""
        drain(self.job, self.events)
        error = elastic_failure_of(self.job, self.backend)
        if error is not None:
            raise error


def watch(job: JobState, backend: Backend, events: queue.Queue, start_timeout: float,
          timeout: float | None = None, stop: threading.Event | None = None) -> None:
    """Follow a job of a fixed size until every rank exited; raise when it failed."""
    follower = FixedWatch(job, backend, events, start_timeout, timeout, stop)
    while not follower.turn():
        pass
    follower.outcome()
