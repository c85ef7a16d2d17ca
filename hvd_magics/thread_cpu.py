"""How long the calling thread has run on a CPU, and waited for one, so far. A wait for a CPU is
time the thread was ready to run but the host's CPUs were busy with other work, or its CPU quota
(a cgroup's) was spent; a thread blocked in a read or a sleep does not wait for a CPU.

Its time on a CPU is the thread's own CPU clock (``pthread_getcpuclockid``: the kernel brings
a running thread's figure up to date when it is read); its wait is Linux's per-thread
``schedstat`` (its second field, added when a wait ends). ``schedstat``'s first field, the time
on a CPU, is brought up to date only at the scheduler's ticks and switches: a thread that spun
for 1 ms between two reads read a median of 0.005 ms and a mean of 0.19 ms, and ranks of short
steps were said to be "off the CPU" while they computed."""
from __future__ import annotations

import os
import threading
import time


class ThreadCpu:
    """The CPU time and the wait for a CPU of the thread that made it (read from any thread,
    it still says that one's); zeros where Linux does not say."""

    __slots__ = ("_clock", "_fd")

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = -1
        try:
            self._clock: int | None = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):  # not on this system
            self._clock = None

    @property
    def readable(self) -> bool:
        """Whether this system says (Linux with schedstats)."""
        return self._fd >= 0

    def seconds(self) -> tuple[float, float]:
        """Seconds the thread has run on a CPU and waited for one, since it started."""
        if self._fd < 0:
            return 0.0, 0.0
        try:
            ran, waited = os.pread(self._fd, 64, 0).split()[:2]
        except (OSError, ValueError):
            return 0.0, 0.0
        try:
            return (time.clock_gettime(self._clock) if self._clock is not None
                    else int(ran) / 1e9), int(waited) / 1e9
        except (OSError, ValueError):  # its thread has ended: schedstat's last word
            return int(ran) / 1e9, int(waited) / 1e9

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
