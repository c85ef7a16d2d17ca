"""What the libraries' guards share: the errors they raise, the marks of their patches, and the
refusal of a library that would train its rank alone (the libraries' own modules beside this one
install the guards)."""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings
from collections.abc import Iterator
from types import FrameType

from hvd_magics.errors import HorovodMagicsWarning
from hvd_magics.protocol import ENGINE_TORCH
from hvd_magics.rank.rank_job import rank_job

#: The marks of the two kinds of guard patches (one method may carry both).
ALONE_MARK = "_hvd_magics_alone_guard"
LAUNCH_MARK = "_hvd_magics_launcher_guard"


class RunsAloneError(RuntimeError):
    """A library in a rank would train it alone while the job has several ranks."""


class LaunchMismatchError(RuntimeError):
    """A library in a rank would start its own processes, or plans other ranks than the job's."""


#: Whether the code running now said it is this rank's alone (:func:`alone`).
_ALONE = contextvars.ContextVar("hvd_magics_alone", default=False)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Say that the code inside is this rank's own, single-process work on purpose (a probe
    model, rank 0 predicting after training): the guards that refuse a library training this
    rank alone let it run. ::

        if rank == 0:
            with hvd_magics.alone():
                pl.Trainer(devices=1, accelerator="cpu").fit(probe, loader)

    Outside a rank of ours it changes nothing."""
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


def mine_alone() -> bool:
    """Whether the code running now is inside :func:`alone`."""
    return _ALONE.get()


def job_size() -> int:
    """The job's ranks (1 outside a rank of ours)."""
    return rank_job().size


def _engine_fix(library: str) -> str:
    engine = rank_job().engine
    if engine != ENGINE_TORCH:
        return (f"{library} joins a torch.distributed group, which only the torch engine's ranks "
                f"have. Fix: run the cell with --engine torch (engine='torch').")
    return (f"Fix: let {library} join the job's torch.distributed group (leave its device and "
            f"process settings at their defaults).")


def alone_message(library: str, processes: int) -> str | None:
    """Why ``library``, which counts ``processes`` processes, cannot run as this rank, or
    ``None`` when it counts the job's ranks."""
    size = job_size()
    if processes == size or size <= 1 or mine_alone():
        return None
    return (f"{library} runs this rank as {processes} process{'es' if processes != 1 else ''} "
            f"of its own while the job has {size} ranks: each rank would train a model of its "
            f"own on its own data. {_engine_fix(library)} {ALONE_FIX}")


#: How to say that single-process work is meant (every refusal ends with it).
ALONE_FIX = ("If this rank's own work is meant (a probe model, predicting on one rank), run it "
             "inside `with hvd_magics.alone():`.")


def in_a_job() -> bool:
    """Whether this process is a rank of ours (the guards change nothing elsewhere)."""
    return rank_job().in_a_job


#: hvd_magics' own folder (its frames are never the user's line).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def users_frame() -> FrameType | None:
    """The innermost frame of the user's code on the stack (a ``%%horovod`` cell, a function
    of the user's files), past hvd_magics' patches and the libraries' frames; ``None`` when
    the stack holds none."""
    from hvd_magics.rank.instruments.stack_report import frame_kind

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if frame_kind(filename) == "user" and (filename.startswith("<")
                                               or not os.path.abspath(filename).startswith(
                                                   _PACKAGE)):
            return frame
        frame = frame.f_back
    return None


def warn_at_users_line(message: str) -> None:
    """Warn ``message`` (a :class:`~hvd_magics.errors.HorovodMagicsWarning`) at the user's line
    that led here (:func:`users_frame`), as ``warnings.warn`` would with the right
    ``stacklevel``: the depth of our patches and of the library's calls between varies (two
    patches of one ``__init__``, a subclass's ``super().__init__``). Without a user's frame,
    at the caller's caller."""
    frame = users_frame() or sys._getframe(2)
    module_globals = frame.f_globals
    warnings.warn_explicit(message, HorovodMagicsWarning, frame.f_code.co_filename,
                           frame.f_lineno, str(module_globals.get("__name__", "<string>")),
                           module_globals.setdefault("__warningregistry__", {}),
                           module_globals)
