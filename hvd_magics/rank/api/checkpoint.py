"""Checkpoints for the job's own training loop, on every engine: two lines resume a job that
restarted (``--restarts``, ``HorovodRunner(restarts=N)``) or that runs again after the notebook
restarted::

    from hvd_magics import checkpoint
    found = checkpoint.latest()              # (state, step) or None, on every rank
    start = 0 if found is None else found[1] + 1
    ...
    checkpoint.save({"model": model.state_dict(), ...}, step)   # rank 0 writes; others skip

On spot or preemptible executors, save also when :func:`preempting` says the job's executors
are being taken away (:mod:`hvd_magics.rank.api.preemption`): that save ends the attempt on every
rank at the same step, and the next attempt resumes from it, redoing no step::

    if step % 500 == 0 or checkpoint.preempting():
        checkpoint.save(state, step)

Sharded training (FSDP2's ``fully_shard``, FSDP1, any model whose state each rank holds a part
of) saves through PyTorch's distributed checkpoint: give the model and the optimizer themselves
(or state dicts of sharded tensors), and every rank writes its part; ``latest`` reads it into the
job's state in place, on any number of ranks (:mod:`hvd_magics.rank.api.torch_dcp`)::

    state = {"model": model, "optimizer": optimizer, "step": 0}
    found = checkpoint.latest(state)         # loaded into model and optimizer, or None
    start = 0 if found is None else found[1] + 1
    ...
    checkpoint.save(state, step)             # on every rank: each writes its part

A DeepSpeed engine (ZeRO stages 1-3) saves through its own ``save_checkpoint``, every rank its
partition, put in place whole as the others are; values beside it in a dict come back with it
(:mod:`hvd_magics.rank.api.deepspeed_checkpoint`)::

    state = {"engine": engine, "epoch": 0}
    found = checkpoint.latest(state)         # loaded into the engine, or None
    ...
    checkpoint.save(state, step)             # on every rank

:func:`save` writes under a temporary name and renames it into place (a rename is atomic): a rank
killed while it saves leaves the previous checkpoint whole, never a torn one read as whole
(:mod:`hvd_magics.common.checkpoints` is the writer the estimator's fits use too). The folder is
the job's (:func:`directory`): one per cell or function, under the system's temporary folder on
the driver's machine by default; give ``checkpoint_dir=`` (``--checkpoint-dir``) a folder every
executor shares (a DBFS or NFS mount) on a cluster.

Every rank of an attempt resumes from the same checkpoint: the one the driver found newest when
the attempt started (``HVD_MAGICS_RESUME_STEP``), which rank 0's later saves do not remove
while the attempt runs, so a rank that starts late does not read a newer one. A rank whose
executor does not see the driver's folder (it is on each machine's own disk: the default
folder on a cluster of several hosts) fails at its first :func:`latest` or :func:`save`, before
it trains, naming the fix, rather than keep checkpoints of its own.
"""
from __future__ import annotations

import pickle
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvd_magics.common.checkpoints import (Position, checkpoint_at, folder_checkpoint,
                                           latest_checkpoint, partial_folder, publish_folder,
                                           write_checkpoint)
from hvd_magics.errors import (CheckpointFolderNotShared, CheckpointMismatch,
                               ShardedCheckpointNeedsState, ShardedStateRefused)
from hvd_magics.rank.api.disk_full import disk_full, no_room
from hvd_magics.rank.api.keeping import keep
from hvd_magics.rank.api.kept_restore import newest_kept, restore
from hvd_magics.rank.api.state_tree import load_into
from hvd_magics.rank.api.preemption import after_save, noticed, preempting
from hvd_magics.rank.api.deepspeed_checkpoint import TAG as DEEPSPEED_TAG
from hvd_magics.rank.api.deepspeed_checkpoint import engine_in, load_engine, save_engine
from hvd_magics.rank.api.torch_dcp import load as load_sharded
from hvd_magics.rank.api.torch_dcp import in_process_group, needs_dcp, save_in_background
from hvd_magics.rank.api.torch_dcp import save as save_sharded
from hvd_magics.rank.rank_job import rank_job
from hvd_magics.rank_names import rank_named

