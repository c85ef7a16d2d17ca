"""The driver's side of a preemption notice: when Spark starts decommissioning an executor of a
running job, pick the call of ``checkpoint.preempting()`` at which every rank saves, and tell
them (:mod:`hvd_magics.rank.api.preemption` is the ranks' side).

The ranks report how many calls they have made, at most twice a second. The call picked is the
most any rank reported, plus what each rank makes in the time since its report and in
:data:`MARGIN_S` more (the order's way to every rank), plus :data:`EXTRA_CALLS`: every rank is
still short of it when the order arrives, so every rank turns True at the same call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hvd_magics.rank_names import ranks_named

#: Seconds the order may take to reach every rank, covered by the call picked.
MARGIN_S = 1.0
#: Calls added beyond that.
EXTRA_CALLS = 2
#: Least seconds between two looks at Spark's decommissioning executors.
CHECK_EVERY_S = 0.5


@dataclass
class PreemptionWatch:
    """What the ranks said of their ``checkpoint.preempting()`` calls, and the notice sent."""

    #: Rank -> ``(calls, when reported)`` of its latest report, and its calls a second.
    calls: dict[int, tuple[int, float]] = field(default_factory=dict)
    rates: dict[int, float] = field(default_factory=dict)
    #: When Spark was last asked; the notice told (``""``: none yet).
    checked: float = -math.inf
    notice: str = ""
    #: The call every rank saves at (``None``: no order sent).
    at: int | None = None

    def observe(self, rank: int, calls: int, when: float) -> None:
        """A rank's ``preempt_calls`` report."""
        before = self.calls.get(rank)
        if before is not None and when > before[1] and calls > before[0]:
            self.rates[rank] = (calls - before[0]) / (when - before[1])
        self.calls[rank] = (calls, when)

    def target(self, now: float) -> int | None:
        """The call every rank is still short of once an order sent ``now`` arrives; ``None``
        when no rank has called ``checkpoint.preempting()``."""
        if not self.calls:
            return None
        ahead = [calls + math.ceil(self.rates.get(rank, 0.0) * (now - when + MARGIN_S))
                 for rank, (calls, when) in self.calls.items()]
        return max(ahead) + EXTRA_CALLS


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
