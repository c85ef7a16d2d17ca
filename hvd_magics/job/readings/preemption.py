"""The ranks' calls of ``checkpoint.preempting()``, as the driver reads them: which call every rank
is still short of when an order sent now arrives (:mod:`hvd_magics.rank.api.preemption` is the
ranks' side; :mod:`hvd_magics.job.verdicts.notice` sends the order).

The ranks report how many calls they have made, at most twice a second. The call picked is the
most any rank reported, plus what each rank makes in the time since its report and in
:data:`MARGIN_S` more (the order's way to every rank), plus :data:`EXTRA_CALLS`: every rank is
still short of it when the order arrives, so every rank turns True at the same call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Seconds the order may take to reach every rank, covered by the call picked.
MARGIN_S = 1.0
#: Calls added beyond that.
EXTRA_CALLS = 2


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
