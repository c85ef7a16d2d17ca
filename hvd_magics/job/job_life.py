"""One attempt of a job on the driver: its backend made, its ranks started and watched a turn at
a time, stopped unless they ended by themselves, and its record finished, whatever happens."""
from __future__ import annotations

import queue
import uuid
import warnings

from hvd_magics.errors import HorovodJobError, HorovodMagicsError, JobInterrupted
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_state import PREEMPTED
from hvd_magics.job.attempt_end import (diverged_note, finish_record, reap_ranks,
                                        where_on_interrupt, wind_down)
from hvd_magics.job.backend_choice import make_backend
from hvd_magics.job.launch_request import LaunchRequest
from hvd_magics.job.records.mlflow_run import MlflowTracker
from hvd_magics.job.failure_policy import preempted
from hvd_magics.job.records.run_logs import prune_old_runs, runs_dir
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.session import SESSION
from hvd_magics.job.watch.loop import ElasticWatch, FixedWatch
from hvd_magics.protocol import ENV_EVERY_RESULT
from hvd_magics.result_codec import ResultDecodeError
from hvd_magics.task.engines import engine_of

#: A rank's errors that mean the executors' Python lacks a module.
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")


def _tracker(request: LaunchRequest, job_id: str, where: str,
             engine: str) -> MlflowTracker | None:
    if request.tracking is None:
        return None
    try:
        return MlflowTracker(request.tracking, job_id, request.np, where, request.source, engine,
                             attempt=request.attempt, continue_run=request.mlflow_run_id,
                             earlier_attempts=request.earlier_attempts)
    except Exception as exc:  # noqa: BLE001 - tracking never stops a job
        warnings.warn(f"hvd_magics: MLflow tracking could not start ({type(exc).__name__}: "
                      f"{exc}); the job goes on without it.", stacklevel=3)
        return None


