"""Rank-side writer of structured events (to the supervisor's pipe).

Inside a rank process, :func:`emit` writes one JSON line to the file descriptor named by
``HVD_MAGICS_EVENT_FD``. Outside one (a plain Python session), :func:`emit` does nothing, so code
that reports progress runs unchanged on a laptop.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import IO

from hvd_magics.events import RankEvent
from hvd_magics.protocol import ENV_EVENT_FD


_lock = threading.Lock()
_stream: IO[bytes] | None = None
_opened = False


def _pipe() -> IO[bytes] | None:
    global _stream, _opened
    if not _opened:
        _opened = True
        fd = os.environ.get(ENV_EVENT_FD)
        if fd:
            _stream = os.fdopen(int(fd), "wb", buffering=0)
    return _stream


def active() -> bool:
    """Whether this process is a rank started by hvd_magics."""
    return _pipe() is not None


def emit(event: RankEvent) -> None:
    """Send ``event`` (its record built by the caller: ``StartedEvent(kind=STARTED, pid=...)``)
    to the driver, stamped ``rtime`` (a no-op outside a rank process)."""
    stream = _pipe()
    if stream is None:
        return
    line = json.dumps({"kind": event["kind"], "rtime": time.time(), **event},
                      separators=(",", ":")).encode() + b"\n"
    with _lock:
        try:
            stream.write(line)
        except (BrokenPipeError, ValueError):
            pass


def close() -> None:
    """Close the pipe (the supervisor sees end of file)."""
    global _stream
    with _lock:
        if _stream is not None:
            _stream.close()
            _stream = None
