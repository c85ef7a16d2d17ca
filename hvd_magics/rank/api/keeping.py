"""Every step's state kept in the hosts' memory (``checkpoint.keep``), so that a rank killed without
notice (the OOM killer, a segfault, a lost host) costs at most the step under way::

    state = {"model": model, "optimizer": optimizer, "epoch": epoch}
    found = checkpoint.latest(state)          # from memory when that is newest, else a file
    start = 0 if found is None else found[1] + 1
    for step in range(start, steps):
        ...forward, backward, optimizer.step()...
        checkpoint.keep(state, step)          # a copy into this host's memory
        if step % 500 == 0:
            checkpoint.save(state, step)      # the durable copy, on the shared folder

The state is replicated (DDP, Horovod: every rank holds it whole), so each host keeps it once,
written by its first rank; a host lost takes nothing the others do not hold. ``keep`` copies
tensors into a file in the host's shared memory (:mod:`hvd_magics.common.kept_steps`): a
module's buffers and plain tensors before it returns, its parameters and its optimizer's state
while the next step's forward and backward run (they change only in the optimizer's step, which
waits for the copy). The part is renamed into place once whole, and the rank tells the driver
(a ``kept`` event), which resumes the next attempt from the newest step every host holds when
that is newer than the newest file.

A host whose shared memory (or control group) has no room for a step says so once, and the job
goes on: ``keep`` then does nothing, and restarts resume from files.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvd_magics.common.step_keeper_wire import digest
from hvd_magics.common.kept_steps import (STEPS_KEPT, PartName, job_folder, keep_root, layout,
                                          older_parts, write_header)
from hvd_magics.errors import KeepRefused
from hvd_magics.events import KeptEvent
from hvd_magics.protocol import (ENV_HOST_RANK, ENV_KEEP_JOB, ENV_KEEP_SECRET,
                                 ENV_RANK_HOST, KEPT)
from hvd_magics.rank import rank_events
from hvd_magics.rank.api.kept_buffers import PartBuffers
from hvd_magics.rank.api.kept_peers import PeerRing
from hvd_magics.rank.api.state_tree import Leaf, copy_leaf, flatten
from hvd_magics.rank.rank_job import rank_job
from hvd_magics.rank.step_keeper import ensure_keeper


@dataclass
class _Copy:
    """A part being copied: its buffer, the leaves still to copy, and where it goes once whole."""

    name: PartName
    temporary: Path
    memory: mmap.mmap
    leaves: list[Leaf]
    nbytes: int
    began: float
    error: BaseException | None = None
    #: A CUDA event the copy from a GPU waits for (``None``: the leaves are in host memory).
    ready: Any = None


class _Keeper:
    """This rank's side of keeping: the copy under way and the host's keeper's address."""

    def __init__(self) -> None:
        self.pending: _Copy | None = None
        self.done = threading.Event()
        self.done.set()
        self.keeper: str | None = None
        #: Whether a thread is starting the host's keeper (or finding it).
        self.starting = False
        #: The last ``kept`` event sent (said again once the keeper's address is known).
        self.last_said: KeptEvent | None = None
        self.without_room = False
        self.said_not_kept = False
        #: The job's folder this process made (and marked with the secret) already.
        self.made: Path | None = None
        self.buffers = PartBuffers()
        self.ring = PeerRing()
        #: Seconds the loop waited for copies since the last ``kept`` event said so.
        self.stalled = 0.0
        self.lock = threading.Lock()


_keeper = _Keeper()


def job_key() -> tuple[str, str]:
    """This job's key among kept steps and its secret (the driver's; outside a job of ours, one
    per checkpoint folder)."""
    job = rank_job()
    key = os.environ.get(ENV_KEEP_JOB)
    if key:
        return key, os.environ.get(ENV_KEEP_SECRET, "")
    return digest(str(job.checkpoint_dir))[:16], ""


def job_part_folder() -> Path:
    """This job's folder of kept steps on this rank's host."""
    return job_folder(keep_root(), os.environ.get(ENV_RANK_HOST), job_key()[0])


def _part_of_this_rank() -> tuple[int, int]:
    """``(rank, size)`` of the job's process group: a sharded state's part and parts."""
    import torch.distributed as dist
    return dist.get_rank(), dist.get_world_size()


