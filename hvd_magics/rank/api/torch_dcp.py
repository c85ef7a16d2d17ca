"""PyTorch's distributed checkpoint (``torch.distributed.checkpoint``, DCP) behind
``checkpoint.save`` and ``checkpoint.latest(state)`` for sharded training: every rank writes its
own part of the state, and any number of ranks reads it back, resharded (saved by 4 ranks,
resumed by 2, the same full weights).

The state is a dict. Its values may be the job's modules and optimizers themselves (an FSDP2
``fully_shard`` model, an FSDP1 ``FullyShardedDataParallel``, or any ``nn.Module``): they are
saved and loaded through ``torch.distributed.checkpoint.state_dict``'s ``get_model_state_dict``
and ``get_optimizer_state_dict`` (an optimizer with each module that holds its parameters), which
also gives an optimizer before its first step the state to load into. Other values (state dicts
of sharded tensors, tensors, numbers, strings) go as DCP takes them; a load replaces them in the
dict.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvd_magics.errors import CheckpointMismatch, sentence
from hvd_magics.rank.instruments.step_split import not_a_step

#: Class names of the wrappers and tensors whose parameters each rank holds a part of.
_SHARDED_TENSORS = {"DTensor", "ShardedTensor"}
_SHARDED_MODULES = {"FSDPModule", "FullyShardedDataParallel"}


def _torch() -> Any:
    """``torch`` when the job has imported it (a rank without it has no sharded state)."""
    return sys.modules.get("torch")


def _named(value: Any, names: set[str]) -> bool:
    return any(c.__name__ in names and c.__module__.startswith("torch.distributed")
               for c in type(value).__mro__)


def modules_and_optimizers(state: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The top-level values of ``state`` that are ``nn.Module``s and ``Optimizer``s, by key."""
    torch = _torch()
    if torch is None or not isinstance(state, dict):
        return {}, {}
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    optimizers = {k: v for k, v in state.items() if isinstance(v, torch.optim.Optimizer)}
    return modules, optimizers


def sharded_module(module: Any) -> bool:
    """Whether ``module`` (or a submodule) is sharded by FSDP2 or FSDP1, or holds DTensors."""
    return any(_named(sub, _SHARDED_MODULES) for sub in module.modules()) or any(
        _named(parameter, _SHARDED_TENSORS) for parameter in module.parameters())


def needs_dcp(state: Any, sharded_paths: list[str]) -> bool:
    """Whether ``state`` is saved through DCP: it holds sharded tensors (``sharded_paths``) or
    the job's modules or optimizers themselves."""
    return bool(sharded_paths) or any(modules_and_optimizers(state))


class _ModuleState:
    """A module as DCP's ``Stateful``: its state dict as sharded as the module is."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state_dict)


@contextlib.contextmanager
def _as_its_own_class(optimizer: Any) -> Iterator[None]:
    """Horovod's ``DistributedOptimizer`` as the optimizer it wraps, for the while: DCP gives an
    optimizer without state its state by a step of zero gradients (its own ``step()``, then
    ``zero_grad(set_to_none=True)``), which Horovod's would allreduce, and whose ``zero_grad``
    takes no argument. Horovod makes its class from the wrapped one's (``Adam`` is next in its
    order), and keeps its own attributes aside."""
    wrapper = type(optimizer)
    if "synchronize" not in vars(wrapper) or not wrapper.__module__.startswith("horovod"):
        yield
        return
    inner = wrapper.__mro__[1]
    optimizer.__class__ = inner
    try:
        yield
    finally:
        optimizer.__class__ = wrapper


class _OptimizerState:
    """An optimizer as DCP's ``Stateful``, with the module whose parameters it steps (its
    state is keyed by their names, so that another sharding can read it)."""

    def __init__(self, module: Any, optimizer: Any) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        with _as_its_own_class(self.optimizer), not_a_step():
            return get_optimizer_state_dict(self.module, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        with _as_its_own_class(self.optimizer), not_a_step():
            set_optimizer_state_dict(self.module, self.optimizer, state_dict)


def _module_of(optimizer: Any, modules: dict[str, Any], key: str) -> Any:
    """The module among ``modules`` whose parameters ``optimizer`` steps."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules.values():
        if stepped & {id(p) for p in module.parameters()}:
            return module
    raise ValueError(
        f"checkpoint: the optimizer state[{key!r}] steps parameters of no module in the state, "
        "and its state is saved by the names of its module's parameters (so that another "
        "number of ranks can read it). Fix: put the model beside it, e.g. "
        f"{{'model': model, {key!r}: optimizer}}")


