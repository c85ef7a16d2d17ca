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


def killpg(pgid: int | None) -> None:
    """Kill process group ``pgid`` with ``SIGKILL`` (nothing when it is gone or ``None``)."""
    if not pgid:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
