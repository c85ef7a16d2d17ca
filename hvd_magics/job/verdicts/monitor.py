"""The one small protocol every verdict of a running job answers to, turn by turn."""
from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Protocol

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.launch.backend import Backend


@dataclass(frozen=True)
class Turn:
    """One turn of the watch: the job as its events left it, at ``now`` (monotonic)."""

    job: JobState
    backend: Backend
    events: queue.Queue
    now: float


class Monitor(Protocol):
    """Looks at the job once a turn: may act on it (ask stacks, tell the ranks, lose a host)
    and returns the error that ends the job, or ``None``."""

    #: Whether it judges a job that is failing too, while the other ranks' errors are
    #: gathered (a stalled rank's stacks, the start timeout); the others judge a running job.
    while_failing: bool

    def check(self, turn: Turn) -> HorovodJobError | None:
        """This turn's verdict, or ``None`` to go on."""
