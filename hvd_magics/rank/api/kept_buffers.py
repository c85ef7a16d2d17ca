"""The shared memory a rank keeps steps in (:mod:`hvd_magics.rank.api.keeping`): a part's buffers,
mapped once and reused step after step, and the room its control group leaves."""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path

from hvd_magics.common.kept_steps import STEPS_KEPT


def room_left(path: Path) -> int | None:
    """Bytes the control group of this process may still grow by (``None``: no limit read)."""
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        most = (cgroup / "memory.max").read_text().strip()
        if most != "max":
            return int(most) - int((cgroup / "memory.current").read_text())
    return None


class PartBuffers:
    """This process's mappings of its parts' files, by ``(device, inode)``: the two buffers a
    part's steps take turns in, and the one being written."""

    def __init__(self) -> None:
        self.mappings: dict[tuple[int, int], mmap.mmap] = {}

    def take(self, path: Path, size: int) -> mmap.mmap:
        """A writable mapping of ``size`` bytes of the file ``path``: the one this process kept of
        it when it is the buffer of an older step of the same size (its pages mapped already: a
        fresh mapping of a step of 300 MB faulted 75,000 pages in, 75 ms a step), else a new one
        (the file's pages taken first, so that a host without room raises ``ENOSPC`` here, not
        ``SIGBUS`` in the copy)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            found = os.fstat(fd)
            kept = self.mappings.get((found.st_dev, found.st_ino))
            if kept is not None and len(kept) == size and found.st_size == size:
                return kept
            room = room_left(path)
            if room is not None and size > room + found.st_size:
                raise OSError(errno.ENOSPC, "the control group's memory limit")
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if kept is not None:
            kept.close()
        buffers = self.mappings
        buffers[(found.st_dev, found.st_ino)] = memory
        while len(buffers) > STEPS_KEPT + 1:  # a part's two and the one being written
            buffers.pop(next(iter(buffers))).close()
        return memory

    def forget(self, path: Path) -> None:
        """Unmap this process's mapping of ``path`` (a step's part about to be removed: its pages
        are freed only once nobody maps them)."""
        with contextlib.suppress(OSError):
            found = os.stat(path)
            memory = self.mappings.pop((found.st_dev, found.st_ino), None)
            if memory is not None:
                memory.close()
