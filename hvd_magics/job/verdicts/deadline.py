"""A job stopped at its timeout (``--timeout``), saying where each rank was."""
from __future__ import annotations

from hvd_magics.errors import HorovodJobError, JobTimeoutError
from hvd_magics.job.following import collect_stacks
from hvd_magics.job.verdicts.monitor import Turn


class Deadline:
    """The job's timeout, counted from when the watch began."""

    def __init__(self, timeout: float, started: float) -> None:
        self.timeout, self.started = timeout, started

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        if turn.now - self.started <= self.timeout:
            return None
        job = turn.job
        stacks = collect_stacks(job, turn.backend, turn.events)
        return JobTimeoutError(
            f"The job ran past its timeout of {self.timeout:g} s and was stopped (raise it with "
            f"%%horovod --timeout SECONDS or HorovodRunner(np, timeout=SECONDS)). Where each "
            f"{job.unit} was:\n{stacks.summary(job.unit)}", log_path=str(job.log_path))
