"""A job's end judged once its ranks exited (or the watch stopped following them): the error
it ends with, naming the rank or host that caused it, or nothing when it succeeded."""
from __future__ import annotations

from hvd_magics.causes import AttemptCause
from hvd_magics.errors import DataRefused, HorovodJobError, RankFailure, sentence
from hvd_magics.job.verdicts.failure_hints import hint_for
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_state import LOST
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.spark_errors import executor_was_lost
from hvd_magics.rank_names import ranks_named

#: Said when ranks of an elastic job failed because they lost a peer: what survives a loss.
ELASTIC_RUN_HINT = (
    "A rank that loses a peer goes on only inside a function decorated with "
    "@hvd.elastic.run (taking a hvd.elastic State that the loop commits with state.commit()); "
    "outside one, Horovod shuts down on every rank. Fix: put the training loop in such a "
    "function (Horovod's elastic examples show the pattern)")


def failure_of(job: JobState, backend: Backend) -> HorovodJobError | None:
    """The error a job of a fixed size ends with, or ``None`` when every rank succeeded."""
    failures = job.failures()
    if not failures and job.all_exited:
        return None
    log_path = str(job.log_path)
    refused = backend.refused
    if refused and not failures:
        job.refused = True
        return DataRefused(refused, log_path=log_path)
    spark_failure = backend.describe_failure()
    if spark_failure and not failures:
        began = any(r.pid is not None for r in job.ranks)
        what = "failed before the ranks finished" if began else "ended before any rank started"
        lost = AttemptCause.LOST_EXECUTOR if executor_was_lost(spark_failure) else None
        return HorovodJobError(f"The Spark job {what}: {spark_failure}", log_path=log_path,
                               cause=lost)
    if not failures:
        missing = [r.rank for r in job.ranks if not r.exited]
        return HorovodJobError(f"Ranks {', '.join(map(str, missing)) or 'none'} ended without "
                               "reporting an exit code.", log_path=log_path)
    first = failures[0]
    if spark_failure and first.error == LOST and backend.took_every_rank():
        # the Connect server went, and every rank's task with it: it is named, not a rank
        return HorovodJobError(f"{spark_failure[0].upper()}{spark_failure[1:]}", failures,
                               log_path)
    if spark_failure:
        for failure in failures:
            if failure.error == LOST:
                failure.message += f" (Spark: {spark_failure})"
    lead = f"{job.lost_host[0].upper()}{job.lost_host[1:]}; the job was stopped. " \
        if job.lost_host else ""
    return HorovodJobError(
        f"{lead}{_uneven_note(job, first)}{job.failed_count()}; the first was "
        f"{first.headline()}{hint_for(first)}", failures, log_path)


def _uneven_note(job: JobState, first: RankFailure) -> str:
    """``"rank 1 had finished ... "`` when ranks had finished the job's code before ``first``
    failed in a collective: an order of events, not a verdict (ranks that make different calls
    are caught while they wait, with the evidence: :mod:`hvd_magics.job.verdicts.left_behind`)."""
    finished = [rank for rank in job.finished_ranks() if rank != first.rank]
    if not finished or "ollective" not in f"{first.error} {first.message}":
        return ""
    return (f"{ranks_named(finished, job.unit)} had finished the job's code when {job.unit} "
            f"{first.rank}'s collective failed. ")


def elastic_failure_of(job: JobState, backend: Backend) -> HorovodJobError | None:
    """The error an elastic job ends with as a whole (a rank lost on the way is a reset, not a
    failure), or ``None``."""
    failure = backend.describe_failure()
    if failure:
        return HorovodJobError(f"The elastic job failed: {failure}", job.failures(),
                               str(job.log_path))
    if any(r.has_result and r.exit_code == 0 for r in job.ranks):
        return None
    failures = job.failures()
    summary = (f"every rank of the elastic job failed; the first was "
               f"{failures[0].headline()}" if failures else
               "the elastic job ended without a rank that finished")
    if any(r.peer_lost for r in job.ranks if r.failed):
        summary = f"{sentence(summary)} {ELASTIC_RUN_HINT}"
    return HorovodJobError(summary[0].upper() + summary[1:], failures, str(job.log_path))
