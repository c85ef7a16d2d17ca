"""A checkpoint's write that filled its folder's disk, said as such: DCP's own error holds each
rank's ``OSError`` in a ``CheckpointException`` (``CheckpointException ranks:dict_keys([0, 1])``,
its text says nothing of a disk), and the partly written step, left behind, kept the disk full
for the job's log and for the next save."""
from __future__ import annotations

import errno
import os
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


#: What a probe of the disk writes: a write that failed without saying why (PyTorch's file
#: writer: ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs
#: 598``) is taken for a full disk when this much more finds no room either.
PROBE_BYTES = 2 ** 20


def _probe(folder: Path) -> OSError | None:
    """The ``OSError`` of a full disk (or quota) that a write of :data:`PROBE_BYTES` into
    ``folder`` meets now, or ``None`` when it fits (or the folder cannot be written for
    another reason: that is not a full disk)."""
    probe = folder / f".disk-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc if exc.errno in _NO_ROOM else None
    try:
        left = PROBE_BYTES
        while left > 0:
            left -= os.write(fd, bytes(min(left, 2 ** 16)))
        os.fsync(fd)
    except OSError as exc:
        return exc if exc.errno in _NO_ROOM else None
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return None


def no_room(exc: BaseException, folder: Path | None = None) -> OSError | None:
    """The ``OSError`` of a full disk (or quota) that ``exc`` is or holds; else, given the
    ``folder`` written to, the one a probe of its disk meets now (PyTorch's writer says no
    errno); ``None`` when the disk is not full."""
    found = next((cause for cause in _causes(exc)
                  if isinstance(cause, OSError) and cause.errno in _NO_ROOM), None)
    if found is None and folder is not None and folder.is_dir():
        found = _probe(folder)
    return found


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
        f"did not fit ({room}{reached}{before}). The partly written step was removed; the "
        f"checkpoints before it stay whole. Fix: free room on that disk, give a folder on a "
        f"larger one: %%horovod --checkpoint-dir ... (HorovodRunner(checkpoint_dir=...)), "
        f"or keep fewer: checkpoint.save(state, step, keep=1)")
