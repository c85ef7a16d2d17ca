"""Ranks that just went silent: their stacks taken, so that the views say where they are."""
from __future__ import annotations

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.rank_state import STALL_REQUEST
from hvd_magics.job.verdicts.monitor import Turn


class StalledRanks:
    """Asks a rank silent for the stall time where it is, once; a rank that speaks again may be
    asked again when it next goes silent."""

    def __init__(self) -> None:
        self.asked: set[int] = set()

    while_failing = True  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        job = turn.job
        stalled = {r.rank for r in job.ranks
                   if r.stalled_for(turn.now, job.stall_after) is not None}
        self.asked &= stalled
        if stalled - self.asked:
            job.stacks.ask(turn.backend, STALL_REQUEST)
            self.asked |= stalled
        return None
