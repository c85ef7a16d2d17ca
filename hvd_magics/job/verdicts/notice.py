"""A preemption notice followed: every rank told the call of ``checkpoint.preempting()`` at
which they all save (:mod:`hvd_magics.job.readings.preemption` picks it), and rank 0's save
given its time, then judged when it takes longer."""
from __future__ import annotations

import os

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.readings.stacks import where as stack_where
from hvd_magics.job.verdicts.preemption import CHECK_EVERY_S, notice_text
from hvd_magics.job.following import collect_stacks
from hvd_magics.job.verdicts.monitor import Turn
from hvd_magics.notices import say
from hvd_magics.protocol import ENV_NOTICE_SAVE_WAIT
from hvd_magics.rank_names import rank_named, ranks_named

#: How long rank 0 may take to write the checkpoint of a preemption notice once the other ranks
#: ended on it (their part done), unless ``HVD_MAGICS_NOTICE_SAVE_WAIT_S`` says otherwise: a
#: large model's checkpoint takes minutes, and a spot instance's notice gives 30 s to 2 min.
NOTICE_SAVE_WAIT_S = 300.0

#: The fix said when ranks did not end after a preemption notice's save.
SAVE_FIX = ("Fix: save on every rank (checkpoint.save on every rank: rank 0 writes, the others "
            "skip); a collective inside the save on some ranks only waits forever.")


class PreemptionNotice:
    """Once Spark decommissions an executor of the job, tell every rank the call of
    ``checkpoint.preempting()`` at which they all save, and say so in the cell; once a job."""

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        job, now = turn.job, turn.now
        watch = job.preemption
        if watch.notice or now - watch.checked < CHECK_EVERY_S:
            return None
        watch.checked = now
        tasks = {r.rank: r.task for r in job.ranks if r.task is not None and not r.exited}
        found = turn.backend.decommissioning(tasks)
        if not found:
            return None
        watch.notice = notice_text(found, job.unit)
        watch.at = watch.target(now)
        if watch.at is None:
            say(f"{watch.notice}; the job does not call checkpoint.preempting(), so it goes on "
                f"until the executor is gone (a restart resumes from the last checkpoint)")
            return None
        turn.backend.preempt(watch.at, watch.notice)
        say(f"{watch.notice}: every {job.unit} saves at its call {watch.at:,} of "
            f"checkpoint.preempting() and the attempt ends there")
        return None


def saving_on_notice(job: JobState) -> bool:
    """Whether every rank that ended so far ended on a preemption notice (its part of the
    save done) and some still run: rank 0 writing the checkpoint, which may take minutes."""
    ended = [r for r in job.ranks if r.failed]
    return bool(ended) and all(r.stopped_on_notice for r in ended) and \
        any(not r.exited for r in job.ranks)


def notice_save_wait() -> float:
    """Seconds the save of a notice may take (:data:`NOTICE_SAVE_WAIT_S` unless said)."""
    try:
        return float(os.environ.get(ENV_NOTICE_SAVE_WAIT, NOTICE_SAVE_WAIT_S))
    except ValueError:
        return NOTICE_SAVE_WAIT_S


def stuck_in_the_save(job: JobState, noticed: list[int], stuck: list[int], what: str,
                      at: str, fix: str = SAVE_FIX) -> str:
    """The verdict on ranks that did not end after the save of a preemption notice, which
    ``noticed`` ended on (their part of it done)."""
    plural = len(stuck) > 1
    return (f"{ranks_named(stuck, job.unit)} {'wait' if plural else 'waits'} in {what} after "
            f"the preemption notice, while {ranks_named(noticed, job.unit)} ended on it once "
            f"{'their' if len(noticed) > 1 else 'its'} part of the save was done ({at}); the "
            f"job was stopped. {fix}")


def save_too_long(turn: Turn, waited: float) -> HorovodJobError:
    """The verdict on ranks still running :func:`notice_save_wait` seconds after the others
    ended on the notice, with where they are."""
    job = turn.job
    running = job.running_ranks()
    stacks = collect_stacks(job, turn.backend, turn.events)
    at = "; ".join(f"{rank_named(rank, job.unit)} in "
                   f"{stack_where(stacks.ranks[rank].get('threads', []))}"
                   for rank in running if rank in stacks.ranks) or "no stack came back"
    return HorovodJobError(stuck_in_the_save(
        job, job.ended_on_notice(), running, f"its save for more than {waited:.0f} s", at,
        f"Fix: give a save that takes longer more time: {ENV_NOTICE_SAVE_WAIT}=SECONDS in the "
        f"notebook's environment (default {NOTICE_SAVE_WAIT_S:.0f})."),
        log_path=str(job.log_path))
