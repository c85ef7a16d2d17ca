"""Horovod Timeline for one cell of a warm pool: started before the cell, stopped after it.

A cold job's rank 0 records its timeline from ``hvd.init()`` (``HOROVOD_TIMELINE`` names the file)
until it exits; its supervisor then sends the file back. A pool's ranks outlive their cells, so
they start with ``HOROVOD_TIMELINE=DYNAMIC``: Horovod records nothing then, but lets
``hvd.start_timeline`` begin a file later (without it, ``start_timeline`` refuses). A cell that
asks for a timeline (``HVD_MAGICS_TIMELINE`` in its environment) gets one recorded around it
(:func:`recording`): started in every Horovod framework the rank has initialised, or, when the
cell is the one that calls ``hvd.init()``, named in ``HOROVOD_TIMELINE`` for that init; stopped
when the cell ends; rank 0 (Horovod's coordinator, the only rank that writes one) then sends its
file as ``timeline_chunk`` events before the cell's result.
"""
from __future__ import annotations

import base64
import contextlib
import os
import sys
import tempfile
import uuid
from typing import Any
from collections.abc import Iterator

from hvd_magics.events import TimelineChunkEvent
from hvd_magics.protocol import (ENV_HOROVOD_TIMELINE, ENV_TIMELINE_MARK_CYCLES, ENV_WANT_TIMELINE,
                                 TIMELINE_CHUNK)
from hvd_magics.notices import say
from hvd_magics.rank import rank_events
from hvd_magics.rank.rank_job import rank_job

#: Bytes of the trace per ``timeline_chunk`` event (before base64).
TIMELINE_CHUNK_BYTES = 1 << 20

#: The variables :func:`recording` may set for the cell's ``hvd.init()``: its caller puts them
#: back when the cell ends.
SETS_ENV = (ENV_HOROVOD_TIMELINE, ENV_TIMELINE_MARK_CYCLES)

#: The Horovod modules whose library may be initialised in a rank (each has its own).
HOROVOD_FRAMEWORKS = ("horovod.tensorflow", "horovod.torch")


def timeline_chunks(path: str) -> Iterator[str]:
    """The trace at ``path`` as base64 text, a ``timeline_chunk`` event's ``data`` at a time."""
    with open(path, "rb") as fh:
        while chunk := fh.read(TIMELINE_CHUNK_BYTES):
            yield base64.b64encode(chunk).decode()


def _initialised_horovod() -> list[Any]:
    """Each Horovod framework module this process imported and initialised."""
    found = []
    for name in HOROVOD_FRAMEWORKS:
        module = sys.modules.get(name)
        try:
            if module is not None and module.is_initialized():
                found.append(module)
        except (AttributeError, ValueError):
            continue
    return found


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record a Horovod Timeline around the block when the cell's environment asks for one."""
    if not os.environ.pop(ENV_WANT_TIMELINE, None):
        yield
        return
    mark_cycles = os.environ.pop(ENV_TIMELINE_MARK_CYCLES, "") == "1"
    folder = rank_job().tmpdir or tempfile.gettempdir()
    path = os.path.join(folder, f"timeline-{uuid.uuid4().hex}.json")
    started = _initialised_horovod()
    for module in started:
        try:
            module.start_timeline(path, mark_cycles=mark_cycles)
        except ValueError as exc:  # HOROVOD_TIMELINE was not DYNAMIC (or a path) at hvd.init()
            say(f"no timeline for this cell: {exc}")
    if not started:  # the cell's own hvd.init() opens it
        os.environ[ENV_HOROVOD_TIMELINE] = path
        if mark_cycles:
            os.environ[ENV_TIMELINE_MARK_CYCLES] = "1"
    try:
        yield
    finally:
        for module in _initialised_horovod():
            with contextlib.suppress(ValueError):
                module.stop_timeline()  # returns once the file is closed
        _send(path)


def _send(path: str) -> None:
    """Send the trace rank 0 wrote (other ranks wrote none), then delete it."""
    if not os.path.exists(path):
        return
    try:
        for data in timeline_chunks(path):
            rank_events.emit(TimelineChunkEvent(kind=TIMELINE_CHUNK, data=data))
    except OSError as exc:
        say(f"could not send the timeline: {exc}")
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
