"""Who a window's lost time is owed to, for the straggler verdict
(:mod:`hvd_magics.job.verdicts.straggler`): a rank, or every rank of a host, for its own work; on
several hosts, a host for its ranks' waits for a CPU (each by
:func:`~hvd_magics.job.readings.wait_accounting.accuse`)."""
from __future__ import annotations

from hvd_magics.job.readings.wait_accounting import (SIGNIFICANCE, Finding, StepDelay, accuse,
                                                     binomial_tail, even_chances)
from hvd_magics.job.verdicts.straggler_verdict import NAME_SHARE

#: Who a window's lost time is owed to: the ranks named, whether as their host, what named them,
#: and how they delay the others (``"own"``: their own work; ``"cpu"``: their wait for a CPU).
Accused = tuple[list[int], bool, Finding[int] | Finding[str], str]


def accused(ranks: list[int], hosts: dict[int, str], window: list[StepDelay], least: float
            ) -> Accused | None:
    """Who the ``window``'s lost time is owed to (:func:`accuse`) among ``ranks``: a rank, or
    every rank of a host (when no one of them accounts for most of the host's), for its own
    work; on several hosts, a host for its ranks' wait for a CPU; a step counts when it lost
    ``least`` seconds or more. ``(ranks, whole host, finding, "own" or "cpu")``; ``None`` when
    nobody."""
    by_rank, by_host = even_chances(ranks, hosts)
    several = len(by_host) > 1
    rank = accuse(window, lambda d: (d.rank, d.own_s), by_rank, least, NAME_SHARE)
    host = accuse(window, lambda d: (d.host, d.host_own_s), by_host, least,
                  NAME_SHARE) if several else None
    alone = rank is not None and (
        not several or _alone(ranks, hosts, window, int(rank.who), least))
    if host is not None:
        mates = sorted(r for r in ranks if hosts.get(r, "") == host.who)
        if len(mates) > 1 and not (alone and rank is not None and rank.who in mates):
            return mates, True, host, "own"
    if rank is not None and alone:
        return [int(rank.who)], False, rank, "own"
    if not several:
        return None
    host = accuse(window, lambda d: (d.host, d.host_cpu_s), by_host, least, NAME_SHARE)
    if host is None:
        return None
    mates = sorted(r for r in ranks if hosts.get(r, "") == host.who)
    return mates, len(mates) > 1, host, "cpu"


def _alone(ranks: list[int], hosts: dict[int, str], window: list[StepDelay], rank: int,
           least: float) -> bool:
    """Whether ``rank`` delayed the others beyond chance among its host's ranks, when it
    has host mates: under a CPU quota they take turns to be late, and one of them, late in
    11 of its host's 13 late steps by chance, was named before the host was."""
    host = hosts.get(rank, "")
    mates = [r for r in ranks if hosts.get(r, "") == host]
    if len(mates) < 2:
        return True
    late = [d for d in window if d.host == host
            and d.host_own_s >= max(least, NAME_SHARE * d.base_s)]
    mine = sum(1 for d in late if d.rank == rank)
    return binomial_tail(mine, len(late), 1 / len(mates)) <= SIGNIFICANCE
