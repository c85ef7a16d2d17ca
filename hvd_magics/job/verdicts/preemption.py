"""The driver's side of a preemption notice: how often Spark is asked which executors it
decommissions, and the notice said in words (the call every rank saves at is picked from the
ranks' calls: :mod:`hvd_magics.job.readings.preemption`; the order is sent by
:mod:`hvd_magics.job.verdicts.notice`)."""
from __future__ import annotations

from hvd_magics.rank_names import ranks_named

#: Least seconds between two looks at Spark's decommissioning executors.
CHECK_EVERY_S = 0.5


def notice_text(found: dict[int, tuple[str, str]], unit: str = "rank") -> str:
    """``"executor 3 (host 10.0.0.4, ranks 4, 5) is being decommissioned"`` for each executor
    of ``found`` (rank -> ``(executor, host)``)."""
    by_executor: dict[tuple[str, str], list[int]] = {}
    for rank, place in sorted(found.items()):
        by_executor.setdefault(place, []).append(rank)
    parts = [f"executor {executor} ({f'host {host}, ' if host else ''}"
             f"{ranks_named(ranks, unit)})" for (executor, host), ranks in by_executor.items()]
    verb = "is" if len(parts) == 1 else "are"
    return f"{' and '.join(parts)} {verb} being decommissioned"
