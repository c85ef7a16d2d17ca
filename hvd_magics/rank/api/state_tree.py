"""A training state as ``checkpoint.keep`` copies it: its tree of values with every tensor and
array taken out to be copied into a host's memory, and back.

A state is what ``checkpoint.save`` takes: modules and optimizers themselves (their state dicts
are copied; they are loaded back in place), anything else with ``state_dict`` and
``load_state_dict`` (a learning-rate scheduler, a gradient scaler), tensors, NumPy arrays, and
plain values, in dicts, lists and tuples. A module's parameters and an optimizer's state change
only in the optimizer's step, so their copy may go on while the next step's forward and backward
run (:attr:`Leaf.later`); every other tensor (a module's buffers, which its forward may change,
tensors given alone) is copied before ``keep`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hvd_magics.common.kept_steps import ModuleState, OptimizerState, Slot
from hvd_magics.errors import KeepRefused

#: A state of an object with ``state_dict``/``load_state_dict`` that is neither a module nor
#: an optimizer (a scheduler, a gradient scaler): loaded back with ``load_state_dict``.
StatefulState = ModuleState


@dataclass
class Leaf:
    """One tensor or array to copy: the value, its place in the part, and whether its copy may
    wait until the optimizer's next step (``later``)."""

    value: Any
    slot: Slot
    later: bool


