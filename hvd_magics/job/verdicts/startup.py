"""The ranks' start: the executors' unpacking of a shipped environment said while it goes on
(and not counted against the start timeout), and the ranks that did not start in time."""
from __future__ import annotations

import sys

from hvd_magics.errors import HorovodJobError, StartTimeoutError
from hvd_magics.job.rank_state import WAITING
from hvd_magics.job.verdicts.monitor import Turn
from hvd_magics.notices import say
from hvd_magics.rank_names import ranks_named

#: How often the cell's line says the executors still fetch and unpack the environment.
UNPACKING_SHOWN_EVERY_S = 5.0


class Startup:
    """The start timeout, counted from when the ranks can start: the watch's start, or when a
    job's DataFrames reached its tasks (after the user's Spark stages, which take what they
    take); never for a backend that tells nothing before its end."""

    def __init__(self, start_timeout: float, started: float,
                 unpacking: tuple[float, str] | None) -> None:
        self.start_timeout, self.started, self.unpacking = start_timeout, started, unpacking
        self.shown = started - UNPACKING_SHOWN_EVERY_S  # said at once, then every 5 s
        self.told = False

    while_failing = True  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        job, backend, now = turn.job, turn.backend, turn.now
        if backend.finished:
            return None  # the stage's own end says why its ranks did not start
        clock = job.data_arrived_at if backend.reads_data else self.started
        if not backend.live:
            clock = None  # nothing arrives before the end: Spark's own scheduling decides
        unheard = [r.rank for r in job.ranks if r.state == WAITING and not r.exited]
        extra, doing = self.unpacking if self.unpacking is not None and unheard else (0.0, "")
        start_timeout = self.start_timeout
        if doing and clock is not None and now - self.shown >= UNPACKING_SHOWN_EVERY_S:
            self.shown, self.told = now, True
            say(f"{doing}: {now - clock:.0f} s so far (the start timeout of "
                f"{start_timeout:.0f} s counts from when they have it; {extra:.0f} s allowed "
                "for it)", redraw=True)
        elif self.told and not unheard:
            self.told = False
            say(f"every executor of the job has the environment ({now - self.started:.0f} s)",
                redraw=True)
            print(file=sys.stderr, flush=True)
        if job.all_started or clock is None or now - clock <= start_timeout + extra:
            return None
        waiting = [r.rank for r in job.ranks if r.pid is None and not r.exited]
        took = f" ({start_timeout:.0f} s, and {extra:.0f} s while {doing})" if doing else ""
        return StartTimeoutError(
            f"Timed out after {start_timeout + extra:.0f} s{took} waiting for "
            f"{ranks_named(waiting, job.unit) if waiting else 'no rank'} to start "
            f"({job.size - len(waiting)} of "
            f"{job.size} started on {backend.where}). " + backend.silence_note(unheard) +
            "If the cluster needs longer to schedule the tasks, raise start_timeout "
            "(%%horovod --start-timeout SECONDS).", log_path=str(job.log_path))