__all__ = ["NO_CHECKPOINT", "attempt", "directory", "keep", "latest", "preempting", "save",
           "shared_folder"]

#: What :func:`latest` gives when the attempt resumes from no checkpoint.
NO_CHECKPOINT = "none"
#: The folders this process found the driver's token in.
_seen: set[str] = set()


def directory() -> Path:
    """This job's checkpoint folder (what ``checkpoint_dir=`` or the job's name made it)."""
    return rank_job().checkpoint_dir


def attempt() -> int:
    """Which attempt of the job this is: 0 first, 1 after the first restart, ..."""
    return rank_job().attempt


def shared_folder() -> Path:
    """The job's checkpoint folder, once this rank has found in it the file the driver wrote
    there for this attempt (outside a job of ours: the folder as it is).

    Raises
    ------
    CheckpointFolderNotShared
        The rank's executor does not see the driver's folder.
    """
    folder = directory()
    job = rank_job()
    token = job.checkpoint_token
    if token is None or str(folder) in _seen:
        return folder
    if not (folder / token).is_file():
        raise CheckpointFolderNotShared(
            f"{rank_named(job.rank)} on {socket.gethostname()} does "
            f"not see the "
            f"job's checkpoint folder {folder} as the notebook's machine does (a folder of this "
            f"machine's own disk): each executor would keep checkpoints of its own, and after a "
            f"restart the ranks would resume from different steps. Fix: a folder that every "
            f"executor and the driver share: %%horovod --checkpoint-dir /dbfs/... "
            f"(HorovodRunner(checkpoint_dir=...)), an NFS mount, or S3/GCS/ABFS through a "
            f"mounted path.")
    _seen.add(str(folder))
    return folder


def notice_folder(library: str) -> Path:
    """Where ``library``'s integration saves on a preemption notice: ``<job folder>/<library>``
    (each checkpoint ``step-<global step>``, written under a name starting with ``.`` and
    renamed into place)."""
    return shared_folder() / library


def newest_saved_on_notice(library: str) -> Path | None:
    """On a later attempt, the newest checkpoint ``library``'s integration saved on a notice;
    ``None`` on the first attempt (nothing to resume from, and the folder is not looked at) or
    when there is none."""
    if not attempt():
        return None
    folder = notice_folder(library)
    found = [(notice_step(p), p) for p in folder.glob("step-*")] if folder.is_dir() else []
    return max(found)[1] if found else None


def notice_step(saved: Path) -> int:
    """The global step of a checkpoint saved on a notice (``step-<step>[.<extension>]``)."""
    return int(saved.name.split("-")[1].split(".")[0])


def _pinned() -> int | None:
    """The global step this attempt resumes from, which saves must keep (``None``: none)."""
    step = rank_job().resume_step
    return int(step) if step not in (None, NO_CHECKPOINT) else None


#: The classes of sharded tensors, by name, in ``torch.distributed``'s modules: each rank holds
#: its own part (FSDP2's parameters and optimizer state, FSDP1's sharded state dicts).
_SHARDED = {"DTensor", "ShardedTensor"}


