"""Checkpoints for the job's own training loop, on every engine: two lines resume a job that
restarted (``--restarts``, ``HorovodRunner(restarts=N)``) or that runs again after the notebook
restarted::

    from hvd_magics import checkpoint
    found = checkpoint.latest()              # (state, step) or None, on every rank
    start = 0 if found is None else found[1] + 1
    ...
    checkpoint.save({"model": model.state_dict(), ...}, step)   # rank 0 writes; others skip

:func:`save` writes under a temporary name and renames it into place (a rename is atomic): a rank
killed while it saves leaves the previous checkpoint whole, never a torn one read as whole
(:mod:`hvd_magics.rank.checkpoints` is the writer the estimator's fits use too). The folder is
the job's (:func:`directory`): one per cell or function, under the system's temporary folder on
the driver's machine by default; give ``checkpoint_dir=`` (``--checkpoint-dir``) a folder every
executor shares (a DBFS or NFS mount) on a cluster.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from hvd_magics.protocol import ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_RANK
from hvd_magics.rank.checkpoints import Position, latest_checkpoint, write_checkpoint


def directory() -> Path:
    """This job's checkpoint folder (what ``checkpoint_dir=`` or the job's name made it)."""
    return Path(os.environ.get(ENV_CHECKPOINT_DIR) or
                Path(tempfile.gettempdir()) / "hvd_magics" / "checkpoints" / "default")


def attempt() -> int:
    """Which attempt of the job this is: 0 first, 1 after the first restart, ..."""
    return int(os.environ.get(ENV_ATTEMPT, "0") or 0)


def save(state: Any, step: int, keep: int = 2) -> Path | None:
    """On rank 0, write ``state`` (anything pickle takes: state dicts, arrays, numbers) as the
    checkpoint of ``step``, keeping the newest ``keep``; its path. ``None`` on other ranks."""
    if os.environ.get(ENV_RANK, "0") != "0":
        return None

    def write(path: Path) -> None:
        with open(path, "wb") as out:
            pickle.dump(state, out, protocol=4)

    return write_checkpoint(directory(), Position(0, 0, int(step)), "pkl", write, keep)


def latest() -> tuple[Any, int] | None:
    """``(state, step)`` of the newest whole checkpoint of this job, or ``None``."""
    found = latest_checkpoint(directory())
    if found is None:
        return None
    with open(found[1], "rb") as handle:
        return pickle.load(handle), found[0].global_step
