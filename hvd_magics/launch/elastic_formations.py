"""Every formation of an elastic job's ranks, each a ``resize`` event for the views with its
causes: what made the ranks re-form since the last one (noted as it happened: a rank's exit, a
lost task or host), and the tasks that joined."""
from __future__ import annotations

import time

from hvd_magics.events import ResizeEvent
from hvd_magics.protocol import RESIZE
from hvd_magics.rank_names import TASK, rank_named, ranks_named


class Formations:
    """The formations of one elastic job's ranks, the first included."""

    def __init__(self) -> None:
        #: Every formation of the ranks: ``{"reset", "size", "ranks", "causes", "time"}``.
        self.all: list[ResizeEvent] = []
        self._causes: list[str] = []

    def note(self, cause: str) -> None:
        """``cause`` makes the ranks re-form: the next formation says so."""
        self._causes.append(cause)

    def host_lost(self, task: int, host: str) -> None:
        """Task ``task``'s host stopped answering: the next formation says so."""
        self.note(f"{rank_named(task, TASK)} on {host} stopped answering: its link or machine "
                  "was lost")

    def formed(self, by_task: dict[int, int], size: int) -> ResizeEvent:
        """The ranks formed anew, ``size`` of them, ``by_task`` (task -> rank) those whose task
        is known: its ``resize`` event, kept."""
        previous = self.all[-1]["ranks"] if self.all else {}
        causes, self._causes = self._causes, []
        joined = sorted(set(by_task) - set(previous))
        if self.all and joined:
            causes.append(f"{ranks_named(joined, TASK)} joined")
        formation = ResizeEvent(kind=RESIZE, rank=None, recv=time.monotonic(),
                                reset=len(self.all), size=size, ranks=by_task, causes=causes,
                                time=time.time())
        self.all.append(formation)
        return formation
