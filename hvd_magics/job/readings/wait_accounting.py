"""Who the other ranks waited for, step by step, and whether it is more than noise.

In data-parallel training a step's collective ends when the last rank reaches it: the step is
longer by whatever the slowest rank's own work (input and compute) exceeded the next slowest's.
That excess is the time the job lost to that rank in that step (:class:`StepDelay`): had it
been as fast as the next, the step would have been that much shorter. Where the ranks' CPU time
is read, the part of it that rank spent waiting for a CPU beyond the next one's (ready to run,
not running) is kept apart: it is its host's condition (other work on its CPUs, a CPU quota),
not the rank's code.

A window's delays are summed per rank (and per host): :func:`accuse` names the one that accounts for
most of the time lost (:data:`DOMINANT`), when that time is a meaningful share of the window's
(:data:`COST_SHARE`), and only when chance does not explain it: on equal ranks the slowest of each
step is any of them, so a rank slowest in most of the steps that lost time is named only when so
many would be that improbable (:data:`SIGNIFICANCE`, a binomial tail over those steps, or over the
steps it stalled them for twice a usual step's work or more, which noise spreads over every rank
too), or when its own steps of one phase of a short rhythm were all late, or it stalled the others
for twice a usual step's work at one exact period, :data:`STALLS` times (a loader that blocks every
tenth batch; a one-off evaluation is neither). Noise spreads over every rank; a stall that recurs
counts in full.
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Generic, TypeVar
from collections.abc import Callable, Hashable, Sequence

#: The least share of a window's time the others must have lost to one rank (or host).
COST_SHARE = 0.05
#: ...the least share of all the time lost in the window that must be its.
DOMINANT = 2 / 3
#: The largest chance that equal ranks would put it as often among the steps that lost time
#: (a job is looked at once a step over three windows: one of 10,000 steps makes some 700
#: looks of steps no look read before).
SIGNIFICANCE = 1e-4
#: The least steps it must have delayed the others in.
RECUR = 3
#: A stall is a step it delayed by at least this many times the step's usual own work...
STALL_TIMES = 2.0
#: ...and this many of them at one period name it (the first and three periods later), and
#: as many as span :data:`SPAN` steps at a short period (random stalls line up at short periods).
STALLS = 4
SPAN = 15


@dataclass(frozen=True)
class StepDelay:
    """One step: how long it lasted (``wall_s``, its longest rank's), the usual own work of its
    ranks (``base_s``, the median of all but the slowest), and who delayed it by how much beyond the
    next slowest: ``rank``, by ``own_s`` of its own work and ``cpu_s`` of waiting for a CPU; the
    same of hosts
    (``host``, ``host_own_s``, ``host_cpu_s``; ``""`` with fewer than two hosts)."""

    step: int
    wall_s: float
    base_s: float
    rank: int
    own_s: float
    cpu_s: float
    host: str = ""
    host_own_s: float = 0.0
    host_cpu_s: float = 0.0


#: One rank's row of a step: :data:`hvd_magics.protocol.STEP_COLUMNS` (the training thread's wait
#: for a CPU and time on one outside collectives, and of those, in waits for input:
#: :mod:`hvd_magics.rank.instruments.step_split`).
Row = tuple[float, float, float, float, float, float, float]

#: Who delayed the others: a rank (``int``) or a host (``str``).
Who = TypeVar("Who", bound=Hashable)


def _split(own: dict[Who, float], waits: dict[Who, float], cpu_read: bool
           ) -> tuple[Who, float, float]:
    """The slowest of ``own`` (who -> own work), how much longer than the next, and of that,
    its wait for a CPU beyond the next one's (``0`` when the CPU time is not read)."""
    order = sorted(own, key=own.__getitem__, reverse=True)
    first, second = order[0], order[1]
    delay = own[first] - own[second]
    cpu = min(delay, max(0.0, waits[first] - waits[second])) if cpu_read else 0.0
    return first, delay - cpu, cpu


def step_delay(step: int, rows: dict[int, Row], hosts: dict[int, str], cpu_read: bool
               ) -> StepDelay:
    """Who delayed ``step`` (``rows``: rank -> its row of the step), and by how much."""
    own = {rank: row[0] - row[2] for rank, row in rows.items()}
    waits = {rank: row[3] for rank, row in rows.items()}
    rank, own_s, cpu_s = _split(own, waits, cpu_read)
    delay = StepDelay(step, max(row[0] for row in rows.values()),
                      statistics.median(own[r] for r in own if r != rank), int(rank), own_s, cpu_s)
    names = {hosts.get(rank, "") for rank in rows}
    if len(names) < 2:
        return delay
    # a host's step waits for the slowest of its ranks (under a CPU quota they take turns)
    longest: dict[str, int] = {}
    for r in rows:
        host = hosts.get(r, "")
        if host not in longest or own[r] > own[longest[host]]:
            longest[host] = r
    host, host_own, host_cpu = _split({h: own[r] for h, r in longest.items()},
                                      {h: waits[r] for h, r in longest.items()}, cpu_read)
    return StepDelay(delay.step, delay.wall_s, delay.base_s, delay.rank, own_s, cpu_s,
                     str(host), host_own, host_cpu)


@dataclass(frozen=True)
class Finding(Generic[Who]):
    """Who the others waited for over a window: ``who`` (a rank or a host), the time they lost
    to it (``lost_s``) of the window's ``window_s`` over its ``steps`` steps, in how many steps
    it delayed them (``delayed``, of ``counted`` steps that lost time), and the ``period`` of its
    stalls (``0``: it was slowest in most steps instead)."""

    who: Who
    lost_s: float
    window_s: float
    steps: int
    delayed: int
    counted: int
    period: int = 0


def even_chances(ranks: list[int], hosts: dict[int, str]
                 ) -> tuple[dict[int, float], dict[str, float]]:
    """Each rank's, and each host's, chance to be the slowest of a step on equal ranks."""
    by_host: dict[str, float] = {}
    for rank in ranks:
        by_host[hosts.get(rank, "")] = by_host.get(hosts.get(rank, ""), 0.0) + 1 / len(ranks)
    return {rank: 1 / len(ranks) for rank in ranks}, by_host


def binomial_tail(hits: int, trials: int, chance: float) -> float:
    """The chance of at least ``hits`` of ``trials`` when each comes with ``chance``."""
    return sum(math.comb(trials, k) * chance ** k * (1 - chance) ** (trials - k)
               for k in range(hits, trials + 1))


def regular_period(steps: Sequence[int]) -> int:
    """The period of ``steps`` (ascending) when they come at one, at least two steps apart,
    every gap the same (a loader late every tenth batch is late at steps 10, 20, 30; four
    stalls at random in 240 steps fall so with a chance of about 7e-5); ``0`` when not."""
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    if not gaps:
        return 0
    period = gaps[0]
    return period if period >= 2 and all(g == period for g in gaps) else 0


#: The periods (steps) at which a rank late in every step of one phase is looked for.
RHYTHMS = (2, 3, 4, 5)


def rhythm(delays: Sequence[StepDelay], late: set[int], rate: float) -> int:
    """The period (:data:`RHYTHMS`) at which every step of one phase of the window's
    ``delays`` is in ``late`` (its steps that delayed the others), when equal ranks, each step
    late with chance ``rate``, would be so with a chance under :data:`SIGNIFICANCE` (the
    periods and phases tried counted in): a loader that makes every third batch late holds
    the others back as surely as one that makes every batch a little late; ``0`` when none."""
    steps = [d.step for d in delays]
    tried = sum(RHYTHMS)
    for period in RHYTHMS:
        for phase in range(period):
            at = [s for s in steps if s % period == phase]
            if len(at) >= STALLS and all(s in late for s in at) \
                    and tried * rate ** len(at) <= SIGNIFICANCE:
                return period
    return 0


def accuse(delays: Sequence[StepDelay], of: Callable[[StepDelay], tuple[Who, float]],
           chance: dict[Who, float], least: float, share: float) -> Finding[Who] | None:
    """Who the window's ``delays`` were lost to, when one accounts for it beyond chance.

    Parameters
    ----------
    delays
        The window's steps, in order.
    of
        A step -> who delayed it and by how much (a rank or a host; its own work or its wait
        for a CPU).
    chance
        Who -> the chance it would be the slowest of a step that lost time on equal ranks
        (one over the ranks; a host's share of them).
    least
        The least delay that counts a step as one that lost time, in seconds; a step counts
        when its delay is at least this and ``share`` of its usual own work.
    share
        See ``least``.
    """
    window_s = sum(d.wall_s for d in delays)
    lost: dict[Who, float] = {}
    for d in delays:
        who, seconds = of(d)
        lost[who] = lost.get(who, 0.0) + seconds
    total = sum(lost.values())
    if not lost or total <= 0:
        return None
    who = max(lost, key=lost.__getitem__)
    if lost[who] < COST_SHARE * window_s or lost[who] < DOMINANT * total:
        return None
    counted = [d for d in delays if of(d)[1] >= max(least, share * d.base_s)]
    mine = [d for d in counted if of(d)[0] == who]
    if len(mine) < RECUR:
        return None
    finding = Finding(who, lost[who], window_s, len(delays), len(mine), len(counted))
    if binomial_tail(len(mine), len(counted), chance.get(who, 0.5)) <= SIGNIFICANCE:
        return finding
    period = rhythm(delays, {d.step for d in mine},
                    chance.get(who, 0.5) * len(counted) / len(delays))
    if period:
        return Finding(who, lost[who], window_s, len(delays), len(mine), len(counted), period)
    stalls = [d for d in counted if of(d)[1] >= STALL_TIMES * d.base_s]
    own = [d for d in stalls if of(d)[0] == who]
    if len(own) >= RECUR and binomial_tail(len(own), len(stalls), chance.get(who, 0.5)) \
            <= SIGNIFICANCE:  # the stalls alone, by one rank beyond chance (at no one period)
        return Finding(who, lost[who], window_s, len(delays), len(own), len(counted))
    # at one period: most of the window's stalls its, its own at exactly one period (a stall
    # of another rank's now and then, a busy host's, does not hide a rhythm)
    if len(own) < STALLS or len(own) < DOMINANT * len(stalls):
        return None
    period = regular_period([d.step for d in own])
    if not period or len(own) < max(STALLS, math.ceil(SPAN / period) + 1):
        return None
    return Finding(who, lost[who], window_s, len(delays), len(own), len(counted), period)
