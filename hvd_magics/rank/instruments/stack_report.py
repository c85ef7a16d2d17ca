"""Where a rank is: its Python stacks, taken while it runs, without stopping it.

The supervisor writes a request id, one line, to the pipe named by ``HVD_MAGICS_CONTROL_FD``; a
thread of the rank (:func:`serve`) answers each with a ``stacks`` event (a line that begins
with :data:`~hvd_magics.protocol.PREEMPT_LINE` is a preemption notice instead, handed to
whoever serves: the rank gives :func:`hvd_magics.rank.api.preemption.on_order`): every thread's
frames
from :func:`sys._current_frames`, hvd_magics' own frames left out, each frame marked ``user``
(the cell, the user's files) or ``library`` (the standard library and installed packages). The
thread needs the GIL for a moment, which a rank waiting in a Horovod collective, in ``sleep`` or
in I/O does not hold; a rank stuck in native code that holds it does not answer (the driver says
so after its wait).
"""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from types import FrameType
from typing import Any
from collections.abc import Callable

from hvd_magics.events import StacksEvent, ThreadStack
from hvd_magics.protocol import ENV_CONTROL_FD, PREEMPT_LINE, STACKS
from hvd_magics.rank.instruments import ddp_watch
from hvd_magics.rank import rank_events

#: Most frames reported per thread (the innermost ones).
MAX_FRAMES = 40
#: Name of the thread that answers (left out of its own answers).
SERVER_THREAD = "hvd-stacks"

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"], sys.base_prefix, sys.prefix)}, key=len, reverse=True))


def frame_kind(filename: str) -> str:
    """``"own"`` (hvd_magics), ``"library"`` (standard library, installed packages, frozen
    modules) or ``"user"`` (a cell, the user's files)."""
    if filename.startswith("<"):
        return "user" if filename.startswith(("<%%horovod", "<ipython-input", "<stdin")) \
            else "library"
    path = os.path.realpath(filename)
    if path.startswith(_OWN + os.sep) and "site-packages" not in path[len(_OWN):]:
        return "own"
    return "library" if path.startswith(_LIBRARY) else "user"


def _frames(frame: FrameType | None) -> list[list[Any]]:
    stack = []
    while frame is not None:
        code = frame.f_code
        kind = frame_kind(code.co_filename)
        if kind != "own" and not code.co_filename.startswith("<frozen"):
            line = frame.f_lineno or 0
            text = linecache.getline(code.co_filename, line, frame.f_globals).strip()
            stack.append([code.co_filename, line, code.co_name, text, kind])
        frame = frame.f_back
    stack.reverse()
    return stack[-MAX_FRAMES:]


def current_stacks() -> tuple[list[ThreadStack], int]:
    """Every thread's stack but this one's (main thread first); threads with no user frame
    besides the main thread are only counted."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    threads: list[ThreadStack] = []
    others = 0
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        frames = _frames(frame)
        if ident != main and not any(f[4] == "user" for f in frames):
            others += 1
            continue
        threads.append(ThreadStack(name=names.get(ident, f"thread {ident}"), main=ident == main,
                                   frames=frames))
    threads.sort(key=lambda t: not t["main"])
    return threads, others


def _answer(stream: Any, on_notice: Callable[[str], None]) -> None:
    for line in stream:
        request = line.decode(errors="replace").strip()
        if request.startswith(PREEMPT_LINE):  # the pipe's other use: a preemption notice
            on_notice(request.removeprefix(PREEMPT_LINE))
        elif request:
            threads, others = current_stacks()
            rank_events.emit(StacksEvent(kind=STACKS, request=request, threads=threads,
                                         others=others, ddp=ddp_watch.state()))


def serve(on_notice: Callable[[str], None]) -> None:
    """Answer the supervisor's stack requests from a daemon thread, and pass a preemption
    notice's JSON to ``on_notice`` (no-op without the pipe)."""
    fd = os.environ.pop(ENV_CONTROL_FD, None)
    if not fd:
        return
    stream = os.fdopen(int(fd), "rb", buffering=0)
    threading.Thread(target=_answer, args=(stream, on_notice), name=SERVER_THREAD,
                     daemon=True).start()
