"""The hosts' condition, said once and naming no rank (:class:`BusyHosts`): the ranks' waits for
a CPU beyond one another cost a share of the job's time that no rank (or host) accounts for, or
the rank the others wait for ran its CPU pace probes slower than theirs (its CPU shared with other
work: :mod:`hvd_magics.rank.instruments.step_split`)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import cast

from hvd_magics.job.readings.step_splits import StepReadings
from hvd_magics.job.readings.wait_accounting import COST_SHARE, StepDelay
from hvd_magics.job.verdicts.straggler_verdict import COMPUTE, Straggler
from hvd_magics.rank_names import ranks_named

#: A rank's own work longer than the others' is its CPU's condition, not its work, when the
#: CPU it runs on ran the rank's pace probes (rank/instruments/step_split.py) slower than the
#: others' by at least this share of its excess (equal ranks beside a busy process: own work
#: 24-45% longer over 60 steps of 1 ms, the probe 36-62% slower with it); each rank's probes
#: are read over the window (:meth:`hvd_magics.job.readings.step_splits.StepReadings.pace`).
PACE_SHARE = 0.5


@dataclass(frozen=True)
class BusyHosts:
    """A condition, not a verdict on a rank: the ranks of ``hosts`` waited for a CPU (ready to
    run, not running) beyond one another, and the others waited for them in turn, for
    ``share`` of the job's time over its latest ``steps`` steps; said once, at ``step``."""

    hosts: tuple[str, ...]
    share: float
    steps: int
    step: int = 0
    #: When said for a CPU that ran the same work slower: the ranks whose own work was longer
    #: by ``longer`` (a share of the others') while their CPU ran its pace probe ``slower``.
    ranks: tuple[int, ...] = ()
    longer: float = 0.0
    slower: float = 0.0

    def text(self, unit: str = "rank") -> str:
        named = [h for h in self.hosts if h]
        where = (f"host {named[0]}'s CPUs are" if len(named) == 1 else
                 f"the CPUs of hosts {', '.join(named)} are" if named else "the CPUs are")
        if self.ranks:
            return (f"{where} busy (other work, more {unit}s than CPUs, or a CPU quota): "
                    f"{ranks_named(list(self.ranks), unit)}'s own work took "
                    f"{100 * self.longer:.0f}% longer per step than the others' over its last "
                    f"{self.steps} steps while its CPU ran the same fixed work "
                    f"{100 * self.slower:.0f}% slower than theirs (it shares that CPU with "
                    f"other work): that is the host's condition, no {unit} is named for it")
        return (f"{where} busy (other work, more {unit}s than CPUs, or a CPU quota): the "
                f"{unit}s waiting for a CPU beyond one another cost {100 * self.share:.0f}% of "
                f"the job's time over its last {self.steps} steps, the others waiting for them; "
                f"that is the host's condition, no {unit} is named for it")


def cpu_slower(readings: StepReadings, found: Straggler, window: list[StepDelay]) -> float | None:
    """How much slower (a share) the named ranks' CPU ran its pace probes than the others'
    over the ``window``, when that explains :data:`PACE_SHARE` of their longer own work or
    more and it is longer in compute (their CPU's condition, not their work: a rank that
    sleeps for its batches wakes on a CPU slower for a while); ``None`` when it does not, or
    when the probes are not there (GPU ranks, TensorFlow's)."""
    if found.cause != COMPUTE:  # a wait for batches is not run on a CPU
        return None
    others = [r for r in readings.rows if r not in found.ranks]
    mine = [readings.pace(r, window) for r in found.ranks]
    theirs = [readings.pace(r, window) for r in others]
    if not others or None in mine or None in theirs or found.others_s <= 0:
        return None
    base = statistics.median(cast(list[float], theirs))
    slower = statistics.median(cast(list[float], mine)) / base - 1 if base > 0 else 0.0
    longer = found.own_s / found.others_s - 1
    return slower if longer > 0 and slower >= PACE_SHARE * longer else None


def on_a_slower_cpu(found: Straggler, slower: float, steps: int, step: int) -> BusyHosts:
    """The condition of a rank whose own work was longer (``found``) because its CPU ran
    ``slower`` (:func:`cpu_slower`) over ``steps`` steps up to ``step``."""
    return BusyHosts((found.host,), 0.0, steps, step, ranks=found.ranks,
                     longer=found.own_s / found.others_s - 1, slower=slower)


def hosts_busy(window: list[StepDelay]) -> bool:
    """Whether the ``window``'s steps lost :data:`COST_SHARE` of its time or more to the ranks'
    waits for a CPU beyond one another."""
    wall = sum(d.wall_s for d in window)
    return wall > 0 and sum(d.cpu_s for d in window) >= COST_SHARE * wall


def busy_hosts(window: list[StepDelay], hosts: dict[int, str], step: int) -> BusyHosts:
    """The hosts whose ranks waited for a CPU beyond one another in a ``window`` whose steps
    lost time to it (:func:`hosts_busy`), and the share of its time they lost."""
    waited, wall = sum(d.cpu_s for d in window), sum(d.wall_s for d in window)
    where = sorted({hosts.get(d.rank, "") for d in window if d.cpu_s > 0})
    return BusyHosts(tuple(where), waited / wall, len(window), step)
