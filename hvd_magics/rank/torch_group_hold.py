"""A rank keeps each ``torch.distributed`` process group its code destroys until that code
has ended (the rank's end; a warm pool's cell), so that a DDP model freed after
``destroy_process_group()`` never deadlocks its rank.

The pattern of pyspark's ``TorchDistributor`` examples (train a ``DistributedDataParallel``
model, call ``destroy_process_group()``, return) hung one rank, forked from a zygote, in 3 of 11
runs of the DDP notebook on a loaded machine (PyTorch 2.13, Gloo). Once the group is destroyed,
the model's ``Reducer`` holds the last reference to it, and the ``Reducer`` is freed as the
function returns, with the GIL held (its binding keeps it, unlike the group's own). The group's
destructor then joins its worker threads while one of them still frees its last collective,
whose saved thread state holds a Python object (the context autograd stashes for every backward
pass): that thread waits for the GIL, the main thread for that thread, forever. Its peers had
finished; the job never ended.

While a Python reference to the group is kept here, the ``Reducer`` is never its last owner.
A rank's process ends without destroying anything (:func:`hvd_magics.rank.rank_main.run_rank`
exits with ``os._exit``); a warm pool's rank lets go of the groups when each cell's code has
ended (:func:`release`, before the cell's end is reported), and the group's binding destroys
them with the GIL released, so their worker threads finish. Not later: a kept group keeps its
store's server (rank 0's, on the pool's ``MASTER_PORT``), and a peer's next
``init_process_group`` reached that old store, read the old group's addresses and failed in its
first collective ("Connection reset by peer"). An ``init_process_group`` in the same code lets go
of them too, first.

The default group is kept with its store, through which the ranks leave together at the job's
end as they leave a live group (:func:`hvd_magics.rank.leave_together.end_engine`): rank 0 holds the
store's server, and a job that starts and destroys its group at once (pyspark's docstring
example) had rank 0 end while a slower peer was still inside ``init_process_group`` reading the
store ("DistNetworkError: Connection reset by peer").
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

from hvd_magics.rank.guards.import_hooks import after_import

#: The modules whose ``destroy_process_group`` and ``init_process_group`` are wrapped (the
#: package re-exports the functions of ``distributed_c10d``).
_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_MARK = "_hvd_magics_group_hold"

#: The destroyed groups kept alive, until the code ends or starts another group.
_HELD: list[Any] = []


@dataclass(frozen=True)
class KeptGroup:
    """The default group as it was destroyed, and the store its ranks met in (rank 0 holds
    the store's server: the ranks leave together through it, :func:`kept_default`)."""

    group: Any
    store: Any

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return int(self.group.rank())

    @property
    def size(self) -> int:
        """How many ranks the group has."""
        return int(self.group.size())


#: The default group destroyed last, as long as the groups are kept (at most one).
_DEFAULT: list[KeptGroup] = []


def groups_destroyed(c10d: Any, group: Any) -> list[Any]:
    """The process groups ``destroy_process_group(group)`` destroys: ``group``, or every group
    when it is ``None`` (nothing when torch's bookkeeping cannot be read: the default group is
    still kept, with its store, by :func:`default_destroyed`)."""
    if group is not None:
        return [group]
    try:
        return list(c10d._world.pg_map)  # noqa: SLF001 - every group, the default one included
    except Exception:  # noqa: BLE001 - another torch
        return []


def default_destroyed(c10d: Any, group: Any) -> KeptGroup | None:
    """The default group and its store when ``destroy_process_group(group)`` destroys it."""
    try:
        default = c10d._get_default_group()  # noqa: SLF001
        if group is not None and group is not default:
            return None
        return KeptGroup(default, c10d._get_default_store())  # noqa: SLF001
    except Exception:  # noqa: BLE001 - none, or another torch
        return None


def kept_default() -> KeptGroup | None:
    """The default group the job's code destroyed (``None`` when it did not, or started
    another since): the ranks leave through its store as through a live group's."""
    return _DEFAULT[0] if _DEFAULT else None


def release() -> None:
    """Drop the groups kept here (destroyed with the GIL released when no one else holds them)."""
    _HELD.clear()
    _DEFAULT.clear()


def _wrap(module: Any) -> None:
    destroy, init = getattr(module, "destroy_process_group", None), getattr(
        module, "init_process_group", None)
    if destroy is not None and not getattr(destroy, _MARK, False):
        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            group = args[0] if args else kwargs.get("group")
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            _HELD.extend(g for g in groups_destroyed(c10d, group)
                         if not any(g is held for held in _HELD))
            default = default_destroyed(c10d, group)
            if default is not None:
                _DEFAULT[:] = [default]
            return destroy(*args, **kwargs)

        setattr(destroy_process_group, _MARK, True)
        module.destroy_process_group = destroy_process_group
    if init is not None and not getattr(init, _MARK, False):
        @functools.wraps(init)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            release()
            return init(*args, **kwargs)

        setattr(init_process_group, _MARK, True)
        module.init_process_group = init_process_group


def install() -> None:
    """Wrap ``destroy_process_group`` and ``init_process_group`` once ``torch.distributed`` is
    imported (at once when it already is: a rank forked from a zygote)."""
    after_import(_MODULES, _wrap)