def sharded_tensors(state: Any, where: str = "state") -> list[str]:
    """Where in ``state`` (dicts, lists and tuples, walked through) sharded tensors are, as
    ``state["model"]["0.weight"] (DTensor, this rank's part [32, 64] of [64, 64])``."""
    if isinstance(state, dict):
        return [found for key, value in state.items()
                for found in sharded_tensors(value, f"{where}[{key!r}]")]
    if isinstance(state, (list, tuple)):
        return [found for i, value in enumerate(state)
                for found in sharded_tensors(value, f"{where}[{i}]")]
    kind = next((c.__name__ for c in type(state).__mro__ if c.__name__ in _SHARDED
                 and c.__module__.startswith("torch.distributed")), None)
    if kind is None:
        return []
    local = getattr(state, "to_local", None) or getattr(state, "local_tensor", None)
    try:
        part = (f", this rank's part {list(local().shape)} of {list(state.shape)}"
                if local is not None else "")
    except Exception:  # noqa: BLE001 - the shapes only illustrate the error
        part = ""
    return [f"{where} ({kind}{part})"]


def _refuse_sharded_outside_a_dict(state: Any, found: list[str]) -> None:
    """Sharded tensors in a ``state`` that is not a dict: PyTorch's distributed checkpoint,
    which writes them, takes a dict of them."""
    more = f", and {len(found) - 1} more" if len(found) > 1 else ""
    raise ShardedStateRefused(
        f"checkpoint.save got sharded tensors: {found[0]}{more}, in a {type(state).__name__}. "
        f"Each rank writes its own part of them through PyTorch's distributed checkpoint, "
        f"which takes a dict. Fix: save a dict, on every rank: checkpoint.save({{'model': "
        f"model, 'optimizer': optimizer, 'step': step}}, step)")


def _mark() -> str:
    """What names this attempt's partly written sharded checkpoints (its driver's token)."""
    job = rank_job()
    return job.checkpoint_token or f"a{job.attempt}"


class _PendingSave:
    """A sharded save going on in the background (``save(..., asynchronous=True)``): its
    checkpoint is put in place once every rank's part is written; its error, if any, is raised
    by the next :func:`save` or :func:`wait`."""

    def __init__(self, future: Any, step: int) -> None:
        self.future, self.step = future, step
        self.error: BaseException | None = None
        self.done = threading.Event()


_pending: _PendingSave | None = None


def wait() -> None:
    """Wait until the background save (``save(..., asynchronous=True)``) is in place; raise
    its error. The rank waits for it by itself when the job's code returns."""
    global _pending
    pending, _pending = _pending, None
    if pending is None:
        return
    pending.done.wait()
    if pending.error is not None:
        raise pending.error


def _save_parts(write: Callable[[Path], Any], step: int, keep: int, folder: Path,
                asynchronous: bool = False) -> Path:
    """Every rank writes its part of the checkpoint of ``step`` by ``write(partial folder)`` (a
    collective that returns once every part is written; with ``asynchronous``, once the state
    is copied, giving a ``Future``); rank 0 then puts the folder in place (in the background
    when ``asynchronous``, once the future is done)."""
    global _pending
    wait()  # one save at a time: the one before is in place first
    position = Position(0, 0, int(step))
    mark, spare = _mark(), _pinned()
    partial = partial_folder(folder, position, mark)
    path = folder_checkpoint(folder, position)
    first = rank_job().first

    def publish() -> None:
        if first:
            publish_folder(folder, partial, position, mark, keep, spare=spare)

    def said(exc: BaseException) -> BaseException:
        """A full disk as such, the step's partial folder removed by rank 0; else ``exc``."""
        if no_room(exc, partial.parent) is None:
            return exc
        found = latest_checkpoint(folder)
        return disk_full(folder, step, partial if first else None,
                         found[1] if found else None)

    if not asynchronous:
        try:
            write(partial)
        except BaseException as exc:
            error = said(exc)
            if error is exc:
                raise
            raise error from None
        publish()
        return path
    pending = _PendingSave(write(partial), step)

    def finished(future: Any) -> None:
        try:
            future.result()
            publish()
        except BaseException as exc:  # noqa: BLE001 - raised by the next save or wait()
            pending.error = said(exc)
        finally:
            pending.done.set()

    pending.future.add_done_callback(finished)
    _pending = pending
    return path


