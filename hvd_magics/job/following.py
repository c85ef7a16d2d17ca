"""The job's events applied as they arrive, and the ranks' stacks asked for while they are."""
from __future__ import annotations

import queue
import time

from hvd_magics.job.job_state import JobState
from hvd_magics.job.readings.stacks import STACKS_WAIT_S, JobStacks
from hvd_magics.launch.backend import Backend


def drain(job: JobState, events: queue.Queue) -> None:
    """Apply every event that has arrived."""
    while True:
        try:
            job.handle(events.get_nowait())
        except queue.Empty:
            return


def follow(job: JobState, events: queue.Queue) -> float:
    """Apply what arrived within a tenth of a second, let the views refresh; return the time."""
    try:
        job.handle(events.get(timeout=0.1))
        drain(job, events)
    except queue.Empty:
        pass
    job.tick()
    return time.monotonic()


def collect_stacks(job: JobState, backend: Backend, events: queue.Queue,
                   wait: float = STACKS_WAIT_S) -> JobStacks:
    """Ask every running rank where it is; wait up to ``wait`` seconds for the answers (the
    job's other events are applied meanwhile)."""
    began = time.monotonic()
    # every rank that has not exited is waited for: following the job's events meanwhile also
    # records the pids of ranks that just started (an interrupt's clean-up needs them)
    waiting = set(job.running_ranks()) | set(job.starting_ranks())
    if not waiting:
        return JobStacks(starting=job.starting_ranks())
    request = job.stacks.ask(backend)
    while time.monotonic() - began < wait and not waiting <= set(job.stacks.answers[request]):
        follow(job, events)
    answers = job.stacks.answers.pop(request)
    unanswered, starting = waiting - set(answers), set(job.starting_ranks())
    return JobStacks(dict(answers), sorted(unanswered - starting), time.monotonic() - began,
                     sorted(unanswered & starting), job.splits.now(job.unit))
