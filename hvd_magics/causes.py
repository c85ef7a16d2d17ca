"""Why a rank failed and why an attempt of a job ended, as types.

This is the one place a failure's words are read: the collective libraries say that a peer went
away only in their messages (Gloo's ``Connection closed by peer``, Horovod's ``has been shut
down``). Everything that decides on a failure (which rank a job's error names first, whether a
job with restarts starts again) reads a :class:`RankCause` or an :class:`AttemptCause`, never
the text.
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

#: The error name of a rank whose supervisor vanished (its Spark executor was lost or killed,
#: or its host stopped answering).
RANK_LOST = "RankLost"
#: The error name of a rank that ended on purpose at a preemption notice
#: (:class:`hvd_magics.errors.Preempted`).
PREEMPTED_ERROR = "Preempted"
#: The exception a rank raises when the kept step it resumes from is gone (hvd_magics.errors).
KEPT_GONE_ERROR = "KeptStepUnreachable"

#: What a rank's error says when it failed only because a peer went away first: certainly a
#: consequence, never the cause a job's error names first.
PEER_LOST_WORDS = ("HorovodInternalError", "Horovod has been shut down",
                   "Connection reset by peer", "Connection closed by peer")
#: What a rank's error (or its traceback) says when it failed in the collective library: a
#: consequence when another rank died, else possibly its own (an NCCL usage error).
COLLECTIVE_WORDS = PEER_LOST_WORDS + (
    "Broken pipe", "has been shut down", "DistBackendError", "NCCL", "Gloo", "gloo",
    "Socket Timeout", "connection refused")


class RankCause(Enum):
    """Why one rank failed."""

    #: Its own exception (a ``ValueError``, a shape error): running it again gives the same.
    OWN_ERROR = "its own error"
    #: Its collectives failed because a peer went away (Horovod shut down, a Gloo connection
    #: closed by the peer).
    PEER_LOST = "a peer went away"
    #: It failed in the collective library (Gloo, NCCL): a consequence when another rank died.
    COLLECTIVE = "failed in the collective library"
    #: It ended without a Python exception: killed, a signal, its executor lost.
    DIED = "died without a Python exception"
    #: Its host stopped answering (its link or machine was lost).
    HOST_LOST = "its host stopped answering"
    #: It ended on purpose at a preemption notice, its part of the save done.
    PREEMPTED = "ended at a preemption notice"
    #: The step it was to resume from, kept in the hosts' memory, was on no host it could reach.
    KEPT_GONE = "its kept step was gone"


#: Causes that are another rank's consequence when one of :data:`DEATHS` is beside them.
CONSEQUENCES = frozenset({RankCause.PEER_LOST, RankCause.COLLECTIVE, RankCause.PREEMPTED})
#: A rank gone, not one that raised.
DEATHS = frozenset({RankCause.DIED, RankCause.HOST_LOST})


def rank_cause(error: str, message: str = "", traceback: str = "",
               host_lost: bool = False) -> RankCause:
    """The cause of a rank's failure from what it left: ``error`` (its exception's name,
    ``""`` when it died without one), ``message`` and ``traceback``."""
    if host_lost:
        return RankCause.HOST_LOST
    if not error or error == RANK_LOST:
        return RankCause.DIED
    if error == PREEMPTED_ERROR:
        return RankCause.PREEMPTED
    if error == KEPT_GONE_ERROR:
        return RankCause.KEPT_GONE
    said = f"{error} {message}"
    if any(words in said for words in PEER_LOST_WORDS):
        return RankCause.PEER_LOST
    if any(words in f"{said}\n{traceback}" for words in COLLECTIVE_WORDS):
        return RankCause.COLLECTIVE
    return RankCause.OWN_ERROR


class AttemptCause(Enum):
    """Why one attempt of a job ended without succeeding: what its failure policy decides on
    (:mod:`hvd_magics.job.failure_policy`)."""

    #: A rank died (killed, its executor lost) and every other failed rank only followed it.
    LOST_RANK = "a rank was lost"
    #: A host stopped answering and every other failed rank only followed it.
    LOST_HOST = "a host was lost"
    #: The Spark stage lost an executor before any rank reported.
    LOST_EXECUTOR = "an executor was lost"
    #: Every rank stopped at a preemption notice once rank 0 wrote the checkpoint.
    PREEMPTION = "preempted"
    #: A rank's own error: running it again gives the same.
    USER_ERROR = "a rank's own error"
    #: Not every rank started within the start timeout.
    START_TIMEOUT = "a start timeout"
    #: A rank found the kept step it was to resume from on no host: the next attempt resumes
    #: from a file.
    KEPT_GONE = "the kept step was gone"


#: The attempts' ends a restart can get past.
LOSSES = frozenset({AttemptCause.LOST_RANK, AttemptCause.LOST_HOST, AttemptCause.LOST_EXECUTOR,
                    AttemptCause.KEPT_GONE})


def attempt_cause(failed: Sequence[tuple[int, RankCause]]) -> AttemptCause:
    """Why an attempt ended, from its failed ranks' ``(rank, cause)``.

    A preemption: rank 0, which writes the checkpoint, stopped at the notice, and every other
    failed rank did too, or died, or lost a peer (the executor may be gone before its rank
    reported). Rank 0's word only: another rank stops as soon as its part is done, before rank 0
    has written anything, so an attempt whose rank 0 was lost while it saved is a loss.

    A loss: at least one rank died and every other failed rank died, lost a peer, failed in the
    collective library or stopped at the notice. Anything else is a rank's own error."""
    causes = {cause for _, cause in failed}
    if (0, RankCause.PREEMPTED) in failed and causes <= CONSEQUENCES | DEATHS:
        return AttemptCause.PREEMPTION
    if RankCause.KEPT_GONE in causes and causes <= CONSEQUENCES | DEATHS | {RankCause.KEPT_GONE}:
        return AttemptCause.KEPT_GONE
    if causes & DEATHS and causes <= CONSEQUENCES | DEATHS:
        return (AttemptCause.LOST_HOST if RankCause.HOST_LOST in causes
                else AttemptCause.LOST_RANK)
    return AttemptCause.USER_ERROR