def _save_engine(found: tuple[Any, dict[str, Any], str | None], step: int, keep: int,
                 folder: Path, asynchronous: bool) -> Path:
    """A DeepSpeed engine's checkpoint: every rank writes its ZeRO partition through the
    engine's ``save_checkpoint``, with the values beside it."""
    if asynchronous:
        raise ValueError(
            "checkpoint.save(..., asynchronous=True) writes PyTorch's distributed checkpoint in "
            "the background, and was given a DeepSpeed engine, which writes its own files. Fix: "
            "asynchronous=False (DeepSpeed's own asynchronous writer is set in its config: "
            "'checkpoint': {'writer': ...})")
    engine, others, _ = found
    return _save_parts(lambda partial: save_engine(engine, others, partial), step,
                       keep, folder)


def save(state: Any, step: int, keep: int = 2, asynchronous: bool = False) -> Path | None:
    """Write ``state`` as the checkpoint of ``step``, keeping the newest ``keep`` (and the one
    this attempt resumed from, which a peer may still be reading); its path.

    State that each rank holds a part of (a dict holding the job's modules and optimizers
    themselves, or sharded tensors: FSDP's DTensors, ShardedTensors) is written by every rank,
    its own part, through PyTorch's distributed checkpoint; call it on every rank. Other state
    (anything pickle takes: state dicts, arrays, numbers) is written by rank 0; ``None`` on
    the other ranks. Either way a checkpoint is whole or absent: it is renamed into place once
    written.

    A DeepSpeed engine (or a dict holding one, with plain values beside it) is written by every
    rank through the engine's ``save_checkpoint``: each rank its ZeRO partition, DeepSpeed's
    own files (in ``deepspeed/`` of the checkpoint's folder), the other values as its
    ``client_state``; call it on every rank.

    A dict of modules and optimizers outside a ``torch.distributed`` process group (Horovod's
    ranks: each holds them whole) is written by rank 0 alone, through the same distributed
    checkpoint; ``None`` on the other ranks.

    ``asynchronous=True`` (sharded state only) returns once the state is copied to this
    host's memory, and writes it while training goes on; the checkpoint is in place once every
    rank's part is written. The next save, :func:`wait`, the end of the job's code and a
    preemption notice wait for it.

    Raises
    ------
    ShardedStateRefused
        On every rank, sharded tensors in a ``state`` that is not a dict; nothing is written.
    CheckpointFolderNotShared
        The rank's executor does not see the driver's folder (:func:`shared_folder`).
    Preempted
        On every rank, once saved, when :func:`preempting` said ``True``: the attempt ends
        here, and the next one resumes from this checkpoint.
    """
    found = sharded_tensors(state)
    if found and not isinstance(state, dict):
        _refuse_sharded_outside_a_dict(state, found)
    folder = shared_folder()
    engine = engine_in(state)
    dcp = engine is None and isinstance(state, dict) and needs_dcp(state, found)
    if dcp and not found and not in_process_group() and not rank_job().first:
        after_save(step)  # whole modules on every rank, no process group: rank 0 writes them
        return None
    if engine is not None or dcp:
        path: Path | None = (
            _save_engine(engine, step, keep, folder, asynchronous) if engine is not None
            else _save_parts(lambda partial: (save_in_background if asynchronous
                                              else save_sharded)(state, partial),
                             step, keep, folder, asynchronous))
        if noticed():
            wait()  # the attempt ends at this save: it is whole first
        after_save(step)
        return path
    if not rank_job().first:
        after_save(step)
        return None

    def write(path: Path) -> None:
        with open(path, "wb") as out:
            pickle.dump(state, out, protocol=4)

    try:
        path = write_checkpoint(folder, Position(0, 0, int(step)), "pkl", write, keep,
                                spare=_pinned())
    except OSError as exc:
        if no_room(exc) is None:
            raise
        whole = latest_checkpoint(folder)
        raise disk_full(folder, step, None, whole[1] if whole else None) from None
    after_save(step)
    return path


