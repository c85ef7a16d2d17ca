"""A plain PyTorch DDP loop reports its progress with no line added to it.

What a hand-written loop does already says where it is: each training step calls the
``DistributedDataParallel`` module (in training mode, with gradients), each epoch begins with
``DistributedSampler.set_epoch`` or a new pass over the training ``DataLoader``, and the loss is
the scalar tensor ``backward()`` is called on. A rank installs hooks on those (:func:`install`,
when ``torch`` is imported) and reports through :mod:`hvd_magics.rank.api.progress`: steps and
samples per step from the module's calls, epochs (an epoch ends when the next one begins, or
with the job), the latest loss. The loss stays a tensor until a report leaves the rank (at most
a few times a second): no step waits for the device.

A step is an optimizer step: a loop that accumulates gradients (DDP's ``no_sync()``, which
Accelerate's ``accumulate`` uses) counts the call that synchronises them, and its steps per
epoch are the loader's batches over the calls per step; the samples are every call's. Each pass
over a DataFrame shard's loader (``shard.to_torch(...)`` made anew each epoch, ``shard.batches``)
is a pass over the one training set.

Accelerate's loops are such loops (``prepare`` wraps the model in DDP, ``backward`` calls the
loss's); the loss is the one given to ``Accelerator.backward`` (before it divides it by the
accumulation steps), and what they give ``Accelerator.log`` (its tracker API) goes with the
epoch's end too.

It stays out of the way of anything that reports epochs itself (the Lightning and Hugging Face
callbacks, ``hvd_magics.progress``): once an epoch was begun by another, it infers nothing.
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import Any

from hvd_magics.rank.api import progress
from hvd_magics.rank.guards.import_hooks import after_import, before_call
from hvd_magics.rank.rank_job import rank_job

_DDP_MODULE = "torch.nn.parallel.distributed"
_ACCELERATE_MODULE = "accelerate.accelerator"
#: A DataFrame shard's module (it loads numpy: hooked once the job's code imports it).
_SHARD_MODULE = "hvd_magics.rank.api.shard"
_PATCHED = "_hvd_magics_loop_progress"


class _Loop:
    """What the hooks have seen of the loop."""

    def __init__(self) -> None:
        #: The epoch under way (1-based; 0: none yet) and its steps and samples so far.
        self.epoch = 0
        self.step = 0
        self.samples = 0
        #: The epoch the loop announced next (``set_epoch``, a new pass), begun by its first step.
        self.next_epoch = 0
        #: Whether ``DistributedSampler.set_epoch`` numbers the epochs.
        self.sampler_epochs = False
        #: The training loader (the one iterated last when the first step came), and the last
        #: loader a pass began over, with its length and batch size.
        self.loader: Any = None
        self.iterated: Any = None
        self.steps: int | None = None
        self.batch_size: int | None = None
        #: The latest loss ``backward()`` was called on, detached.
        self.loss: Any = None
        #: Inside ``Accelerator.backward``: its loss is the user's, not the one it divides.
        self.in_accelerate = False
        #: Module calls since the last optimizer step, and per step (``None``: not known yet);
        #: before the first step, what ``Accelerator.accumulate`` says it will be.
        self.calls = 0
        self.per_step: int | None = None
        self.per_step_said: int | None = None


_loop = _Loop()


def _others_report() -> bool:
    """Whether an epoch under way was begun by someone else (a callback, the user)."""
    return bool(progress.current_epoch() and not progress.is_inferred())


def _rows(value: Any) -> int:
    """Samples in a step's first argument (a tensor, or a structure holding one)."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, dict) and value:
        value = next(iter(value.values()))
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape else 0


def _identity(loader: Any) -> Any:
    """What makes two passes passes over one training set: the DataFrame shard a loader of
    ``shard.to_torch`` reads (a new loader each epoch is the same set), else the loader."""
    shard = getattr(getattr(loader, "dataset", None), "shard", None)
    if shard is not None:
        return ("shard", shard.path)
    try:
        return weakref.ref(loader)
    except TypeError:
        return None


def on_new_pass(loader: Any) -> None:
    """A pass over ``loader`` begins: over the training loader, the next epoch."""
    _new_pass(_identity(loader), _length(loader), getattr(loader, "batch_size", None))


def on_shard_pass(shard: Any, steps: int, batch_size: int) -> None:
    """A pass over a DataFrame shard's batches begins (``shard.batches``)."""
    _new_pass(("shard", shard.path), steps, batch_size)


def _new_pass(identity: Any, length: int | None, batch_size: int | None) -> None:
    _loop.iterated = (identity, length, batch_size)
    if (_loop.loader is not None and identity is not None and identity == _loop.loader
            and not _loop.sampler_epochs):
        _loop.next_epoch = _loop.epoch + 1


def on_set_epoch(epoch: int) -> None:
    """``DistributedSampler.set_epoch(epoch)``: epoch ``epoch + 1`` begins with its first step."""
    _loop.sampler_epochs = True
    if isinstance(epoch, int) and epoch + 1 != _loop.epoch:
        _loop.next_epoch = epoch + 1


