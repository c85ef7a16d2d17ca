"""The job's log file (``ranks.log``), which a full disk does not empty: a line that finds no
room waits in memory and is written once there is room again (a checkpoint's partly written step
removed, say), at the latest when the log is closed. A buffered file lost its buffer at the
failed flush, and its error reached the event loop that wrote the line."""
from __future__ import annotations

import os
from pathlib import Path

#: The most that waits in memory for room on the disk; past it the oldest lines go.
WAITING_BOUND = 16 * 2 ** 20


class JobLog:
    """Lines appended to ``path``, each written at once, none lost to a passing full disk.

    Parameters
    ----------
    path : Path
        The log file, created (with its folder) or appended to.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._waiting = bytearray()
        #: Bytes dropped because more than :data:`WAITING_BOUND` waited for room.
        self.dropped = 0

    def write(self, text: str) -> None:
        """Append ``text``; what the disk has no room for waits for the next write."""
        self._waiting += text.encode("utf-8", "replace")
        self._flush()
        if len(self._waiting) > WAITING_BOUND:  # no room for a while: the oldest go
            cut = len(self._waiting) - WAITING_BOUND
            self.dropped += cut
            del self._waiting[:cut]

    def _flush(self) -> None:
        while self._waiting and self._fd is not None:
            try:
                written = os.write(self._fd, self._waiting)
            except OSError:
                return  # no room (or the disk failed): it waits for the next write
            del self._waiting[:written]

    @property
    def waiting(self) -> int:
        """Bytes not written yet for want of room."""
        return len(self._waiting)

    def close(self) -> None:
        """Write what waits if there is room now, and close the file."""
        self._flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
