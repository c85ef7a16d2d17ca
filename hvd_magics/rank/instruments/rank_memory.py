"""A rank's host memory and, in sharded training, the part of the model's parameters it holds.

Memory is the process's resident set now and its peak (the kernel's high-water mark, which a
rank forked from a zygote starts at the pages it shares with it). The parameter shard is read
from FSDP2's modules (``fully_shard``): each parameter is a DTensor whose local part is this
rank's; it is ``None`` when the job shards no module that way (DDP, Horovod, FSDP1's flat
parameters, DeepSpeed's partitions). Nothing here imports a framework: a rank that has not
imported ``torch.distributed.fsdp`` reads no shard.
"""
from __future__ import annotations

import os
import resource
import sys
import weakref
from typing import Any

from hvd_magics.events import MemoryReading

_PAGE = os.sysconf("SC_PAGE_SIZE")
#: The latest shard read, and the modules it was read from (weak references: an id may be
#: another module's later): a module's parameters keep their shapes, so they are walked again
#: only when the modules change (a step split is sent four times a second; a large model's
#: walk is not free).
_shard_of: tuple[tuple[weakref.ref[Any], ...], tuple[int, int] | None] = ((), None)


def _resident_bytes() -> int | None:
    """The process's resident set now (``/proc/self/statm``; ``None`` where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _peak_bytes() -> int:
    """The process's peak resident set (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def parameter_shard() -> tuple[int, int] | None:
    """``(bytes this rank holds, bytes of the whole)`` of the parameters of the job's FSDP2
    modules, or ``None`` when there are none."""
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    try:
        from torch.distributed import _composable_state
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        modules = [m for m in list(_composable_state._module_state_mapping)
                   if isinstance(m, FSDPModule)]
    except (ImportError, AttributeError, RuntimeError):  # another torch: no shard to read
        return None
    global _shard_of
    known = _shard_of[0]
    if modules and len(known) == len(modules) and all(
            ref() is module for ref, module in zip(known, modules)):
        return _shard_of[1]
    seen: set[int] = set()
    local = full = 0
    whole = False  # a parameter gathered whole (between FSDP's all-gather and its reshard)
    for module in modules:
        for parameter in module.parameters():
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if not isinstance(parameter, DTensor):
                whole = True
                continue
            size = parameter.element_size()
            local += parameter.to_local().numel() * size
            full += parameter.numel() * size
    found = (local, full) if full else None
    if found is not None and not whole:
        _shard_of = (tuple(weakref.ref(module) for module in modules), found)
    return found


def reading() -> MemoryReading:
    """``{"rss", "peak"}`` (bytes), with ``"params"`` and ``"params_full"`` (bytes) in sharded
    training."""
    rss = _resident_bytes()
    # (the kernel raises its high-water mark lazily: the resident set read now may be above it)
    found = MemoryReading(rss=rss, peak=max(_peak_bytes(), rss or 0))
    shard = parameter_shard()
    if shard is not None:
        found["params"], found["params_full"] = shard
    return found
