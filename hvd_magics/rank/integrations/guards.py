"""What the libraries' guards share: the errors they raise, the marks of their patches, and the
refusal of a library that would train its rank alone (the libraries' own modules beside this one
install the guards)."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

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