def on_step(args: tuple[Any, ...], synced: bool = True) -> None:
    """A training call of the DDP module with ``args``: an optimizer step when ``synced`` (its
    gradients are synchronised), else a call that accumulates gradients."""
    if _others_report():
        return
    if _loop.loader is None and _loop.iterated is not None:
        _loop.loader, _loop.steps, _loop.batch_size = _loop.iterated
    elif _loop.iterated is not None and _loop.iterated[0] == _loop.loader:
        _loop.steps = _loop.iterated[1]
    rows = _rows(args)
    if _loop.batch_size is None and rows:  # a loader with a batch sampler (Accelerate's) has none
        _loop.batch_size = rows
    if not _loop.epoch or (_loop.next_epoch and _loop.next_epoch != _loop.epoch):
        _begin(_loop.next_epoch or _loop.epoch + 1)
    _loop.samples += rows
    _loop.calls += 1
    if not synced:
        return
    if _loop.per_step is None:
        _loop.per_step = _loop.calls
        progress.samples_per_step(_per_step_samples())
    _loop.calls = 0
    _loop.step += 1
    loss = _loop.loss
    progress.report(_loop.step, _steps(), **({"loss": loss} if loss is not None else {}))


def _steps() -> int | None:
    """Optimizer steps in an epoch: the loader's batches over the calls per step."""
    if _loop.steps is None:
        return None
    return math.ceil(_loop.steps / (_loop.per_step or _loop.per_step_said or 1))


def on_backward(tensor: Any) -> None:
    """``backward()`` was called on ``tensor``: a scalar is the loss (unless Accelerate's
    ``backward`` divided the user's, which it was given)."""
    if _loop.epoch and tensor.numel() == 1 and not _loop.in_accelerate:
        _loop.loss = tensor.detach()


def _begin(epoch: int) -> None:
    finish()
    _loop.epoch, _loop.next_epoch, _loop.step, _loop.samples = epoch, 0, 0, 0
    _loop.calls = 0
    progress.begin_epoch(epoch, None, _steps(), _per_step_samples(), inferred=True)


def _per_step_samples() -> int | None:
    """Samples in an optimizer step: the loader's batch over the calls per step."""
    if _loop.batch_size is None:
        return None
    return _loop.batch_size * (_loop.per_step or _loop.per_step_said or 1)


def finish() -> None:
    """End the epoch under way (at the next epoch, and when the job's function returns)."""
    if _loop.epoch and progress.is_inferred():
        loss = _loop.loss
        progress.end_epoch(samples=_loop.samples or None,
                           **({"loss": loss} if loss is not None else {}))
    _loop.epoch = 0


def reset() -> None:
    """Forget the loop (a warm pool's next cell is another loop)."""
    global _loop
    finish()
    _loop = _Loop()


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _patch_ddp(module: Any) -> None:
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None:
        return
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def step(model: Any, *args: Any, **_kwargs: Any) -> None:
        if model.training and torch.is_grad_enabled():
            on_step(args, getattr(model, "require_backward_grad_sync", True))

    before_call(ddp, "forward", step, _PATCHED)
    before_call(DistributedSampler, "set_epoch", lambda _sampler, epoch: on_set_epoch(epoch),
                _PATCHED)
    before_call(DataLoader, "__iter__", on_new_pass, _PATCHED)
    before_call(torch.Tensor, "backward", lambda tensor, *_args, **_kwargs: on_backward(tensor),
                _PATCHED)


#: What Accelerate's ``log`` is given that is not a metric of the training.
_NOT_METRICS = ("epoch", "step", "global_step")


def on_accelerate_log(values: Any) -> None:
    """``Accelerator.log(values)`` (its tracker API): the numbers go with the epoch's end."""
    if not isinstance(values, dict):
        return
    numbers = {name: value for name, value in values.items()
               if name not in _NOT_METRICS and not isinstance(value, bool)
               and (isinstance(value, (int, float)) or getattr(value, "numel", lambda: 0)() == 1)}
    if numbers:
        progress.record(**numbers)


def _users_loss(backward: Any) -> Any:
    """``Accelerator.backward``, keeping the loss it is given (the user's) as the loss."""
    @functools.wraps(backward)
    def patched(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        on_backward(loss)
        _loop.in_accelerate = True
        try:
            return backward(self, loss, *args, **kwargs)
        finally:
            _loop.in_accelerate = False

    setattr(patched, _PATCHED, True)
    return patched


def _patch_accelerate(module: Any) -> None:
    accelerator = getattr(module, "Accelerator", None)
    if accelerator is not None:
        before_call(accelerator, "log",
                    lambda _self, values, *_args, **_kwargs: on_accelerate_log(values), _PATCHED)
        if not getattr(accelerator.backward, _PATCHED, False):
            accelerator.backward = _users_loss(accelerator.backward)
        before_call(accelerator, "accumulate", _accumulating, _PATCHED)


def _accumulating(accelerator: Any, *_args: Any, **_kwargs: Any) -> None:
    """``with accelerator.accumulate(model):``: its steps are that many calls each."""
    _loop.per_step_said = max(1, int(getattr(accelerator, "gradient_accumulation_steps", 1)))


def install() -> None:
    """Hook DDP, its sampler, the DataLoader and ``backward`` once ``torch`` has loaded DDP,
    Accelerate's ``log`` once it is imported, and a DataFrame shard's passes once the job opens
    one (not with ``HVD_MAGICS_LOOP_PROGRESS=0``)."""
    if not rank_job().loop_progress:
        return
    after_import((_DDP_MODULE,), _patch_ddp)
    after_import((_ACCELERATE_MODULE,), _patch_accelerate)
    after_import((_SHARD_MODULE,), lambda shard: shard.when_a_pass_begins(on_shard_pass))
