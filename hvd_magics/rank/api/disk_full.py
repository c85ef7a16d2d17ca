"""A checkpoint's write that filled its folder's disk, said as such: DCP's own error holds each
rank's ``OSError`` in a ``CheckpointException`` (``CheckpointException ranks:dict_keys([0, 1])``,
its text says nothing of a disk), and the partly written step, left behind, kept the disk full
for the job's log and for the next save."""
from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from hvd_magics.common.sizes import byte_size
from hvd_magics.errors import CheckpointDiskFull

#: The errors of a write that found no room: the disk is full, or the user's quota is.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT}


def _causes(exc: BaseException, depth: int = 0) -> Iterator[BaseException]:
    """``exc`` and what it holds: DCP's per-rank failures (``failures``: rank -> exception or
    (exception, traceback)), its cause and context."""
    if depth > 8:
        return
    yield exc
    failures = getattr(exc, "failures", None)
    held = list(failures.values()) if isinstance(failures, dict) else []
    held += [exc.__cause__, exc.__context__]
    for inner in held:
        inner = inner[0] if isinstance(inner, tuple) and inner else inner
        if isinstance(inner, BaseException):
            yield from _causes(inner, depth + 1)


def no_room(exc: BaseException) -> OSError | None:
    """The ``OSError`` of a full disk (or quota) that ``exc`` is or holds, or ``None``."""
    return next((cause for cause in _causes(exc)
                 if isinstance(cause, OSError) and cause.errno in _NO_ROOM), None)


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def disk_full(folder: Path, step: int, partial: Path | None,
              last_whole: Path | None) -> CheckpointDiskFull:
    """The error to raise once ``step``'s checkpoint did not fit: the folder, its disk's free
    space, what the last whole checkpoint takes and, given ``partial`` (what the ranks wrote
    of the step: one rank gives it, and it is removed here), how much of it was written."""
    reached = ""
    if partial is not None:
        reached = f"; {byte_size(_size_on_disk(partial))} of it was written before the disk filled"
        shutil.rmtree(partial, ignore_errors=True)
    try:
        usage = shutil.disk_usage(folder)
        room = f"{byte_size(usage.free)} free of {byte_size(usage.total)} once it was removed"
    except OSError:
        room = "its free space unknown"
    if last_whole is not None:
        before = (f"; the last whole checkpoint, {last_whole.name}, takes "
                  f"{byte_size(_size_on_disk(last_whole))}")
    else:
        before = "; no whole checkpoint is there yet"
    return CheckpointDiskFull(
        f"the disk of the checkpoint folder {folder} is full: the checkpoint of step {step:,} "
        f"did not fit ({room}{reached}{before}). The partly written step was removed; the checkpoints before it stay "
        f"whole. Fix: free room on that disk, give a folder on a larger one: %%horovod "
        f"--checkpoint-dir ... (HorovodRunner(checkpoint_dir=...)), or keep fewer: "
        f"checkpoint.save(state, step, keep=1)")
