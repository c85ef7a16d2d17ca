"""What a rank's ``DistributedDataParallel`` steps are doing, for the driver's verdict on a hang.

DDP's gradient allreduce runs inside ``backward()``, from autograd's hooks: a rank whose peer
has finished the job's code (it took fewer steps: uneven data per rank) waits there for ever,
and its innermost Python frame is autograd's, not torch.distributed's. A rank counts its DDP
training steps (a call of the DDP module in training mode, with gradients and gradient sync on)
and knows when it is inside the ``backward()`` of such a step, whose end waits for every rank's
gradients. Its stack answers carry both (:func:`state`), and its ``leaving`` event the steps it
took (:func:`steps`), so the driver can say which rank waits for which, after how many steps
each (:func:`hvd_magics.job.runner.left_behind`).

Nothing here changes what DDP or autograd do; a step costs two attribute reads and a counter.
"""
from __future__ import annotations

import functools
from typing import Any

from hvd_magics.events import DdpSteps
from hvd_magics.rank.guards.import_hooks import after_import, before_call

_DDP_MODULE = "torch.nn.parallel.distributed"
_PATCHED = "_hvd_magics_ddp_watch"


class _Watch:
    """What the hooks have seen."""

    def __init__(self) -> None:
        #: DDP training steps taken (forward calls that will allreduce in their backward).
        self.steps = 0
        #: Whether the latest such step's backward has not completed yet.
        self.pending = False
        #: Whether the rank is inside that backward now (it ends with DDP's allreduce).
        self.syncing = False


_watch = _Watch()


def steps() -> int | None:
    """DDP training steps this rank took, ``None`` when it took none."""
    return _watch.steps or None


def state() -> DdpSteps | None:
    """``{"steps": N, "syncing": bool}`` for a stack answer, ``None`` when no DDP step ran."""
    if not _watch.steps:
        return None
    return DdpSteps(steps=_watch.steps, syncing=_watch.syncing)


def reset() -> None:
    """Forget what was seen (a warm pool's next cell)."""
    global _watch
    _watch = _Watch()


def on_forward(model: Any, grad_enabled: bool) -> None:
    """The DDP module ``model`` is called (with gradients on when ``grad_enabled``): a training
    step when its backward will allreduce."""
    if model.training and grad_enabled and getattr(model, "require_backward_grad_sync", True):
        _watch.steps += 1
        _watch.pending = True


def _watched_backward(original: Any) -> Any:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        outer = _watch.syncing
        _watch.syncing = outer or _watch.pending
        try:
            result = original(*args, **kwargs)
        finally:
            _watch.syncing = outer
        _watch.pending = False
        return result

    setattr(backward, _PATCHED, True)
    return backward


def _patch(module: Any) -> None:
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None:
        return
    import torch

    before_call(ddp, "forward",
                lambda model, *_a, **_k: on_forward(model, torch.is_grad_enabled()), _PATCHED)
    if not getattr(torch.autograd.backward, _PATCHED, False):
        # Tensor.backward and accelerate's/Lightning's backward all call torch.autograd.backward
        torch.autograd.backward = _watched_backward(torch.autograd.backward)


def install() -> None:
    """Watch DDP's forward and autograd's ``backward`` once torch has loaded DDP."""
    after_import((_DDP_MODULE,), _patch)