class _Walk:
    """Builds a tree and its leaves, laying the leaves out one after another (64-byte
    aligned)."""

    def __init__(self) -> None:
        self.leaves: list[Leaf] = []
        self.offset = 0
        #: Whether a leaf is a rank's part of a sharded tensor (each rank keeps its own part).
        self.sharded = False

    def leaf(self, value: Any, kind: str, dtype: str, shape: tuple[int, ...], nbytes: int,
             later: bool, sharded: bool = False) -> Slot:
        slot = Slot(kind, dtype, shape, self.offset, nbytes, sharded)
        self.sharded = self.sharded or sharded
        self.offset += -(-nbytes // 64) * 64
        self.leaves.append(Leaf(value, slot, later))
        return slot

    def walk(self, value: Any, where: str, later: frozenset[int] = frozenset()) -> Any:
        torch = _module("torch")
        if isinstance(value, dict):
            return {key: self.walk(item, f"{where}[{key!r}]", later)
                    for key, item in value.items()}
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(self.walk(item, f"{where}[{i}]", later)
                               for i, item in enumerate(value))
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, where, later)
        numpy = _module("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray) and value.dtype != object:
            return self.leaf(value, "numpy", value.dtype.str, value.shape, value.nbytes, False)
        if torch is not None and isinstance(value, torch.nn.Module):
            params = frozenset(_local(p).data_ptr() for p in value.parameters())
            return ModuleState(self.walk(value.state_dict(), where, params))
        if torch is not None and isinstance(value, torch.optim.Optimizer):
            return OptimizerState(self.walk(value.state_dict(), where, _ALL))
        if _refused(value) is not None:
            raise KeepRefused(f"checkpoint.keep got {_refused(value)} at {where}. {_FIX}")
        if callable(getattr(value, "state_dict", None)) and \
                callable(getattr(value, "load_state_dict", None)):
            return StatefulState(self.walk(value.state_dict(), where))
        return value

    def _tensor(self, value: Any, where: str, later: frozenset[int]) -> Slot:
        kind = type(value).__name__
        if kind == "ShardedTensor":
            raise KeepRefused(
                f"checkpoint.keep got a ShardedTensor (FSDP1's sharded state dict) at {where}. "
                f"{_FIX}")
        sharded = kind == "DTensor"
        data = value.to_local().detach() if sharded else value.detach()
        later_too = later is _ALL or data.data_ptr() in later or value.data_ptr() in later
        return self.leaf(data, "torch", str(data.dtype).removeprefix("torch."),
                         tuple(data.shape), data.numel() * data.element_size(), later_too,
                         sharded)


#: Every tensor of an optimizer's state: they change only in its step.
_ALL: frozenset[int] = frozenset({-1})
_FIX = ("Fix: keep the model and optimizer themselves (DDP, Horovod, FSDP2), their state "
        "dicts, tensors, arrays and plain values; save other sharded state with "
        "checkpoint.save(state, step, asynchronous=True)")


def _local(tensor: Any) -> Any:
    """A ``DTensor``'s local part, any other tensor itself."""
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor


def _refused(value: Any) -> str | None:
    """What ``keep`` cannot take (a DeepSpeed engine: each rank holds its ZeRO partition)."""
    names = {c.__name__ for c in type(value).__mro__}
    if "DeepSpeedEngine" in names:
        return "a DeepSpeed engine, whose ZeRO partitions each rank holds a part of"
    return None


def _module(name: str) -> Any:
    import sys
    return sys.modules.get(name)


def flatten(state: Any) -> tuple[Any, list[Leaf], int, bool]:
    """``state``'s tree (each tensor and array a :class:`Slot`), its leaves, their bytes, and
    whether it is sharded (a leaf is a rank's part of a ``DTensor``: each rank keeps its own).

    Raises
    ------
    KeepRefused
        The state holds what ``keep`` cannot copy (sharded tensors, a DeepSpeed engine).
    """
    walk = _Walk()
    tree = walk.walk(state, "state")
    return tree, walk.leaves, walk.offset, walk.sharded


def target(buffer: Any, slot: Slot) -> Any:
    """A writable view of ``slot``'s place in ``buffer`` (a writable buffer of the part's
    bytes), of the leaf's type."""
    if slot.kind == "numpy":
        import numpy
        return numpy.frombuffer(buffer, numpy.uint8, slot.nbytes, slot.offset).view(
            numpy.dtype(slot.dtype)).reshape(slot.shape)
    import torch
    dtype = getattr(torch, slot.dtype)
    if not slot.nbytes:
        return torch.empty(slot.shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8, count=slot.nbytes,
                            offset=slot.offset).view(dtype).reshape(slot.shape)


def copy_leaf(buffer: Any, leaf: Leaf) -> None:
    """Copy one leaf into its place in ``buffer``."""
    place = target(buffer, leaf.slot)
    if leaf.slot.kind == "numpy":
        place[...] = leaf.value
    elif leaf.slot.nbytes:
        place.copy_(leaf.value)


def rebuild(tree: Any, buffer: Any) -> Any:
    """The values of ``tree``, each :class:`Slot` read out of ``buffer`` (copied: the values
    outlive the buffer); a module's or optimizer's state as its state dict, wrapped."""
    if isinstance(tree, Slot):
        view = target(buffer, tree)
        return view.copy() if tree.kind == "numpy" else view.clone()
    if isinstance(tree, dict):
        return {key: rebuild(item, buffer) for key, item in tree.items()}
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        return type(tree)(rebuild(item, buffer) for item in tree)
    if isinstance(tree, (ModuleState, OptimizerState)):
        return type(tree)(rebuild(tree.tree, buffer))
    return tree


def plain(values: Any) -> Any:
    """``values`` with every module's and optimizer's state as its state dict."""
    if isinstance(values, (ModuleState, OptimizerState)):
        return plain(values.tree)
    if isinstance(values, dict):
        return {key: plain(item) for key, item in values.items()}
    if isinstance(values, (list, tuple)) and type(values) in (list, tuple):
        return type(values)(plain(item) for item in values)
    return values


def load_into(state: Any, values: Any) -> Any:
    """Load ``values`` (from :func:`rebuild`, or a checkpoint's pickle) into ``state``: modules,
    optimizers and other objects with ``load_state_dict`` in place (from their kept state or a
    state dict saved in their place), a dict's other entries replaced; what the job's state is
    now (``values`` themselves when ``state`` is not a dict, list or stateful)."""
    loads = callable(getattr(state, "load_state_dict", None))
    if loads and isinstance(values, ModuleState) and _has_dtensors(state):
        _copy_into_parts(state.state_dict(), values.tree)  # a sharded module: its parts in place
        return state
    if loads and isinstance(values, OptimizerState) and _shards_parameters(state):
        state.load_state_dict(_as_dtensors(state, values.tree))
        return state
    if loads and isinstance(values, (ModuleState, OptimizerState)):
        state.load_state_dict(values.tree)
        return state
    if loads and isinstance(values, dict):  # a state dict saved as such: into its owner
        state.load_state_dict(values)
        return state
    if isinstance(state, dict) and isinstance(values, dict):
        for key, item in values.items():
            state[key] = load_into(state.get(key), item)
        return state
    if isinstance(state, list) and isinstance(values, list) and len(state) == len(values):
        state[:] = [load_into(old, new) for old, new in zip(state, values)]
        return state
    return plain(values)


def _has_dtensors(module: Any) -> bool:
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def _shards_parameters(optimizer: Any) -> bool:
    return any(type(p).__name__ == "DTensor" for group in optimizer.param_groups
               for p in group["params"])


def _copy_into_parts(live: dict[str, Any], kept: dict[str, Any]) -> None:
    """Copy each kept tensor into this rank's part of the module's tensor of that name.

    Raises
    ------
    CheckpointMismatch
        A name the module lacks, or a part of another shape (another model, or another number
        of ranks: kept parts are read back on as many ranks as kept them).
    """
    from hvd_magics.errors import CheckpointMismatch
    for name, value in kept.items():
        target = live.get(name)
        part = _local(target) if target is not None else None
        if part is None or tuple(part.shape) != tuple(value.shape):
            raise CheckpointMismatch(
                f"the kept step's {name} ({list(value.shape)}) has no place of its shape in the "
                f"model ({list(part.shape) if part is not None else 'no such entry'}): another "
                f"model, or another number of ranks than kept it. Fix: resume on as many ranks "
                f"as kept it, or from a checkpoint file (checkpoint.save), which any number of "
                f"ranks reads")
        with _no_grad():
            part.copy_(value)


def _no_grad() -> Any:
    import torch
    return torch.no_grad()


def _as_dtensors(optimizer: Any, kept: dict[str, Any]) -> dict[str, Any]:
    """The kept optimizer state with each tensor of a parameter's shape made a ``DTensor`` of
    that parameter's sharding (what the optimizer holds of a sharded parameter)."""
    from torch.distributed.tensor import DTensor
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entries in kept["state"].items():
        param = params[int(index)]
        state[index] = {
            key: DTensor.from_local(value, param.device_mesh, param.placements,
                                    shape=param.shape, stride=param.stride())
            if type(param).__name__ == "DTensor" and hasattr(value, "shape")
            and tuple(value.shape) == tuple(param.to_local().shape) and value.dim() else value
            for key, value in entries.items()}
    return {**kept, "state": state}
