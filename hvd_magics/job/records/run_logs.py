"""Where each job's log folder goes on the driver, and how many are kept.

Every job writes ``<runs>/<job id>/ranks.log``; without a bound a long-lived notebook server fills
its ``/tmp`` (a chatty job's log is tens of megabytes). Before a job starts, the oldest folders
beyond the newest :data:`DEFAULT_KEEP_RUNS` (or ``HVD_MAGICS_KEEP_RUNS``) are removed.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from hvd_magics.protocol import ENV_KEEP_RUNS

#: How many run folders are kept when ``HVD_MAGICS_KEEP_RUNS`` is not set.
DEFAULT_KEEP_RUNS = 100

log = logging.getLogger(__name__)


def runs_dir() -> Path:
    """Where each job's log folder goes on the driver."""
    return Path(tempfile.gettempdir()) / "hvd_magics" / "runs"


def keep_runs() -> int:
    """How many run folders to keep: ``HVD_MAGICS_KEEP_RUNS`` when it is a whole number >= 1."""
    text = os.environ.get(ENV_KEEP_RUNS, "")
    try:
        value = int(text)
    except ValueError:
        if text:
            log.warning("%s=%r is not a whole number; keeping %d run folders", ENV_KEEP_RUNS,
                        text, DEFAULT_KEEP_RUNS)
        return DEFAULT_KEEP_RUNS
    return max(value, 1)


def prune_old_runs(root: Path | None = None, keep: int | None = None) -> list[Path]:
    """Remove the oldest run folders under ``root`` so that ``keep - 1`` remain (room for the job
    about to start); returns what was removed."""
    root = runs_dir() if root is None else root
    keep = keep_runs() if keep is None else keep
    try:
        folders = [entry for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    if len(folders) < keep:
        return []

    def age(entry: os.DirEntry) -> float:
        """When the run last wrote (its log grows while it runs; the folder's time does not)."""
        times = [0.0]
        for path in (entry.path, os.path.join(entry.path, "ranks.log")):
            try:
                times.append(os.stat(path, follow_symlinks=False).st_mtime)
            except OSError:
                continue
        return max(times)

    folders.sort(key=age)
    removed = []
    for entry in folders[:len(folders) - keep + 1]:
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed
