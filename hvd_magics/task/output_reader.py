"""A rank's output pipe read as lines, in linear time whatever the lines' lengths: each complete
line as it arrives, and a line still being written that holds a carriage return (a tqdm or Keras
progress bar) as a terminal shows it, at most every :data:`PARTIAL_INTERVAL_S`, so bars show
live."""
from __future__ import annotations

import os
import select
import time
from collections.abc import Callable

#: Least seconds between two partial lines (a progress bar redrawn in place).
PARTIAL_INTERVAL_S = 0.25
#: Most bytes of an unfinished line passed on as a partial line.
PARTIAL_MAX_BYTES = 4096


def read_output(fd: int, lines: Callable[[list[bytes]], None],
                partial: Callable[[str], None]) -> None:
    """Read ``fd`` until its end: ``lines(complete lines)`` as they arrive (without their
    newlines; the last, unfinished one at the end), ``partial(text)`` with what a terminal shows
    of an unfinished line that holds a carriage return."""
    pending: list[bytes] = []  # pieces of the unfinished line
    since_cr: bytes | None = None  # what a terminal shows of the unfinished line
    sent_partial, unsent = 0.0, False
    while True:
        wait = (max(PARTIAL_INTERVAL_S - (time.monotonic() - sent_partial), 0) if unsent
                else None)
        if not select.select([fd], [], [], wait)[0]:
            chunk = b""  # quiet for a while: show the bar as it stands
        elif not (chunk := os.read(fd, 65536)):
            break
        if b"\n" in chunk:
            head, *middle, tail = chunk.split(b"\n")
            lines([b"".join(pending) + head, *middle])
            pending, since_cr, unsent = ([tail] if tail else []), None, False
            chunk = tail
        elif chunk:
            pending.append(chunk)
        if b"\r" in chunk:
            since_cr, unsent = chunk.rsplit(b"\r", 1)[1], True
        elif chunk and since_cr is not None:
            if len(since_cr) < PARTIAL_MAX_BYTES:
                since_cr += chunk
            unsent = True
        if unsent and time.monotonic() - sent_partial >= PARTIAL_INTERVAL_S:
            assert since_cr is not None  # unsent is set only with the line it holds
            sent_partial, unsent = time.monotonic(), False
            partial(since_cr[:PARTIAL_MAX_BYTES].decode(errors="replace"))
    if pending:
        lines([b"".join(pending)])