def latest(state: Any = None, strict: bool = True) -> tuple[Any, int] | None:
    """``(state, step)`` of the checkpoint this attempt resumes from, the same on every rank:
    the newest whole one when the attempt started (outside a job of ours: the newest now);
    ``None`` when there was none.

    A sharded checkpoint is read into ``state``, the job's current state as it saves it (its
    modules and optimizers themselves, an optimizer also before its first step; tensors are
    copied into, other values replaced), on any number of ranks: each reads the part its
    sharding holds. It returns ``(state, step)``; call it on every rank. A DeepSpeed engine's
    checkpoint is read into the engine given (or the dict holding it, whose other values are
    replaced), on the number of ranks that wrote it. A checkpoint rank 0 wrote alone is
    returned as it was saved when no ``state`` is given; given one, it is loaded into it (a
    state dict saved where ``state`` holds its module or optimizer is loaded into that, every
    other entry of a dict replaced) and ``(state, step)`` returned. A step kept in the hosts'
    memory (:func:`keep`) is read the same way, from this host's memory or a peer's.

    Raises
    ------
    ShardedCheckpointNeedsState
        The checkpoint is sharded and no ``state`` was given to read it into.
    CheckpointMismatch
        The checkpoint does not fit ``state`` (another model or shape, entries it has no
        place for; a DeepSpeed engine's read without one, or on another number of ranks).
    CheckpointFolderNotShared
        The rank's executor does not see the driver's folder (:func:`shared_folder`).
    """
    folder = shared_folder()
    job = rank_job()
    if job.resume_step == NO_CHECKPOINT:
        return None
    pinned = _pinned()
    if pinned is not None and job.resume_from == "memory":
        return restore(state, pinned)
    found = latest_checkpoint(folder) if pinned is None else checkpoint_at(folder, pinned)
    kept = newest_kept() if job.resume_step is None else None
    if kept is not None and (found is None or kept >= found[0].global_step):
        return restore(state, kept)  # outside a job of ours: this host's newest, if newer
    if found is None:
        if pinned is not None:
            raise FileNotFoundError(
                f"the checkpoint of step {pinned:,} that this attempt resumes from is gone from "
                f"{folder} (removed while the job ran); every rank must resume from one step. "
                f"Fix: run the job again (--fresh starts over)")
        return None
    if found[1].is_dir():  # every rank's part (PyTorch's distributed checkpoint)
        if state is None:
            raise ShardedCheckpointNeedsState(
                f"the checkpoint of step {found[0].global_step:,} in {folder} is sharded (each "
                f"rank wrote its part), and is read into the job's state, which latest() was not "
                f"given. Fix: give it the state as the job saves it, on every rank: "
                f"checkpoint.latest({{'model': model, 'optimizer': optimizer, 'step': 0}}), or "
                f"a DeepSpeed engine: checkpoint.latest(engine)")
        engine = engine_in(state)
        if engine is not None:
            saved = load_engine(engine[0], found[1])
            if engine[2] is None:
                return engine[0], found[0].global_step
            # the dict's own values only (DeepSpeed adds its metadata's keys to what it gives)
            state.update({key: saved[key] for key in engine[1] if key in saved})
            return state, found[0].global_step
        if (found[1] / DEEPSPEED_TAG).is_dir():
            raise CheckpointMismatch(
                f"the checkpoint {found[1]} was written from a DeepSpeed engine, and latest() "
                f"was given no engine. Fix: give it the engine, on every rank: "
                f"checkpoint.latest(engine) (or the dict it was saved as, with the engine in it)")
        load_sharded(state, found[1], strict)
        return state, found[0].global_step
    with open(found[1], "rb") as handle:
        saved = pickle.load(handle)
    if state is None:
        return saved, found[0].global_step
    return load_into(state, saved), found[0].global_step  # its modules' and optimizers' too
