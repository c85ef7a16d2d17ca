"""The state one Python process (one kernel) keeps across jobs, in one place.

The magics and :class:`~hvd_magics.job.runner.HorovodRunner` share the one :data:`SESSION`: the
last run (also failed or interrupted ones) and what ``%hvd_timeline`` turned on. Nothing else
keeps state between jobs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hvd_magics.job.run_record import RunRecord
from hvd_magics.job.timeline import TimelineSettings


@dataclass
class Session:
    """What outlives a job in this process."""

    last_run: RunRecord | None = None
    timeline: TimelineSettings = field(default_factory=TimelineSettings)

    def reset(self) -> None:
        """Forget the last run and turn the timeline off (as in a fresh kernel)."""
        self.last_run = None
        self.timeline = TimelineSettings()


#: This process's session.
SESSION = Session()