def stateful(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each module and optimizer as DCP's ``Stateful``; other values as they
    are (a load puts what it read into this dict, and from it into ``state``)."""
    modules, optimizers = modules_and_optimizers(state)
    view = dict(state)
    for key, module in modules.items():
        view[key] = _ModuleState(module)
    for key, optimizer in optimizers.items():
        view[key] = _OptimizerState(_module_of(optimizer, modules, key), optimizer)
    return view


def in_process_group() -> bool:
    """Whether the ranks are in a ``torch.distributed`` process group, which DCP's collectives
    run in. Without one (Horovod's ranks, a single process), each rank's modules and
    optimizers are whole: one process writes them, and each rank reads them alone."""
    torch = _torch()
    return bool(torch is not None and torch.distributed.is_available()
                and torch.distributed.is_initialized())


#: The start of DCP's warning that, outside a process group, it assumes one process.
_ALONE_SAYS = "torch.distributed is .*single process"


@contextlib.contextmanager
def _alone_on_purpose() -> Iterator[None]:
    """DCP outside a process group, meant so: its warning that it assumes one process is not
    news to the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ALONE_SAYS)
        yield


def save(state: dict[str, Any], folder: Path) -> None:
    """Every rank writes its part of ``state`` into ``folder`` (a collective: every rank of
    the job calls it); returns once rank 0 has written the checkpoint's metadata. Outside a
    process group (:func:`in_process_group`) the caller writes the whole state alone."""
    import torch.distributed.checkpoint as dcp

    with _alone_on_purpose():
        dcp.save(stateful(state), checkpoint_id=str(folder), no_dist=not in_process_group())


#: The Gloo group of the saves in the background: their collectives run in a thread of their
#: own, beside the training's in the default group (two threads' collectives in one group may
#: meet in a different order on each rank), with the default group it was made beside (a warm
#: pool's cell makes another).
_background_group: tuple[Any, Any] = (None, None)


def save_in_background(state: dict[str, Any], folder: Path) -> Any:
    """:func:`save`, returning once ``state`` is copied to this host's memory; the writing
    goes on in a thread. Its ``concurrent.futures.Future``. Every rank calls it, at the same
    saves (the first makes the saves' own Gloo group, a collective)."""
    global _background_group
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if not in_process_group():
        # DCP's thread warns when it starts writing, which may be after this returns (a
        # filter scoped to this call was gone by then): for the rest of this rank's life
        warnings.filterwarnings("ignore", message=_ALONE_SAYS)
        return dcp.async_save(stateful(state), checkpoint_id=str(folder), no_dist=True)
    world = dist.group.WORLD
    if _background_group[0] is not world:
        _background_group = (world, dist.new_group(backend="gloo"))
    return dcp.async_save(stateful(state), checkpoint_id=str(folder),
                          process_group=_background_group[1])


#: How many of the checkpoint's unread entries an error names.
_NAMED = 4


def _an_optimizers_empty_state_dict(value: Any) -> bool:
    """Whether ``value`` is an optimizer's ``state_dict()`` taken before its first step (its
    ``state`` empty): a load into it finds no tensor to fill."""
    return (isinstance(value, dict) and value.get("state") == {}
            and isinstance(value.get("param_groups"), list))


def unread_entries_refused(state: dict[str, Any], unread: list[str], folder: Path) -> str:
    """What is wrong when the checkpoint in ``folder`` holds entries (``unread``, DCP's
    flattened names) that ``state`` has no place for, and the fix."""
    named = ", ".join(unread[:_NAMED]) + (f" and {len(unread) - _NAMED} more"
                                          if len(unread) > _NAMED else "")
    empty = [key for key, value in state.items() if _an_optimizers_empty_state_dict(value)
             and any(entry.startswith(f"{key}.state.") for entry in unread)]
    if empty:
        key = empty[0]
        return (f"the checkpoint {folder} holds the optimizer's state ({named}), and "
                f"state[{key!r}] is an optimizer's state_dict() taken before its first step: "
                f"its 'state' is empty, so the load would fill nothing and the job would resume "
                f"without Adam's moments (or any optimizer's). Fix: give the optimizer itself, "
                f"with its model, on every rank: checkpoint.latest({{'model': model, {key!r}: "
                f"optimizer}}) (and save it so); it is initialised and loaded in place")
    return (f"the checkpoint {folder} holds {len(unread)} entries the state it is read into "
            f"has no place for: {named} (a load would leave them unread, as PyTorch's strict "
            f"load_state_dict refuses to). Fix: give the model and optimizer it was saved from "
            f"(the same layers and keys), checkpoint.latest(state, strict=False) to read only "
            f"what the state holds, or start over without it: --fresh "
            f"(HorovodRunner(..., fresh=True))")


def _strict_planner(state: dict[str, Any], folder: Path) -> Any:
    """DCP's default load planner, which also refuses a checkpoint holding entries the state
    does not read (DCP's own reads what the state asks and leaves the rest silently)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class StrictLoadPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            asked = set(self.state_dict)
            unread = sorted(key for key in self.metadata.state_dict_metadata
                            if key not in asked)
            if unread:
                raise CheckpointMismatch(unread_entries_refused(state, unread, folder))
            return plan

    return StrictLoadPlanner()


def load(state: dict[str, Any], folder: Path, strict: bool = True) -> None:
    """Read the checkpoint in ``folder`` into ``state`` in place, on any number of ranks:
    modules and optimizers through ``load_state_dict``, tensors copied into, other values
    replaced (outside a process group, each rank reads the whole state alone). With
    ``strict``, a checkpoint holding entries ``state`` has no place for is refused (another
    model, or an optimizer's empty ``state_dict()``), as PyTorch's ``load_state_dict`` does.

    Raises
    ------
    CheckpointMismatch
        The checkpoint does not fit ``state``: a shape or an entry differs.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    view = stateful(state)
    planner = _strict_planner(state, folder) if strict else None
    try:
        with _alone_on_purpose():
            dcp.load(view, checkpoint_id=str(folder), planner=planner,
                     no_dist=not in_process_group())
    except (CheckpointException, ValueError, KeyError, RuntimeError) as exc:
        # DCP's own error is a BaseException holding each rank's: the first says what differs
        failures = getattr(exc, "failures", None) or {}
        cause = next(iter(failures.values()), exc)
        if isinstance(cause, tuple):  # (the rank's exception, its traceback)
            cause = cause[0]
        if isinstance(cause, CheckpointMismatch):
            raise CheckpointMismatch(str(cause)) from None
        said = " ".join(str(cause).split()) or type(cause).__name__
        raise CheckpointMismatch(
            f"the checkpoint {folder} does not fit the state it is read into: "
            f"{sentence(said[:300])} "
            f"Fix: give the model and optimizer it was saved from (the same layers and "
            f"shapes; any number of ranks reads it), or start over without it: --fresh "
            f"(HorovodRunner(..., fresh=True))") from None
    for key, value in view.items():
        if not isinstance(value, (_ModuleState, _OptimizerState)):
            state[key] = value
