"""Each training step's time on this rank, split into waiting for input, compute and waiting in
collectives, with no line added to the user's loop (the driver names the straggler from it:
:mod:`hvd_magics.job.verdicts.straggler`).

A step is the time from one optimizer step to the next (``torch.optim``'s global step hook: a
plain loop, DDP, Horovod's ``DistributedOptimizer``, Accelerate, Lightning and the Hugging Face
``Trainer`` all step an optimizer). Within it, on the thread that trains:

- **input**: time inside a ``DataLoader`` iterator's ``__next__`` (a DataFrame shard's
  ``to_torch`` loader and ``batches`` included): the wait for the next batch;
- **communication**: time blocked in a collective: Horovod's ``synchronize`` (what
  ``DistributedOptimizer.step`` and every blocking ``hvd`` collective wait in), a synchronous
  ``torch.distributed`` collective or the wait for an asynchronous one (FSDP's all-gathers and
  reduce-scatters), and the end of a DDP step's ``backward()``, from the moment the last
  gradient was ready (a hook per parameter) to the moment the allreduce completes;
- **compute**: the rest (forward, backward, optimizer, the loop's own Python).

Besides, every :data:`PACE_EVERY_S` seconds or more, the pace of the CPU the training thread
runs on: a fixed piece of work (:data:`PACE_WORK` multiply-adds of Python) timed on the thread's
CPU clock after a step. A CPU shared with other work (another process on its core, a busy
hypervisor) runs the same work slower, as it runs the rank's own: on two cores beside a busy
process, equal ranks' own work differed by 24-45% over windows of 60 steps of 1 ms, and the
probe by 36-62% with them. It is what tells a rank with more to do from one on a slower CPU.

And how long in its own work (the step outside collectives) the training thread ran on a
CPU and how long it was ready to run but waited for one, and how much of each was in its input
(the kernel's ``/proc/thread-self/schedstat``, read on entering and leaving each collective and
each wait for a batch): a rank slowed
because its host's CPUs are busy with other work, or its CPU time is limited, is told from one
with more to compute. A wait for a CPU inside a collective (a rank woken when its peers are
done, on a busy host) is left out: it is not what holds the others back.

On a rank the others wait for, communication is short and its own work (input and compute) long; on
the others it is the reverse. Nothing synchronises a device: the clock is read where the Python code
already waits. On a GPU the host runs ahead of the kernels (and NCCL's waits do not block it), so a
DDP module on a CUDA device is timed by CUDA events on the GPU instead
(:mod:`hvd_magics.rank.instruments.gpu_steps`); other GPU ranks (Horovod's, whose ``synchronize``
does block) keep the host's clock. A step costs a few clock reads, two reads of ``schedstat`` (about
4 us each) per blocking collective (one for all of ``DistributedOptimizer``'s gradients) and per
batch and, for
DDP, a Python call and a ``schedstat`` read when its last gradient is ready (a call per parameter's
gradient in its first steps, until the same parameter's gradient was last three times in a row), and
three CUDA events on a GPU. ``HVD_MAGICS_STEP_SPLIT=0`` turns it off.

TensorFlow's steps under Horovod (a Keras ``fit``, a ``DistributedGradientTape`` loop) and under
``MultiWorkerMirroredStrategy`` run as one graph call, which hides their parts from Python: they are
timed inside the graph (:mod:`hvd_magics.rank.instruments.step_split_tf`) and read by a thread of
the rank.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from typing import Any
from collections.abc import Callable, Iterator

from hvd_magics.events import StepSplitEvent
from hvd_magics.protocol import STEP_COLUMNS, STEP_SPLIT
from hvd_magics.rank.instruments import gpu_memory, rank_memory, step_split_tf
from hvd_magics.rank import rank_events
from hvd_magics.rank.instruments.gpu_steps import GpuSteps
from hvd_magics.rank.guards.import_hooks import after_import, before_call
from hvd_magics.thread_cpu import ThreadCpu
from hvd_magics.rank.rank_job import rank_job

#: Least seconds between two ``step_split`` events.
SEND_EVERY_S = 0.25
#: Least seconds between two probes of the training thread's CPU pace, and the probe's work
#: (about 15-20 us of Python on this machine: 0.1% of the training thread's time).
PACE_EVERY_S = 0.02
PACE_WORK = 400
#: Most step rows one event carries (the latest; the totals count every step).
STEP_ROWS_SENT = 256

_PATCHED = "_hvd_magics_step_split"
_INPUT, _COMM = 0, 1
#: ``torch.distributed`` collectives that block unless called with ``async_op=True``.
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
                "all_gather_single", "all_to_all", "all_to_all_single", "barrier", "broadcast",
                "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
                "reduce_scatter_single", "reduce_scatter_tensor", "scatter",
                "scatter_object_list")


def _no_totals() -> list[float]:
    """``[steps, *sums of each column]`` (:data:`hvd_magics.protocol.STEP_COLUMNS`), all
    zero."""
    return [0] + [0.0] * len(STEP_COLUMNS)


class _Split:
    """What the hooks have seen of the step under way."""

    def __init__(self) -> None:
        #: The thread that trains (the first to step an optimizer); others are not timed.
        self.thread: int | None = None
        #: Steps completed, and when the step under way began (``None``: before the first).
        self.step = 0
        self.began: float | None = None
        #: Seconds of the step under way spent waiting for input and in collectives.
        self.waits = [0.0, 0.0]
        #: The training thread's seconds on a CPU and waiting for one inside collectives, in
        #: the step under way (left out of the step's own-work figures), and its readings when
        #: the latest DDP gradient was ready (``None``: not read, in a DDP module's first
        #: steps, while every parameter has a hook).
        self.comm_cpu = [0.0, 0.0]
        #: ...and inside waits for input (a part of its own work).
        self.input_cpu = [0.0, 0.0]
        self.grad_cpu: tuple[float, float] | None = None
        #: Inside a timed wait (a nested one is counted once), and inside optimizer steps (an
        #: optimizer's step that calls another's ends one training step).
        self.depth = 0
        self.stepping = 0
        #: Inside :func:`not_a_step` (an optimizer stepped by a library, not by training).
        self.paused = 0
        #: Whether a batch was fetched or a DDP module called since the last optimizer step,
        #: and whether any ever was (a second optimizer in the same step is not a new step).
        self.fed = False
        self.ever_fed = False
        #: When the latest parameter's gradient was ready, and whether the backward under way
        #: ends a DDP step (it then waits for the allreduce).
        self.grad_ready = 0.0
        self.ddp_sync = False
        #: The parameter whose gradient was ready last (its ``id``), and the hooks of the DDP
        #: module whose backward is under way.
        self.last_grad: int | None = None
        self.hooks: _GradHooks | None = None
        #: Rows not sent yet, and their totals.
        self.rows: list[list[float]] = []
        self.totals = _no_totals()
        #: The training thread's CPU time (``None``: not opened yet), and its seconds on a CPU
        #: and waiting for one when the step under way began.
        self.cpu: ThreadCpu | None = None
        self.cpu_at = (0.0, 0.0)
        self.sent = time.monotonic()
        #: ``[step, seconds]`` of the CPU pace probes not sent yet, and when the last ran.
        self.paces: list[list[float]] = []
        self.paced = 0.0
        #: A DDP module on a CUDA device: its steps timed on the GPU
        #: (rank/instruments/gpu_steps.py).
        self.gpu: GpuSteps | None = None


_split = _Split()


#: ``torch.is_grad_enabled``, once DDP is loaded (step_split reads it every forward).
def _grad_enabled() -> bool:
    return True


class _GradHooks:
    """The gradient-ready hooks on one DDP module's parameters: on every parameter at first,
    then, once :data:`NARROW_AFTER` backward passes in a row ended on the same parameter's
    gradient, on that one only (a Python call per step, not one per parameter)."""

    def __init__(self, model: Any) -> None:
        self.handles = {id(param): param.register_post_accumulate_grad_hook(_grad_ready)
                        for param in model.parameters() if param.requires_grad}
        self.last: int | None = None
        self.same = 0

    def after_backward(self, last: int | None) -> None:
        """A backward pass ended; ``last``: the parameter whose gradient was ready last."""
        if len(self.handles) < 2 or last not in self.handles:
            return
        self.same = self.same + 1 if last == self.last else 1
        self.last = last
        if self.same >= NARROW_AFTER:
            for key in [key for key in self.handles if key != last]:
                self.handles.pop(key).remove()


#: Backward passes in a row that must end on the same parameter before only its hook is kept.
NARROW_AFTER = 3
#: DDP module -> the hooks on its parameters.
_hooks: weakref.WeakKeyDictionary[Any, _GradHooks] = weakref.WeakKeyDictionary()


def reset() -> None:
    """Forget the steps so far (a warm pool's next cell)."""
    global _split
    _split = _Split()
    step_split_tf.reset()


def _timing() -> bool:
    return _split.thread == threading.get_ident()


def _cpu_s(split: _Split) -> tuple[float, float]:
    """Seconds the training thread has run on a CPU and waited for one so far (zeros where Linux
    does not say); its ``schedstat`` is opened on that thread, on the first call."""
    if split.cpu is None:
        split.cpu = ThreadCpu()
    return split.cpu.seconds()


def _timed(kind: int, original: Callable[..., Any],
           counts: Callable[..., bool] = lambda *_a, **_k: True) -> Callable[..., Any]:
    """``original``, adding the time a call takes to the step's ``kind`` of wait (when
    ``counts(*args, **kwargs)``, on the training thread, outside another timed wait)."""
    if getattr(original, _PATCHED, False):
        return original

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        split = _split
        if split.depth or not _timing() or not counts(*args, **kwargs):
            return original(*args, **kwargs)
        split.depth += 1
        cpu = _cpu_s(split)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            split.depth -= 1
            split.waits[kind] += time.perf_counter() - start
            _add_cpu(split.comm_cpu if kind == _COMM else split.input_cpu, split, cpu)
            if kind == _INPUT:
                split.fed = split.ever_fed = True

    setattr(timed, _PATCHED, True)
    return timed


def _add_cpu(into: list[float], split: _Split, since: tuple[float, float]) -> None:
    """Add the training thread's CPU time and wait for a CPU from ``since`` (its reading on
    entering a collective or a wait for input) to now to ``into`` (``[ran, waited]``)."""
    ran, waited = _cpu_s(split)
    into[0] += max(0.0, ran - since[0])
    into[1] += max(0.0, waited - since[1])


@contextlib.contextmanager
def not_a_step() -> Iterator[None]:
    """Optimizer steps inside are not training steps: PyTorch's distributed checkpoint gives an
    optimizer without state its state by a step of zero gradients (a resumed job counted one
    step more, its first row spanning the checkpoint's load)."""
    split = _split
    split.paused += 1
    try:
        yield
    finally:
        split.paused -= 1


def _before_optimizer_step(*_args: Any) -> None:
    split = _split
    if split.paused:
        return
    if split.thread is None:
        split.thread = threading.get_ident()
    if _timing():
        split.stepping += 1


def _on_optimizer_step(*_args: Any) -> None:
    """An optimizer stepped: the step under way ends (unless no batch came since the last one:
    a second optimizer of the same step; or it is the inner step of an optimizer that wraps
    another, as Horovod's ``DistributedOptimizer`` does)."""
    split, now = _split, time.perf_counter()
    if split.paused or not _timing():
        return
    split.stepping = max(0, split.stepping - 1)
    if split.stepping:
        return
    if split.ever_fed and not split.fed:
        return
    cpu = _cpu_s(split)
    if split.began is not None:
        split.step += 1
        host = [max(0.0, cpu[1] - split.cpu_at[1] - split.comm_cpu[1]),
                max(0.0, cpu[0] - split.cpu_at[0] - split.comm_cpu[0]),
                split.input_cpu[1], split.input_cpu[0]]
        if split.gpu is not None:
            for row in split.gpu.on_step_end(split.step, split.waits[_INPUT], host):
                _keep(split, row)
        else:
            _keep(split, [split.step, now - split.began, split.waits[_INPUT], split.waits[_COMM],
                          *host])
    elif split.gpu is not None:
        split.gpu.on_step_end(0, 0.0, [0.0] * 4)  # the first step's start on the GPU
    if split.began is not None and split.gpu is None and now - split.paced >= PACE_EVERY_S:
        split.paces.append([split.step, _pace(split, cpu[0])])
        split.paced = now  # the probe is no step's: the next one begins after it
        now, cpu = time.perf_counter(), _cpu_s(split)
    split.began, split.waits, split.fed, split.cpu_at = now, [0.0, 0.0], False, cpu
    split.comm_cpu, split.input_cpu = [0.0, 0.0], [0.0, 0.0]
    if time.monotonic() - split.sent >= SEND_EVERY_S:
        flush()


def _pace(split: _Split, ran: float) -> float:
    """Seconds the training thread's CPU takes for :data:`PACE_WORK` multiply-adds (``ran``:
    its CPU time read just before)."""
    value = 1.0
    for _ in range(PACE_WORK):
        value = value * 1.0000001 + 1.0
    return round(_cpu_s(split)[0] - ran, 9)


def _keep(split: _Split, row: list[float]) -> None:
    split.rows.append(row)
    totals = split.totals
    totals[0] += 1
    for i in range(1, min(len(row), len(totals))):
        totals[i] += row[i]


#: Held while the steps are sent (by the training thread, or TensorFlow's reader).
_sending = threading.Lock()


def flush(final: bool = False) -> None:
    """Send the steps not sent yet (``final``: the job's function returned; a GPU's steps
    still under way are waited for)."""
    with _sending:
        _send(_split, final)


def _send(split: _Split, final: bool) -> None:
    split.sent = time.monotonic()
    tf_rows = step_split_tf.new_rows()
    for row in tf_rows:
        _keep(split, row)
    if split.gpu is not None:
        for row in split.gpu.ready(wait=final):
            _keep(split, row)
    if not split.totals[0]:
        return
    rows = split.rows[-STEP_ROWS_SENT:]
    dropped = len(split.rows) - len(rows)
    event = StepSplitEvent(
        kind=STEP_SPLIT, rows=[[int(r[0])] + [round(v, 6) for v in r[1:]] for r in rows],
        totals=[split.totals[0]] + [round(v, 6) for v in split.totals[1:]],
        dropped=dropped, gpu=gpu_memory.reading(), memory=rank_memory.reading(),
        clock="gpu" if split.gpu is not None else "host", pace=split.paces)
    if tf_rows:
        event["cpu_read"] = False
    rank_events.emit(event)
    split.rows, split.totals, split.paces = [], _no_totals(), []


def _grad_ready(param: Any) -> None:
    split = _split
    split.grad_ready = time.perf_counter()
    # read once the hooks are on the parameter whose gradient is last (a read per step, not per
    # parameter), and once opened on the training thread (this may be autograd's)
    hooks = split.hooks
    split.grad_cpu = (_cpu_s(split) if split.cpu is not None and hooks is not None
                      and len(hooks.handles) == 1 else None)
    split.last_grad = id(param)
    if split.gpu is not None:
        split.gpu.on_grad()


def _on_ddp_forward(model: Any, *_args: Any, **_kwargs: Any) -> None:
    split = _split
    split.fed = split.ever_fed = True
    split.ddp_sync = bool(model.training and _grad_enabled()
                          and getattr(model, "require_backward_grad_sync", True))
    if split.ddp_sync:
        split.hooks = _hooks.get(model)
        if split.hooks is None:
            split.hooks = _hooks[model] = _GradHooks(model)
            if split.gpu is None and any(p.is_cuda for p in model.parameters()):
                split.gpu = GpuSteps()


def _timed_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.backward``, adding to a DDP step's communication the time from its last
    gradient to the end (DDP's wait for the allreduce)."""
    if getattr(original, _PATCHED, False):
        return original

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        split = _split
        if not split.ddp_sync or split.depth or not _timing():
            return original(*args, **kwargs)
        start = split.grad_ready = time.perf_counter()
        split.last_grad = None
        result = original(*args, **kwargs)
        if split.grad_ready > start:
            split.waits[_COMM] += max(0.0, time.perf_counter() - split.grad_ready)
            if split.grad_cpu is not None:
                _add_cpu(split.comm_cpu, split, split.grad_cpu)
        if split.hooks is not None:
            split.hooks.after_backward(split.last_grad)
        if split.gpu is not None:
            split.gpu.on_backward_end()
        split.ddp_sync = False
        return result

    setattr(backward, _PATCHED, True)
    return backward


def _synchronous(*_args: Any, **kwargs: Any) -> bool:
    return not kwargs.get("async_op", False)


def _patch_torch(module: Any) -> None:
    """``torch.optim.optimizer``: the step hook; the data loader's and autograd's waits."""
    import torch
    from torch.utils.data import dataloader

    module.register_optimizer_step_pre_hook(_before_optimizer_step)
    module.register_optimizer_step_post_hook(_on_optimizer_step)
    iterator = dataloader._BaseDataLoaderIter
    iterator.__next__ = _timed(_INPUT, iterator.__next__)
    torch.autograd.backward = _timed_backward(torch.autograd.backward)


def _patch_ddp(module: Any) -> None:
    global _grad_enabled
    import torch

    _grad_enabled = torch.is_grad_enabled
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is not None:
        before_call(ddp, "forward", _on_ddp_forward, _PATCHED)


def _patch_distributed(module: Any) -> None:
    """``torch.distributed``'s collectives, timed when they block (FSDP2's all-gathers and
    reduce-scatters among them: ``all_gather_single``, ``reduce_scatter_single``), and the
    wait for one started with ``async_op=True`` (``Work.wait``: FSDP's, a loop's own)."""
    for name in _COLLECTIVES:
        if callable(getattr(module, name, None)):
            setattr(module, name, _timed(_COMM, getattr(module, name), _synchronous))
    work = getattr(getattr(module, "distributed_c10d", None), "Work", None)
    if work is not None and callable(getattr(work, "wait", None)):
        work.wait = _timed(_COMM, work.wait)


def _patch_horovod(module: Any) -> None:
    """``synchronize`` in each module that holds it: where Horovod's torch ops wait; and
    ``DistributedOptimizer``'s own ``synchronize``, which waits for every gradient's allreduce
    in turn: timed as one wait (its CPU time read twice a step, not twice a gradient)."""
    if callable(getattr(module, "synchronize", None)):
        module.synchronize = _timed(_COMM, module.synchronize)
    optimizer = getattr(module, "_DistributedOptimizer", None)
    if optimizer is not None and callable(getattr(optimizer, "synchronize", None)):
        optimizer.synchronize = _timed(_COMM, optimizer.synchronize)


@contextlib.contextmanager
def input_wait() -> Iterator[None]:
    """Count the time inside as waiting for input (a shard's ``batches`` gathering a batch)."""
    split = _split
    if split.depth or not _timing():
        yield
        return
    split.depth += 1
    cpu = _cpu_s(split)
    start = time.perf_counter()
    try:
        yield
    finally:
        split.depth -= 1
        split.waits[_INPUT] += time.perf_counter() - start
        _add_cpu(split.input_cpu, split, cpu)
        split.fed = split.ever_fed = True


def _read_tf_steps() -> None:
    """Send TensorFlow's steps every :data:`SEND_EVERY_S` seconds, from a thread of their own
    (nothing of Python runs in a graph's step)."""
    def read() -> None:
        while not _stopped.wait(SEND_EVERY_S):
            flush()

    threading.Thread(target=read, name="hvd_magics step split", daemon=True).start()


#: Set to stop TensorFlow's reader (never, in a rank: it ends with the process).
_stopped = threading.Event()


def install() -> None:
    """Time steps once torch, or Horovod's TensorFlow API or Keras 2's optimizers, are imported
    (not with ``HVD_MAGICS_STEP_SPLIT=0``)."""
    if not rank_job().step_split:
        return
    after_import(("torch.optim.optimizer",), _patch_torch)
    after_import(("torch.nn.parallel.distributed",), _patch_ddp)
    after_import(("torch.distributed",), _patch_distributed)
    after_import(("horovod.torch.mpi_ops", "horovod.torch.optimizer", "horovod.torch"),
                 _patch_horovod)
    step_split_tf.install(_read_tf_steps)
