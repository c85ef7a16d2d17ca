"""A notice that the job's executors are being taken away (spot or preemptible instances, a
drained node), as every rank sees it: :func:`preempting` turns True on every rank at the same
call, and the save that follows ends the attempt on purpose.

A loop asks once a step, as it asks whether to save::

    if step % 500 == 0 or checkpoint.preempting():
        checkpoint.save(state, step)

Every rank of a data-parallel loop calls it equally often, so its calls count the same steps on
every rank. A rank says how many calls it has made (a ``preempt_calls`` event, at most twice a
second once it has made one). When Spark starts decommissioning an executor of the job, the
driver picks a call number every rank is still short of (the most any rank reported, plus the
calls they make in the time the notice takes to arrive, and two more) and sends it to every
rank (the ``preempt`` order, through the supervisor's control pipe to :func:`on_order`); from
that call on, :func:`preempting` is True. The next :func:`hvd_magics.checkpoint.save` writes the
checkpoint (rank 0; the others skip) and raises :class:`~hvd_magics.errors.Preempted` on every
rank: the attempt ends at that step everywhere, and the next one resumes from it.

A rank that gets the notice after its call of that number (a notice late by more than the
margin) says so on its error stream and turns True at once: it then saves a step later than the
others and the attempt ends as a loss does, resuming from the last checkpoint that is whole.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from hvd_magics.errors import Preempted
from hvd_magics.events import PreemptCallsEvent
from hvd_magics.protocol import PREEMPT_CALLS
from hvd_magics.rank import rank_events
from hvd_magics.rank.rank_job import rank_job

#: Least seconds between two ``preempt_calls`` events of a rank.
REPORT_EVERY_S = 0.5


class _Notice:
    """What this rank knows of a preemption."""

    def __init__(self) -> None:
        self.calls = 0
        #: The call number from which :func:`preempting` is True (``None``: no notice).
        self.at: int | None = None
        self.notice = ""
        self.reported = 0.0
        #: Whether :func:`preempting` has said True (the next save ends the attempt).
        self.told = False
        self.lock = threading.Lock()


_state = _Notice()


def reset() -> None:
    """Forget the calls and any notice (a warm pool's next cell)."""
    global _state
    _state = _Notice()


def preempting() -> bool:
    """Whether this job's executors are being taken away: ``True`` on every rank from the same
    call on, once Spark decommissions an executor of the job (``spark.decommission.enabled``);
    ``False`` outside a job of ours. Call it once a step, on every rank, and save when it is
    ``True``: ``checkpoint.save`` then ends the attempt, and the next one (``restarts``)
    resumes from that step."""
    state = _state
    state.calls += 1
    at = state.at
    if at is not None and state.calls >= at:
        state.told = True
        return True
    now = time.monotonic()
    if now - state.reported >= REPORT_EVERY_S:
        state.reported = now
        rank_events.emit(PreemptCallsEvent(kind=PREEMPT_CALLS, calls=state.calls))
    return False


def on_order(text: str) -> None:
    """The driver's ``preempt`` order (JSON: ``at``, ``notice``), from the control pipe."""
    order: dict[str, Any] = json.loads(text)
    state = _state
    with state.lock:
        state.notice = str(order.get("notice", ""))
        at = int(order["at"])
        if state.calls >= at:
            sys.stderr.write(f"hvd_magics: the preemption notice came after call {at:,} of "
                             f"checkpoint.preempting() (this rank is at {state.calls:,}): this "
                             f"rank saves a step later than the others\n")
            at = state.calls + 1
        state.at = at


def noticed() -> bool:
    """Whether :func:`preempting` has said ``True`` in this attempt (its next save ends it)."""
    return _state.told


def after_save(step: int) -> None:
    """End the attempt (on every rank) once a save followed a ``True`` :func:`preempting`.

    Raises
    ------
    Preempted
        Always, after such a save.
    """
    state = _state
    if not state.told:
        return
    if rank_job().first:
        raise Preempted(f"the checkpoint of step {step:,} was saved on a preemption notice "
                        f"({state.notice})")
    raise Preempted(f"this rank's part of the checkpoint of step {step:,} is done, on a "
                    f"preemption notice ({state.notice}); rank 0 writes it")
