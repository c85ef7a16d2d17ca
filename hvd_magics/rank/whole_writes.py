"""A rank's ``sys.stdout`` and ``sys.stderr`` write everything they are given, signals or not.

Ranks run unbuffered (``python -u``), where ``sys.stdout`` is a text layer straight over the
file descriptor, and that layer ignores how much one ``write(2)`` wrote. A write to the output
pipe blocks while the pipe is full (64 KiB), and a signal handled in Python meanwhile (PyTorch's
``SIGCHLD`` handler for its DataLoader workers, a user's own) ends that write early: the rest of
the text was dropped without a word (a 40 MB line arrived as its first 64 KiB). Here each write
goes on until every byte is written; the streams stay unbuffered and keep their encoding.
"""
from __future__ import annotations

import io
import os
import sys


class WholeWriter(io.RawIOBase):
    """A raw writer on file descriptor ``fd`` whose :meth:`write` returns only once every byte
    is written (a write a signal cut short goes on with the rest)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data) -> int:  # noqa: ANN001 - any bytes-like object
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        return done


def install() -> None:
    """Put whole-writing streams in place of ``sys.stdout`` and ``sys.stderr`` (same file
    descriptors, encoding and error handling; unbuffered, as ``-u`` made them)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # not a file (replaced by the user's code): left alone
        setattr(sys, name, io.TextIOWrapper(
            WholeWriter(fd), encoding=stream.encoding, errors=stream.errors,
            line_buffering=False, write_through=True))
