"""Keep what a Spark Python worker loads once out of its garbage collector's sight.

Spark reuses a Python worker for the next task and runs a full ``gc.collect()`` after each one.
With a framework and a model loaded (a :meth:`HorovodModel.transform
<hvd_magics.estimator.HorovodModel.transform>`), that collection walked all of their objects
again after every task: 0.1-0.3 s a task, 13.6 CPU s in two workers of the local Spark tests.
What a worker loads to keep (modules, a cached model) is frozen once it is loaded
(:func:`gc.freeze`, after one collection of what is garbage by then), so later collections look
only at what later tasks make.
"""
from __future__ import annotations

import gc

#: What this worker has frozen (by name): each is frozen once.
_FROZEN: set[str] = set()


def freeze_once(what: str) -> None:
    """Collect, then freeze every object alive now, the first time ``what`` (a model's digest,
    a module's name) is loaded in this process."""
    if what in _FROZEN:
        return
    _FROZEN.add(what)
    gc.collect()
    gc.freeze()