def writes_kept_steps() -> bool:
    """Whether this rank writes its host's copy of each step (the host's first rank)."""
    return os.environ.get(ENV_HOST_RANK, "0") == "0"


def wait() -> None:
    """Wait until the step being copied is in place (an optimizer's step waits by itself)."""
    pending = _keeper.pending
    if pending is None:
        return
    began = time.monotonic()
    _keeper.done.wait()
    _keeper.stalled += time.monotonic() - began


def _hook_optimizers(state: Any) -> bool:
    """Make every optimizer in ``state`` wait for the copy before its step; whether any is."""
    import torch
    found = False
    values = state.values() if isinstance(state, dict) else \
        state if isinstance(state, (list, tuple)) else [state]
    for value in values:
        if isinstance(value, torch.optim.Optimizer):
            if not getattr(value, "_hvd_magics_waits", False):
                value.register_step_pre_hook(lambda *_: wait())
                value._hvd_magics_waits = True
            found = True
        elif isinstance(value, (dict, list, tuple)):
            found = _hook_optimizers(value) or found
    return found


def keep(state: Any, step: int) -> None:
    """Copy ``state`` as the state after ``step`` into this host's memory (see the module).

    Raises
    ------
    KeepRefused
        ``state`` holds what cannot be kept (sharded tensors, a DeepSpeed engine).
    """
    wait()
    with _keeper.lock:
        error, _keeper.pending = (_keeper.pending.error if _keeper.pending else None), None
    if error is not None:
        raise error
    if "torch" in sys.modules:
        later = _hook_optimizers(state)
    else:
        later = False
    tree, leaves, nbytes, sharded = flatten(state)
    if not (sharded or writes_kept_steps()) or _keeper.without_room:
        return  # replicated state: the host's first rank keeps it for the host
    name = PartName(int(step), *_part_of_this_rank()) if sharded else PartName(int(step))
    if sharded:
        _keeper.ring.find(os.environ.get(ENV_RANK_HOST) or "127.0.0.1",
                          host_keeper(job_part_folder()))
    try:
        header, start = layout(tree, [leaf.slot for leaf in leaves])
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise KeepRefused(f"checkpoint.keep cannot copy the state of step {step}: {exc}. Fix: "
                          "keep tensors, arrays, modules, optimizers and values pickle takes"
                          ) from None
    folder = job_part_folder()
    try:
        copy = _open(folder, name, header, start + nbytes)
        if copy is None:
            return
        view = memoryview(copy.memory)[start:]
        for leaf in leaves:
            if not (later and leaf.later):
                copy_leaf(view, leaf)
        del view
        copy.leaves = [leaf for leaf in leaves if later and leaf.later]
        if not copy.leaves:
            _finish(copy, folder)
            return
    except OSError as exc:
        _not_kept(step, exc)
        return
    copy.ready = _device_mark(copy.leaves)
    _keeper.pending = copy
    _keeper.done.clear()
    threading.Thread(target=_copy_later, args=(copy, folder, start), daemon=True,
                     name="hvd-magics-keep").start()


def _device_mark(leaves: list[Leaf]) -> Any:
    """A CUDA event recorded now on the training's stream when a leaf is on a GPU (its copy
    waits for it on a stream of its own), else ``None``."""
    if not any(getattr(leaf.value, "is_cuda", False) for leaf in leaves):
        return None
    import torch
    mark = torch.cuda.Event()
    mark.record()
    return mark


def _copy_later(copy: _Copy, folder: Path, start: int) -> None:
    try:
        view = memoryview(copy.memory)[start:]
        if copy.ready is None:
            for leaf in copy.leaves:
                copy_leaf(view, leaf)
        else:  # from the GPU on a side stream, after what the step queued before keep
            import torch
            side = torch.cuda.Stream()
            side.wait_event(copy.ready)
            with torch.cuda.stream(side):
                for leaf in copy.leaves:
                    copy_leaf(view, leaf)
            side.synchronize()
        del view
        _finish(copy, folder)
    except OSError as exc:  # the host's memory, not the job's code: training goes on
        _not_kept(copy.name.step, exc)
    except BaseException as exc:  # noqa: BLE001 - raised by the next keep
        copy.error = exc
    finally:
        _keeper.done.set()


