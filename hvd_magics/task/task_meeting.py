"""How the barrier tasks of a job meet: each learns what every task offers (its rendezvous port,
a setup error, its shards) before any rank runs (executor side; the driver's side is
:class:`hvd_magics.launch.meeting_point.MeetingPoint`).

Spark's ``allGather`` answers a second after the last task called it at the earliest: its JVM side
polls once a second (``BarrierTaskContext.runBarrier``). That was half of a small job's launch, and
it is paid again at the end, since a task must not end before its barrier call returns. So when the
job has an event channel each task offers its message to the driver (``meet_offer``), one offer per
rank when a task runs several; once every rank has offered, the driver sends each the list in
position order (``meet``): a round trip of milliseconds. Only a job without a channel
(``HVD_MAGICS_LIVE=0``) meets through ``allGather``.

Either way every task must take part, or the others wait for it forever: a task of a job with a
channel that cannot offer (it cannot reach the driver, or cannot even import hvd_magics) raises,
which fails the barrier stage, and Spark stops the other tasks.
"""
from __future__ import annotations

import json
import threading
from typing import Any
from collections.abc import Callable

from hvd_magics.events import Event, MeetMessage, MeetOfferEvent
from hvd_magics.protocol import MEET_OFFER

#: ``met`` of a meeting through the driver, and through ``allGather``.
BY_DRIVER, BY_SPARK = "driver", "spark"


class TaskMeeting:
    """One rank's side of its barrier task's meeting (:func:`meet`): :meth:`answer` with
    the driver's order, :meth:`cancel` when the driver went away."""

    def __init__(self) -> None:
        self._answered = threading.Event()
        self._lock = threading.Lock()
        self._gathered: list[MeetMessage] | None = None
        #: How the tasks met: ``"driver"`` or ``"spark"`` (empty before, or when cancelled).
        self.by = ""

    def answer(self, gathered: list[MeetMessage] | None, by: str) -> None:
        """Take every task's message in partition order (``None``: there is none to wait
        for); the first answer stands."""
        with self._lock:
            if self._answered.is_set():
                return
            self._gathered, self.by = gathered, by
            self._answered.set()

    def cancel(self) -> None:
        """The driver went away: a task waiting for its answer stops waiting."""
        self.answer(None, "")

    def wait(self) -> list[MeetMessage] | None:
        """The answer, once there is one (``None``: the driver went away)."""
        self._answered.wait()
        return self._gathered


def meet(ctx: Any, lanes: list[tuple[TaskMeeting, int, MeetMessage]],
         offer: list[Callable[[Event], None]] | None) -> None:
    """The meeting of a task's ranks (one, or several per task): each rank's ``(meeting,
    position, message)``, answered with every rank's message in position order (task by task,
    a task's ranks in turn). Each rank offers its own to the driver (``offer[i]``: its event
    channel's ``send``), all before any waits; without a channel the task gathers its ranks'
    messages in one ``allGather`` (``ctx``: its ``BarrierTaskContext``). Returns when every
    rank has its answer (``None`` for a rank whose driver went away)."""
    if offer is None:
        mine = json.dumps([message for _, _, message in lanes])
        gathered = [m for task in ctx.allGather(mine) for m in json.loads(task)]
        for meeting, _, _ in lanes:
            meeting.answer(gathered, BY_SPARK)
        return
    for (meeting, position, message), send in zip(lanes, offer):
        try:
            send(MeetOfferEvent(kind=MEET_OFFER, partition=position, message=message))
        except OSError:
            meeting.cancel()
    for meeting, _, _ in lanes:
        meeting.wait()