class Attempt:
    """One attempt of a job: its backend made, its ranks started and watched a turn at a time
    (:meth:`turn`), and its end settled (:meth:`end`): the job stopped unless it ended by
    itself, its record finished and its views and log closed, whatever happened.

    A job's controller (:mod:`hvd_magics.job.controller`) drives it; :func:`launch` runs one
    to its end."""

    def __init__(self, request: LaunchRequest) -> None:
        self.request = request
        self.job_id = job_id = uuid.uuid4().hex[:12]
        self.backend = backend = make_backend(request)
        prune_old_runs()
        self.log_path = log_path = runs_dir() / job_id / "ranks.log"
        engine = engine_of(request.env)
        self.tracker = tracker = _tracker(request, job_id, backend.where, engine)
        self.job = job = JobState(abs(request.np), log_path,
                                  request.views + ([tracker] if tracker else [])
                                  + ([request.kept] if request.kept is not None else []),
                                  backend.where, request.elastic,
                                  timeline_dest=request.options.timeline,
                                  stall_after=request.options.stall_after, engine=engine)
        job.earlier_attempts = request.earlier_attempts
        self.record = RunRecord(job_id=job_id, np=request.np, where=backend.where,
                                log_path=str(log_path),
                                elastic=str(request.elastic) if request.elastic else None,
                                engine=engine)
        SESSION.last_run = self.record
        self.events: queue.Queue = queue.Queue()
        if request.live is not None:
            request.live.job, request.live.backend = job, backend
            request.live.record = self.record
        self.follower: FixedWatch | ElasticWatch | None = None
        #: Whether the ranks ended by themselves (the watch found no failure): nothing to stop.
        self.clean = False

    def start(self) -> None:
        """Start the ranks (the backend's Spark stage or processes)."""
        request, job, backend = self.request, self.job, self.backend
        backend.start(request.payload.blob, self.job_id, self.events)
        stop = request.live.stop if request.live is not None else None
        if request.live is not None:
            request.live.started.set()
        self.follower = (ElasticWatch(job, backend, self.events, stop) if request.elastic else
                         FixedWatch(job, backend, self.events, request.start_timeout,
                                    request.options.timeout, stop))

    def turn(self) -> bool:
        """One turn of the watch; ``True`` once the job's end is certain. Raises what ended
        it (a monitor's verdict, ``KeyboardInterrupt``)."""
        assert self.follower is not None, "start() the attempt first"
        return self.follower.turn()

    def succeeded(self) -> None:
        """The watch ended: raise the job's error, or take rank 0's value (every rank's, when
        asked) into the record."""
        assert self.follower is not None, "start() the attempt first"
        self.follower.outcome()
        self.clean = True
        request, job, record = self.request, self.job, self.record
        try:
            record.value, record.returned = request.decode(job.result_parts)
            if request.env.get(ENV_EVERY_RESULT) == "1":
                record.values = [request.decode(job.rank_parts.get(rank, {}))[0]
                                 for rank in range(job.size)]
        except ResultDecodeError as exc:
            raise HorovodJobError(str(exc), log_path=str(self.log_path)) from None

    def end(self, failure: BaseException | None) -> RunRecord:
        """Settle the attempt: ``failure`` is what ended it (``None``: it succeeded). Stop it
        unless it ended by itself, finish its record and close its views and log; return the
        record, or raise the attempt's error (carrying the record as ``record``)."""
        record, job, backend = self.record, self.job, self.backend
        where_they_were = ""
        if isinstance(failure, KeyboardInterrupt):
            record.status = record.error = "interrupted"
            try:
                where_they_were = where_on_interrupt(job, backend, self.events)
            except KeyboardInterrupt:  # a second interrupt: stop without looking
                where_they_were = ""
        elif failure is not None:
            # an attempt every rank ended on a preemption notice, on purpose, is not a failure
            notice = preempted(failure) if isinstance(failure, HorovodJobError) else None
            record.status = PREEMPTED if notice else "failed"
            # its error says the same (it said "2 of 2 ranks failed" of a preempted attempt)
            record.error = (f"preempted: {notice} (every rank stopped at the notice, on "
                            "purpose)" if notice else f"{type(failure).__name__}: {failure}")
        self._settle(self.clean)
        if isinstance(failure, KeyboardInterrupt):
            raise self._interrupted(where_they_were) from None
        if failure is not None:
            raise self._explained(failure)
        return record

    def _settle(self, clean: bool) -> None:
        record, job, backend = self.record, self.job, self.backend
        try:
            wind_down(backend, job, self.events, clean)
        except KeyboardInterrupt:  # a second interrupt while the job is being stopped
            backend.stop()
            reap_ranks(job, backend)
            record.status = record.error = "interrupted"
            raise JobInterrupted("stopped while the job was being wound down; its rank "
                                 "processes were killed. The log of every rank: "
                                 + str(self.log_path)) from None
        finally:
            finish_record(record, job)
            if self.tracker is not None:
                self.tracker.finish(record)

    def _interrupted(self, where_they_were: str) -> JobInterrupted:
        job, backend, log_path = self.job, self.backend, str(self.log_path)
        if backend.keeps_ranks:
            what = (backend.restart_note or "the pool keeps its ranks and their variables.")
            return JobInterrupted(f"interrupted the cell on every rank of the warm pool; {what} "
                                  + where_they_were + "The log of every rank: " + log_path)
        return JobInterrupted(
            f"stopped {job.current_size} rank processes"
            + (f" and cancelled Spark job group hvd_magics-{self.job_id}"
               if self.request.np > 0 else "")
            + "; nothing is left running. " + where_they_were + "The log of every rank: "
            + log_path)

    def _explained(self, failure: BaseException) -> BaseException:
        """``failure`` with the record on it, and what the backend adds (a pool's restart, the
        fix for a module the executors lack)."""
        backend = self.backend
        if isinstance(failure, HorovodMagicsError):
            failure.record = self.record  # a restart reads the failed attempt's record from it
        note = backend.restart_note or (diverged_note(self.job) if backend.keeps_ranks else "")
        if isinstance(failure, HorovodJobError):
            if note:
                failure.add_summary(note)
            if any(f.error in IMPORT_ERRORS for f in failure.failures):
                fix = backend.missing_module_fix().strip()
                if fix:
                    failure.add_summary(fix)
        return failure


def launch(request: LaunchRequest) -> RunRecord:
    """Run one attempt of a job to its end and return its record; raise when it failed (the
    error carries the record as ``record``).

    Whatever happens, the views are ended and the log is closed before this returns or raises.
    """
    attempt = Attempt(request)
    try:
        attempt.start()
        while not attempt.turn():
            pass
        attempt.succeeded()
    except BaseException as exc:  # noqa: BLE001 - settled, then raised as it is
        return attempt.end(exc)
    return attempt.end(None)
