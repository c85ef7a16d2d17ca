"""A job's life from its first attempt to its end, as one loop over explicit states, a turn a
step: each attempt started, watched a turn at a time, and ended; after an attempt that did not
succeed, its :class:`~hvd_magics.job.failure_policy.FailurePolicy` decides from the attempt's
typed cause whether the job restarts, resumes or fails.

=============  ==========================================================  =================
state          a step                                                       next
=============  ==========================================================  =================
starting       agree the attempt's checkpoint, make its backend, start it   running, or the
                                                                            attempt's end
running        one turn of its watch (events applied, monitors asked)      running, finished
                                                                            or its end
restarting     say why, and which checkpoint the next attempt resumes       starting
resuming       the same after a preemption (not counted against restarts)  starting
finished       the record returned                                          -
errored        the job's error raised                                       -
=============  ==========================================================  =================

Each attempt is told its number, the job's checkpoint folder and the step it resumes from
(:mod:`hvd_magics.rank.api.checkpoint`). An elastic job's resizes are Horovod's own elastic
driver's, inside one attempt (its formations are in the record).
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from hvd_magics.causes import LOSSES, AttemptCause
from hvd_magics.errors import HorovodJobError, JobInterrupted, NotEnoughSlotsError
from hvd_magics.job.failure_policy import (Decision, FailurePolicy, loss, max_preemptions,
                                           preempted)
from hvd_magics.job.job_life import Attempt
from hvd_magics.job.kept_memory import drop_kept, idle_words, kept_job, memory_step
from hvd_magics.job.launch_request import LaunchRequest
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.restarts import (ResumeFix, attempt_checkpoints, job_resume_fix, one_timing,
                                     resumes_after_preemption, resumes_from)
from hvd_magics.common.checkpoints import latest_checkpoint
from hvd_magics.notices import say
from hvd_magics.protocol import ENV_MAX_PREEMPTIONS


class State(Enum):
    """Where a job is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    RESUMING = "resuming"
    FINISHED = "finished"
    ERRORED = "errored"


class JobAttempt(Protocol):
    """One attempt, as the controller drives it (:class:`hvd_magics.job.job_life.Attempt`)."""

    def start(self) -> None: ...

    def turn(self) -> bool: ...

    def succeeded(self) -> None: ...

    def end(self, failure: BaseException | None) -> RunRecord: ...


