"""What a warm pool's rank runs: cell after cell, each read from stdin, in one process.

A pool is a job whose function is :func:`serve_cells`. Each further frame on the rank's stdin
(:func:`hvd_magics.protocol.encode_job`) is a ``(main, kwargs)`` to run: a ``%%horovod`` cell (run
in :func:`hvd_magics.rank.cell_runner.rank_namespace`) or a function given to
:meth:`hvd_magics.HorovodPool.run`. Per cell the rank sends ``started``, then ``result`` (rank 0's
value) or ``error``, then prints :data:`hvd_magics.protocol.CELL_END_LINE`, which its supervisor
turns into ``cell_end`` after the cell's output. A cell's environment (``--env``, its shards) is its
own: what it set is undone when it ends. A cell that asks for Horovod Timeline gets one
(:mod:`hvd_magics.rank.instruments.cell_timeline`), sent before its result. The driver interrupts a
cell with ``SIGINT``; between cells the rank ignores it. The end of stdin ends the pool:
:func:`serve_cells` returns and the rank leaves Horovod as a cold job's rank does.
"""
from __future__ import annotations

import os
import signal
import sys

from hvd_magics.events import ResultEvent, StartedEvent
from hvd_magics.protocol import CELL_END_LINE, RESULT, STARTED, decode_job
from hvd_magics.rank.rank_job import rank_job
from hvd_magics.rank.instruments import cell_timeline
from hvd_magics.rank import rank_events, torch_group_hold
from hvd_magics.rank.module_reload import ModuleWatch


#: The user's modules this rank imported, reloaded when their files change.
_MODULES = ModuleWatch()


def look_at_imported() -> None:
    """Look at every module imported so far (a zygote's frameworks, before it forks ranks): a
    forked pool rank then looks only at the modules it imports itself, not again at the
    thousands its zygote imported (each a resolved path)."""
    _MODULES.remember()


def _reload_user_modules() -> None:
    """Reload the user's modules whose files changed since the rank imported them; rank 0 says
    so (raises what a module's new code raised)."""
    reloaded = _MODULES.reload_changed()
    if reloaded and rank_job().first:
        print(f"hvd_magics: reloaded {', '.join(reloaded)} on the pool's ranks (changed since "
              "they imported it; its module-level state starts again)", file=sys.stderr,
              flush=True)


def run_one(payload: bytes) -> None:
    """Run one cell's ``(main, kwargs)`` (interruptible); report its value (rank 0) or its error."""
    from hvd_magics.rank.rank_main import report_error, run_job

    rank_events.emit(StartedEvent(kind=STARTED, pid=os.getpid()))
    try:
        _reload_user_modules()
    except Exception as exc:  # noqa: BLE001 - the cell fails with it, as a cold import would
        report_error(exc)
        return
    with cell_timeline.recording():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            parts, failure, _ = run_job(payload)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch_group_hold.release()  # before the next cell can start a group on the same port
    if failure is not None:
        report_error(failure)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    rank_events.emit(ResultEvent(kind=RESULT, parts=parts))


def serve_cells() -> None:
    """The pool's job function: run every cell that arrives on stdin until stdin ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (frame := decode_job(sys.stdin.buffer)) is not None:
        late_env, payload = frame
        before = {name: os.environ.get(name) for name in (*late_env, *cell_timeline.SETS_ENV)}
        os.environ.update(late_env)
        try:
            run_one(payload)
        finally:
            _MODULES.remember()
            _restore_environ(before)
            sys.stdout.flush()
            sys.stderr.flush()
            print(CELL_END_LINE, flush=True)


def _restore_environ(before: dict[str, str | None]) -> None:
    """Put back the variables a cell's environment changed (``None``: it was not set)."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
