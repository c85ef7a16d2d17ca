"""Entry point of one rank process: ``python -m hvd_magics.rank_main``.

The supervisor (:mod:`hvd_magics.rank_process`) writes the cloudpickled ``(main, kwargs)`` to this
process's stdin and reads structured events from the pipe named by ``HVD_MAGICS_EVENT_FD``. This
process needs no network access to the driver and holds no secret: the supervisor signs what it
forwards. Horovod's own environment (``HOROVOD_RANK``, rendezvous address, ...) is already set.
"""
from __future__ import annotations

import base64
import os
import sys
import threading
import time
import traceback

import cloudpickle

from hvd_magics import keras_progress, rank_events

#: Exit code of a rank whose supervisor went away (the job was stopped).
ORPHANED_EXIT = 113


def _watch_parent(parent_pid: int) -> None:
    """Exit at once if the supervisor dies (belt and braces beside PR_SET_PDEATHSIG)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(ORPHANED_EXIT)
        time.sleep(0.5)


def _format_exception(exc: BaseException) -> str:
    """The traceback, without the leading frames of hvd_magics itself (the user's code first)."""
    package = os.path.dirname(os.path.abspath(__file__))
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and os.path.dirname(
            os.path.abspath(tb.tb_frame.f_code.co_filename)) == package:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def main() -> None:
    """Run the shipped function and report its result or its exception."""
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    payload = sys.stdin.buffer.read()
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    rank_events.emit("started", pid=os.getpid())
    keras_progress.install()
    try:
        main_fn, kwargs = cloudpickle.loads(payload)
        value = main_fn(**kwargs)
        blob = base64.b64encode(cloudpickle.dumps(value)).decode() if rank == 0 else None
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the driver
        sys.stdout.flush()
        sys.stderr.flush()
        rank_events.emit("error", error=type(exc).__name__, message=str(exc)[:2000],
                         traceback=_format_exception(exc))
        rank_events.close()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    rank_events.emit("result", value=blob)
    rank_events.close()
    # Skip interpreter teardown: atexit hooks of frameworks can block when a peer is gone.
    os._exit(0)


if __name__ == "__main__":
    main()
