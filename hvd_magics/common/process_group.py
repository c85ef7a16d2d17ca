"""Process lifetimes on Linux: die with a parent, kill a whole process group.

A rank runs as ``keeper -> rank``: the supervisor starts the keeper in a new session, the keeper
forks the rank into a process group of its own. When the rank ends, or the supervisor dies
(``PR_SET_PDEATHSIG`` sends the keeper ``SIGTERM``), the keeper kills the rank's group, so
processes that user code started die with the job (see :mod:`hvd_magics.rank.rank_main`).
"""
from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when the thread that started it ends."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``), or ``None``
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # the 22nd field; the name before ")" may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` still names the process that started at ``started`` (:func:`start_time`;
    ``None``: not known, taken as the same), or no process at all: not someone else's."""
    return started is None or start_time(pid) in (None, started)


def killpg(pgid: int | None, started: int | None = None) -> None:
    """Kill process group ``pgid`` with ``SIGKILL`` (nothing when it is gone or ``None``).

    ``started``: the :func:`start_time` of the process that led the group. Linux gives a pid
    number out again once no process or group holds it (after 32,768 more on many hosts: minutes
    on a busy one), and ranks and keepers lead groups of their own: when a process of another
    start time now has that pid, the group ended and the number leads someone else's (another
    job's rank): nothing is killed.
    """
    if not pgid or not same_process(pgid, started):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