def _not_kept(step: int, exc: OSError) -> None:
    """Say (once a process) that a step could not be put in place; the next is tried."""
    if not _keeper.said_not_kept:
        _keeper.said_not_kept = True
        print(f"hvd_magics: checkpoint.keep: step {step:,} was not kept in this host's memory "
              f"({type(exc).__name__}: {exc}); the next steps are tried, and a restart resumes "
              "from the newest step every host holds", file=sys.stderr, flush=True)


def _open(folder: Path, name: PartName, header: bytes, size: int) -> _Copy | None:
    """The part's buffer in shared memory, its header written (an older step's reused when
    there is one); ``None`` when the host has no room (said once)."""
    if _keeper.made != folder or not folder.is_dir():  # made once, not at every step
        for made in (folder.parent.parent, folder.parent, folder):
            made.mkdir(exist_ok=True, mode=0o700)
        _mark_secret(folder)
        _keeper.made = folder
    temporary = folder / f".{name.file}.tmp-{os.getpid()}"
    for old in older_parts(folder, name.part, name.parts, name.step - 1, STEPS_KEPT - 1):
        if old == _keeper.ring.sending:
            continue  # on its way to the peer host: this step takes fresh pages
        with contextlib.suppress(OSError):
            os.replace(old, temporary)
            break
    try:
        memory = _keeper.buffers.take(temporary, size)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        _keeper.without_room = True
        said = folder / ".no-room"  # an empty file: a full tmpfs takes it
        if said.exists():
            return None  # an earlier attempt's rank said it
        with contextlib.suppress(OSError):
            said.touch()
        print(f"hvd_magics: checkpoint.keep: {folder.parent.parent} has no room for a step of "
              f"{size / 2**20:,.0f} MB ({exc.strerror}); steps are not kept in this host's "
              "memory from here on, and a restart resumes from the newest checkpoint file. Fix: "
              "a larger /dev/shm (docker --shm-size, a Kubernetes emptyDir of medium Memory) or "
              "HVD_MAGICS_KEEP_DIR on a tmpfs with room", file=sys.stderr, flush=True)
        return None
    write_header(memoryview(memory), header)
    return _Copy(name, temporary, memory, [], size, time.monotonic())


def _mark_secret(folder: Path) -> None:
    secret = job_key()[1]
    marked = folder / ".secret"
    if secret and not marked.exists():
        temporary = folder / f".secret.{os.getpid()}"
        temporary.write_text(digest(secret))
        os.replace(temporary, marked)


def host_keeper(folder: Path) -> str:
    """This host's keeper's address (started when none runs), found once; the last step said
    again with it, for the driver to know where the host's steps are served (and dropped)."""
    if _keeper.keeper is None:
        port = ensure_keeper(folder.parent)
        host = os.environ.get(ENV_RANK_HOST) or "127.0.0.1"
        _keeper.keeper = f"{host}:{port}" if port else ""
        said = _keeper.last_said
        if said is not None and _keeper.keeper and not said["keeper"]:
            rank_events.emit(KeptEvent(**{**said, "keeper": _keeper.keeper}))
    return _keeper.keeper


def _finish(copy: _Copy, folder: Path) -> None:
    """Put the whole part in place, drop the steps before the kept two, tell the driver."""
    os.replace(copy.temporary, folder / copy.name.file)
    for old in older_parts(folder, copy.name.part, copy.name.parts, copy.name.step):
        if old != _keeper.ring.sending:  # on its way to the peer: removed after a later step
            _keeper.buffers.forget(old)
            old.unlink(missing_ok=True)
    if _keeper.keeper is None and not _keeper.starting:  # its start not waited for: the
        _keeper.starting = True  # events say its address once it serves
        threading.Thread(target=host_keeper, args=(folder,), daemon=True,
                         name="hvd-magics-keeper-start").start()
    _keeper.last_said = said = KeptEvent(
        kind=KEPT, step=copy.name.step, part=copy.name.part, parts=copy.name.parts,
        holder=os.environ.get(ENV_RANK_HOST, ""), keeper=_keeper.keeper or "",
        nbytes=copy.nbytes, copy_s=round(time.monotonic() - copy.began, 4),
        stall_s=round(_keeper.stalled, 4), peer=False)
    rank_events.emit(said)
    _keeper.stalled = 0.0
    if copy.name.parts > 1:  # a rank's part of a sharded step: its peer host holds it too
        key, secret = job_key()
        _keeper.ring.send(folder / copy.name.file, copy.name, key, secret, copy.nbytes)


