"""How long the calling thread has run on a CPU, and waited for one, so far: Linux's per-thread
``schedstat``. A wait for a CPU is time the thread was ready to run but the host's CPUs were
busy with other work, or its CPU quota (a cgroup's) was spent; a thread blocked in a read or a
sleep does not wait for a CPU."""
from __future__ import annotations

import os


class ThreadCpu:
    """The ``schedstat`` of the thread that made it (read from any thread, it still says that
    one's); zeros where Linux does not say."""

    __slots__ = ("_fd",)

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = -1

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
            return int(ran) / 1e9, int(waited) / 1e9
        except (OSError, ValueError):
            return 0.0, 0.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
