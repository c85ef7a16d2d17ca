"""The driver's side of the barrier tasks' meeting (the tasks' side, and why it exists:
:mod:`hvd_magics.task.task_meeting`).

The event channel's reader threads put every event of the job here: a task's ``meet_offer`` is
kept, everything else goes on to the job's queue. Once each of the stage's tasks has offered, every
task is sent the ``meet`` order with the offers in partition order, which is what ``allGather``
would have returned.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from hvd_magics.channel import EventSink
from hvd_magics.events import MeetMessage, MeetOfferEvent, MeetOrder, Order, Wire
from hvd_magics.protocol import MEET, MEET_OFFER, is_event


class MeetingPoint:
    """Stands in the event channel for the job's queue (``put``), keeping the tasks' offers.

    Parameters
    ----------
    events : EventSink
        The job's events, where every other event goes.
    tasks : int
        The barrier stage's tasks.
    order_all : callable
        ``order_all(order)`` sends an order to every task.
    """

    def __init__(self, events: EventSink, tasks: int,
                 order_all: Callable[[Order], None]) -> None:
        self._events = events
        self._tasks = tasks
        self._order_all = order_all
        self._lock = threading.Lock()
        self._offers: dict[int, MeetMessage] = {}
        self._answered = False

    def put(self, event: Wire) -> None:
        """Keep a task's offer (answering every task once all have offered); queue any other
        event for the job."""
        if is_event(event) and event["kind"] == MEET_OFFER:
            self._keep(event)
        else:
            self._events.put(event)

    def _keep(self, offer: MeetOfferEvent) -> None:
        with self._lock:
            self._offers[int(offer["partition"])] = offer["message"]
            complete = not self._answered and len(self._offers) == self._tasks
            self._answered = self._answered or complete
        if complete:
            self._order_all(MeetOrder(kind=MEET, gathered=[self._offers[p]
                                                           for p in range(self._tasks)]))