class JobController:
    """Runs a job to its end: :meth:`run` returns its record or raises its error.

    Parameters
    ----------
    request : LaunchRequest
        The job.
    policy : FailurePolicy
        What follows an attempt that did not succeed.
    folder : Path
        The job's checkpoint folder.
    fresh : bool
        Remove the folder's checkpoints first (start over).
    resume_fix : ResumeFix, optional
        How a preempted job's error says to resume (default: :func:`job_resume_fix`).
    attempts : callable, optional
        Makes an attempt of a request (default :class:`Attempt`).
    """

    def __init__(self, request: LaunchRequest, policy: FailurePolicy, folder: Path,
                 fresh: bool = False, resume_fix: ResumeFix | None = None,
                 attempts: Callable[[LaunchRequest], JobAttempt] = Attempt) -> None:
        self.request, self.policy, self.folder, self.fresh = request, policy, folder, fresh
        self.fix = resume_fix or job_resume_fix(folder)
        if fresh:
            drop_kept(folder, request.env)
        #: The steps the job's hosts keep in memory (``checkpoint.keep``), across attempts.
        self.kept = kept_job(folder)
        self.make_attempt = attempts
        self.state = State.STARTING
        #: Every state the job was in, a step each (the running ones as one entry per turn).
        self.visited: list[State] = []
        self.attempt = self.losses = self.preemptions = 0
        #: Why each earlier attempt ended, and where the next one resumed, as the record says.
        self.causes: list[str] = []
        self.began = datetime.now()
        self.current: JobAttempt | None = None
        self._checkpoints = contextlib.ExitStack()
        self.last: RunRecord | None = None  # the record of the latest attempt that failed
        self.run_id: str | None = None  # the attempts' one MLflow run, once the first made it
        self.epochs: list[dict[str, Any]] = []  # the epochs the earlier attempts timed
        self.ended: tuple[str, str] = ("", "")  # the latest loss's cause and when it ended
        self.record: RunRecord | None = None
        self.error: BaseException | None = None

    def run(self) -> RunRecord:
        """Step until the job finished (its record) or errored (its error, raised)."""
        self._look_for_checkpoints()
        steps: dict[State, Callable[[], State]] = {
            State.STARTING: self._start, State.RUNNING: self._turn,
            State.RESTARTING: self._restart, State.RESUMING: self._resume}
        try:
            while self.state not in (State.FINISHED, State.ERRORED):
                self.visited.append(self.state)
                try:
                    self.state = steps[self.state]()
                except KeyboardInterrupt:  # between two steps' own handling of one
                    self.state = self._interrupted()
        finally:
            self._checkpoints.close()
        if self.error is not None:
            raise self.error
        assert self.record is not None
        return self.record

    def _look_for_checkpoints(self) -> None:
        if self.fresh:
            shutil.rmtree(self.folder, ignore_errors=True)
        found = latest_checkpoint(self.folder)
        kept = memory_step(self.kept, found[0].global_step if found else None)
        if kept is not None:  # the same job's last run in this session failed after keeping it
            say(f"the hosts' memory holds step {kept:,} of this job, kept by its last run: "
                "checkpoint.latest() gives it to the ranks (--fresh starts over)")
        elif found is not None:
            written = time.strftime("%H:%M:%S", time.localtime(found[1].stat().st_mtime))
            say(f"the job's checkpoints in {self.folder} hold step {found[0].global_step:,} "
                f"(written at {written}): checkpoint.latest() gives it to the ranks (--fresh "
                "starts over)")

    def _start(self) -> State:
        """Agree the attempt's checkpoint, make its backend and start its ranks."""
        request, attempt = self.request, self.attempt
        # a restart waits for the cluster to replace the executor it lost, up to start_timeout
        wait: dict[str, Any] = {"slot_wait_s": request.start_timeout} if attempt else {}
        self._checkpoints = contextlib.ExitStack()
        try:
            facts = self._checkpoints.enter_context(
                attempt_checkpoints(self.folder, attempt, self.kept))
            self.current = self.make_attempt(dataclasses.replace(
                request, env={**request.env, **facts.rank_env()}, attempt=attempt,
                kept=self.kept.steps,
                earlier_attempts=tuple(self.causes), mlflow_run_id=self.run_id, **wait))
        except KeyboardInterrupt:  # before its ranks started (waiting for task slots, say)
            self._checkpoints.close()
            what = f"attempt {attempt + 1} of the job" if attempt else "the job"
            return self._errored(JobInterrupted(
                f"interrupted while {what} was being set up, before any of its ranks started: "
                "nothing is left running"))
        except BaseException as exc:  # noqa: BLE001 - judged as the attempt's end
            self._checkpoints.close()
            return self._judge(exc)
        try:
            self.current.start()
        except BaseException as exc:  # noqa: BLE001 - the attempt settles it first
            return self._end(exc)
        return State.RUNNING

    def _turn(self) -> State:
        """One turn of the attempt's watch."""
        assert self.current is not None
        try:
            if not self.current.turn():
                return State.RUNNING
            self.current.succeeded()
        except BaseException as exc:  # noqa: BLE001 - the attempt settles it first
            return self._end(exc)
        try:
            record = self.current.end(None)
        except BaseException as exc:  # noqa: BLE001 - an interrupt while it wound down
            return self._errored(exc)
        finally:
            self._checkpoints.close()
        self._note_kept(record)
        drop_kept(self.folder, self.request.env)  # the job is done: its hosts need not keep it
        if self.causes:  # the record tells the attempts; the wall time and epochs are all theirs
            record.attempts, record.started_at = [*self.causes, "succeeded"], self.began
            record.epochs = one_timing(self.epochs, record.epochs)
        self.record = record
        return State.FINISHED

    def _end(self, failure: BaseException) -> State:
        """The attempt ended on ``failure``: settle it (its error raised, with its record),
        then judge that error."""
        assert self.current is not None
        try:
            self.current.end(failure)
            error: BaseException = failure
        except BaseException as settled:  # noqa: BLE001 - what the attempt ended with
            error = settled
        finally:
            self._checkpoints.close()
        return self._judge(error)

    def _interrupted(self) -> State:
        if self.state is State.RUNNING and self.current is not None:
            return self._end(KeyboardInterrupt())
        self._checkpoints.close()
        return self._errored(JobInterrupted(
            f"interrupted while attempt {self.attempt + 1} of the job was being {self.state.value}"
            ", before any of its ranks started: nothing is left running"))

    def _errored(self, error: BaseException) -> State:
        self.error = error
        return State.ERRORED

    def _judge(self, error: BaseException) -> State:
        """The failure policy's decision on an attempt's error, as the next state."""
        if isinstance(error, NotEnoughSlotsError):
            return self._errored(self._no_slots(error))
        if not isinstance(error, HorovodJobError):
            return self._errored(error)
        if error.record is not None:
            self._note_kept(error.record)
        cause = error.cause
        if cause is AttemptCause.KEPT_GONE:
            self.kept.steps.forget()  # the next attempt resumes from a file
        for failure in error.failures:
            if failure.host_lost:  # its keeper cannot be asked for what it holds
                self.kept.steps.lost(failure.host)
        decision = self.policy.decide(cause, self.losses, self.preemptions)
        if cause is AttemptCause.PREEMPTION:
            return self._preempted(error, decision)
        if cause not in LOSSES or not self.policy.restarts:
            self._say_kept(error, cause)
            return self._errored(error)  # a loss without restarts is raised as it is
        self.last = error.record if error.record is not None else self.last
        self.run_id = self.run_id or getattr(self.last, "mlflow_run_id", None)
        self.epochs = one_timing(self.epochs, getattr(self.last, "epochs", []))
        self.ended = (loss(error) or cause.value, time.strftime("%H:%M:%S"))
        if decision is Decision.FAIL:  # restarts used up: the record tells every attempt
            self.causes.append(f"{self.ended[0]} (ended {self.ended[1]})")
            if self.last is not None:
                self.last.attempts, self.last.started_at = list(self.causes), self.began
            error.add_summary(f"the job was started {self.attempt + 1} times, and each ended "
                              "with a loss: " + "; ".join(f"attempt {i + 1}: {c}"
                                                         for i, c in enumerate(self.causes)))
            self._say_kept(error, cause)
            return self._errored(error)
        self.attempt += 1
        self.losses += 1
        return State.RESTARTING

    def _note_kept(self, record: RunRecord) -> None:
        """What the hosts kept of the job and what it cost, into its record."""
        record.kept, record.kept_stall_s = self.kept.steps.describe(), self.kept.steps.stall_s

    def _say_kept(self, error: HorovodJobError, cause: AttemptCause) -> None:
        """A job lost to a fault says which step its hosts keep for it to resume from."""
        step = self.kept.steps.resume_step()
        if cause in LOSSES and step is not None:
            error.add_summary(
                f"its step {step:,} stays kept in the hosts' memory for "
                f"{idle_words(self.request.env)}: run the job again to resume from it")

    def _preempted(self, error: HorovodJobError, decision: Decision) -> State:
        notice = preempted(error) or ""
        self.preemptions += 1
        if decision is Decision.FAIL:
            why = (self.fix.restarts if not self.policy.restarts else
                   f"{self.preemptions - 1} preemptions were resumed already, the most "
                   f"{ENV_MAX_PREEMPTIONS} allows")
            return self._errored(HorovodJobError(
                f"The job was preempted: {notice}. {self.fix.again}, or {why}.",
                log_path=error.log_path))
        self.attempt += 1
        self.ended = (notice, time.strftime("%H:%M:%S"))
        return State.RESUMING

    def _restart(self) -> State:
        """Say why the attempt ended and where the next one resumes."""
        cause, ended = self.ended
        try:
            resume = resumes_from(self.folder, self.kept)
            self.causes.append(f"{cause} (ended {ended}; attempt {self.attempt + 1} {resume})")
            say(f"attempt {self.attempt} of {self.policy.restarts + 1} ended: {cause}; starting "
                f"attempt {self.attempt + 1}, which {resume}"
                + ("" if " kept in the memory" in resume else f" in {self.folder}"))
        except KeyboardInterrupt:
            return self._errored(JobInterrupted(
                f"interrupted after attempt {self.attempt} ended ({cause}), before attempt "
                f"{self.attempt + 1} started; nothing is left running"))
        return State.STARTING

    def _resume(self) -> State:
        """Say that the attempt ended on a preemption notice and where the next one resumes."""
        notice, ended = self.ended
        resume = resumes_after_preemption(self.folder, notice)
        self.causes.append(f"preempted: {notice} (ended {ended}; attempt {self.attempt + 1} "
                           f"{resume})")
        say(f"attempt {self.attempt} ended on a preemption notice: {notice}; starting attempt "
            f"{self.attempt + 1}, which {resume} (preemptions do not count against restarts)")
        return State.STARTING

    def _no_slots(self, exc: NotEnoughSlotsError) -> NotEnoughSlotsError:
        """A later attempt, or a job with a checkpoint, that finds no task slots: the error
        names the checkpoint that stays."""
        kept = latest_checkpoint(self.folder)
        if not self.attempt and kept is None:
            return exc
        self.last = exc.record if exc.record is not None else self.last
        if self.causes and self.last is not None:
            self.last.attempts = [*self.causes, f"not started: {exc}"]
        what = (f"The job's checkpoint of step {kept[0].global_step:,} in {self.folder} stays: "
                f"{self.fix.again}, once the cluster has the task slots" if kept else
                f"No checkpoint was written in {self.folder}")
        return NotEnoughSlotsError(f"{exc}\n{what}.")


def run_job(request: LaunchRequest, restarts: int, folder: Path, fresh: bool,
            resume_fix: ResumeFix | None = None) -> RunRecord:
    """Run a job to its end under the failure policy of ``restarts`` restarts; its record, or
    its error raised (a failed attempt's record comes on its error as ``record``)."""
    policy = FailurePolicy(restarts, max_preemptions())
    return JobController(request, policy, folder, fresh, resume_fix).run()
