"""What a job does when an attempt of it ends without succeeding, decided from the attempt's
typed cause (:class:`hvd_magics.causes.AttemptCause`), never from an error's text.

======================  =================  ====================================  ===========
the attempt's cause     ``restarts=0``     restarts left                          used up
======================  =================  ====================================  ===========
a lost rank, host or    fail               restart from the newest checkpoint    fail, with
executor                                   (counts against ``restarts``)         every cause
a preemption            fail, saying how   resume from the checkpoint saved at   fail
                        to resume          the notice (not counted; at most
                                           ``HVD_MAGICS_MAX_PREEMPTIONS``)
a rank's own error,     fail               fail (running it again gives the      fail
a start timeout                            same)
======================  =================  ====================================  ===========
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum

from hvd_magics.causes import DEATHS, LOSSES, AttemptCause
from hvd_magics.errors import HorovodJobError
from hvd_magics.protocol import ENV_MAX_PREEMPTIONS

#: How many attempts of a job may end on a preemption notice (they do not count against
#: ``restarts``), unless ``HVD_MAGICS_MAX_PREEMPTIONS`` says otherwise.
MAX_PREEMPTIONS = 10


class Decision(Enum):
    """What the job does after an attempt that did not succeed."""

    #: Start the next attempt from the newest checkpoint; it counts against ``restarts``.
    RESTART = "restart"
    #: Start the next attempt from the checkpoint saved at the notice; it does not count.
    RESUME = "resume"
    #: End the job with the attempt's error.
    FAIL = "fail"


def max_preemptions() -> int:
    """How many preempted attempts a job resumes: ``HVD_MAGICS_MAX_PREEMPTIONS``, else 10."""
    try:
        return max(0, int(os.environ.get(ENV_MAX_PREEMPTIONS, MAX_PREEMPTIONS)))
    except ValueError:
        return MAX_PREEMPTIONS


@dataclass(frozen=True)
class FailurePolicy:
    """The table above, for a job of ``restarts`` restarts.

    Parameters
    ----------
    restarts : int
        How many attempts after a loss the job may start.
    preemptions : int
        How many preempted attempts it resumes (when ``restarts`` is not 0).
    """

    restarts: int = 0
    preemptions: int = MAX_PREEMPTIONS

    def decide(self, cause: AttemptCause, losses: int, preempted: int) -> Decision:
        """What to do after an attempt that ended for ``cause``, when ``losses`` restarts and
        ``preempted`` resumptions were used already."""
        if cause is AttemptCause.PREEMPTION:
            return (Decision.RESUME if self.restarts and preempted < self.preemptions else
                    Decision.FAIL)
        if cause in LOSSES and losses < self.restarts:
            return Decision.RESTART
        return Decision.FAIL


def loss(exc: HorovodJobError) -> str | None:
    """The cause, in one line, when ``exc`` ended its attempt with a loss that a restart can get
    past (the first rank that died, or the stage's word when it lost an executor before any
    rank reported); else ``None``."""
    cause = exc.cause
    if cause not in LOSSES:
        return None
    if not exc.failures:
        return exc.summary.splitlines()[0]
    died = [f for f in exc.failures if f.cause in DEATHS]
    return (died or exc.failures)[0].headline()


def preempted(exc: HorovodJobError) -> str | None:
    """What rank 0 said when its attempt ended on a preemption notice (every rank stopped at
    it once rank 0 wrote the checkpoint: :func:`hvd_magics.causes.attempt_cause`); else
    ``None``."""
    if exc.cause is not AttemptCause.PREEMPTION:
        return None
    return next(f.message for f in exc.failures if f.rank == 0)
