"""Checkpoints in a model directory, written so that a stopped fit leaves the last one whole.

A checkpoint is one file, ``checkpoints/ckpt-<global step>-e<epoch>-s<step>.<ext>``: it is written
under a temporary name and renamed into place (a rename is atomic), then ``checkpoints/latest.json``
is replaced the same way. A fit killed at any moment leaves every ``ckpt-*`` file complete, and
:func:`latest_checkpoint` finds the newest even when ``latest.json`` is behind.

A sharded checkpoint (every rank's part, PyTorch's distributed checkpoint) is a folder,
``ckpt-<...>.dcp``: the ranks write it as ``.ckpt-<...>.dcp.partial-<attempt's mark>``, and once
all have, it is renamed into place the same way (:func:`publish_folder`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable

from hvd_magics.common.process_group import alive

CHECKPOINT_FOLDER = "checkpoints"
LATEST_FILE = "latest.json"
_NAME = re.compile(r"^ckpt-(\d+)-e(\d+)-s(\d+)\.(\w+)$")


@dataclass(frozen=True)
class Position:
    """Where training stands: ``epoch`` (0-based) is the epoch in progress, ``step`` the batches
    of it already done, ``global_step`` the optimizer steps since the first fit."""

    epoch: int = 0
    step: int = 0
    global_step: int = 0


def checkpoint_folder(model_dir: str | os.PathLike) -> Path:
    return Path(model_dir) / CHECKPOINT_FOLDER


#: What a temporary file is named after: this machine and process (``.<name>.tmp-<host>-<pid>``).
_TEMPORARY = re.compile(r"^\..+\.tmp-(?P<host>.+)-(?P<pid>\d+)$")


def _temporary_mark() -> str:
    return f"tmp-{socket.gethostname()}-{os.getpid()}"


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files that writers of this machine left when they were killed
    mid-write (their process is gone); return them. A live writer's, or another machine's
    (a shared folder), stay."""
    host, gone = socket.gethostname(), []
    for path in folder.glob(".*.tmp-*") if folder.is_dir() else ():
        match = _TEMPORARY.match(path.name)
        if match and match["host"] == host and not alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            gone.append(path)
    return gone


def _replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    temporary = path.with_name(f".{path.name}.{_temporary_mark()}")
    try:
        write(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_checkpoint(model_dir: str | os.PathLike, position: Position, extension: str,
                     save: Callable[[Path], None], keep: int = 3,
                     spare: int | None = None) -> Path:
    """Write one checkpoint with ``save(path)``, point ``latest.json`` at it, keep the newest
    ``keep`` (and the one of global step ``spare``); return its path. An exception in
    ``save`` leaves the folder as it was."""
    folder = checkpoint_folder(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder)
    path = folder / f"ckpt-{position.global_step}-e{position.epoch}-s{position.step}.{extension}"
    _replace_atomically(path, save)
    _replace_atomically(folder / LATEST_FILE, lambda p: p.write_text(
        json.dumps({"file": path.name, **asdict(position)})))
    _prune(folder, keep, spare)
    return path


def _remove(path: Path) -> None:
    """Remove a checkpoint: a file, or a sharded checkpoint's folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _prune(folder: Path, keep: int, spare: int | None) -> None:
    """Keep the newest ``keep`` checkpoints (and the one of global step ``spare``)."""
    for old in _complete(folder)[keep:]:
        if old[0].global_step != spare:
            _remove(old[1])


#: A sharded checkpoint's folder while its ranks write it.
_PARTIAL = re.compile(r"^\.ckpt-.+\.dcp\.partial-(?P<mark>.+)$")


def partial_folder(model_dir: str | os.PathLike, position: Position, mark: str) -> Path:
    """Where the ranks of one attempt (``mark``) write the sharded checkpoint of ``position``
    until it is whole; made, with the checkpoints' folder."""
    folder = checkpoint_folder(model_dir)
    partial = folder / (f".ckpt-{position.global_step}-e{position.epoch}-s{position.step}.dcp"
                        f".partial-{mark}")
    partial.mkdir(parents=True, exist_ok=True)
    return partial


def folder_checkpoint(model_dir: str | os.PathLike, position: Position) -> Path:
    """Where the sharded checkpoint of ``position`` stands once whole."""
    return (checkpoint_folder(model_dir)
            / f"ckpt-{position.global_step}-e{position.epoch}-s{position.step}.dcp")


def publish_folder(model_dir: str | os.PathLike, partial: Path, position: Position, mark: str,
                   keep: int = 2, spare: int | None = None) -> Path:
    """Once every rank wrote its part into ``partial``, rename it into place as the sharded
    checkpoint of ``position``, point ``latest.json`` at it, keep the newest ``keep`` (and the
    one of ``spare``) and remove what other attempts left partly written; its path. Called by
    one rank."""
    folder = checkpoint_folder(model_dir)
    path = folder_checkpoint(model_dir, position)
    if path.exists():  # the same step saved again: the older one goes, then the new one in
        _remove(path)
    os.replace(partial, path)
    _replace_atomically(folder / LATEST_FILE, lambda p: p.write_text(
        json.dumps({"file": path.name, **asdict(position)})))
    _prune(folder, keep, spare)
    for left in folder.glob(".ckpt-*.dcp.partial-*"):
        match = _PARTIAL.match(left.name)
        if match and match["mark"] != mark:
            shutil.rmtree(left, ignore_errors=True)
    return path


def _complete(folder: Path) -> list[tuple[Position, Path]]:
    """Every complete checkpoint, newest first."""
    found = []
    for path in folder.glob("ckpt-*"):
        match = _NAME.match(path.name)
        if match:
            global_step, epoch, step = (int(match.group(i)) for i in (1, 2, 3))
            found.append((Position(epoch, step, global_step), path))
    return sorted(found, key=lambda item: item[0].global_step, reverse=True)


def checkpoint_at(model_dir: str | os.PathLike, global_step: int) -> tuple[Position, Path] | None:
    """The complete checkpoint of ``global_step`` in ``model_dir``, or ``None``."""
    folder = checkpoint_folder(model_dir)
    found = _complete(folder) if folder.is_dir() else []
    return next((item for item in found if item[0].global_step == global_step), None)


def latest_checkpoint(model_dir: str | os.PathLike | None) -> tuple[Position, Path] | None:
    """The newest complete checkpoint in ``model_dir`` and where it stands, or ``None``."""
    if model_dir is None:
        return None
    folder = checkpoint_folder(model_dir)
    try:
        latest = json.loads((folder / LATEST_FILE).read_text())
        path = folder / latest["file"]
        if path.exists():
            return Position(latest["epoch"], latest["step"], latest["global_step"]), path
    except (OSError, ValueError, KeyError):
        pass
    found = _complete(folder) if folder.is_dir() else []
    return found[0] if found else None


def epoch_plan(position: Position, steps_per_epoch: int, epochs: int,
               max_steps: int | None) -> list[tuple[int, int, int]]:
    """The ``(epoch, first step, steps)`` still to run from ``position`` to ``epochs`` epochs of
    ``steps_per_epoch`` steps, or to ``max_steps`` optimizer steps in all if that comes first."""
    plan = []
    global_step = position.global_step
    for epoch in range(position.epoch, epochs):
        first = min(position.step, steps_per_epoch) if epoch == position.epoch else 0
        steps = steps_per_epoch - first
        if max_steps is not None:
            steps = min(steps, max_steps - global_step)
        if steps <= 0:
            break
        plan.append((epoch, first, steps))
        global_step += steps
    return plan
