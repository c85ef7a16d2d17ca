"""The hosts' links measured once every rank of a job on several hosts waits in communication
for most of its steps (:mod:`hvd_magics.job.readings.link_probe` times them), and their verdict: a
host whose link (the slower of its two ways) is under :data:`SLOW_SHARE` of the others' is named;
otherwise the verdict says the links measured alike. A host that answered slowest because it
waited for a CPU is not named for its link: the verdict says its CPUs are busy."""
from __future__ import annotations

import statistics

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.readings.link_probe import LinkProbe, LinkSpeed, RoundTrip, best_mbit
from hvd_magics.job.verdicts.monitor import Turn

#: A host whose link moved less than this share of the other hosts' median is named. Not half:
#: on equal links, a host under a CPU quota came out at 616 Mbit/s against 1,268 with its wait
#: for a CPU taken out (its channel also waits for Python's lock, held by its other threads,
#: which no CPU-wait figure shows); a link slower than the probe's own pace (about a Gbit/s on
#: a small host) is several times slower (a 50 Mbit/s link: 13 to 29 against 1,000).
SLOW_SHARE = 0.25
#: A host that answered in less than this share of the others' pace, mostly waiting for a CPU,
#: is said to be busy.
LATE_SHARE = 0.5
#: Every rank must have spent at least this share of its latest steps in communication.
COMM_BOUND_SHARE = 0.5


class Links:
    """Starts the links' probe once a job; says its verdict when it is done."""

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        job = turn.job
        if job.link_probe is not None:
            say_links(job)
            return None
        hosts: dict[str, int] = {}
        for rank in job.running_ranks():
            if job.ranks[rank].host:
                hosts.setdefault(job.ranks[rank].host, rank)
        share = job.splits.comm_bound(COMM_BOUND_SHARE) if len(hosts) > 1 else None
        if share is not None:
            job.link_probe, job.link_share = LinkProbe(hosts, turn.backend.probe_link), share
            job.link_probe.start()
        return None


def say_links(job: JobState) -> None:
    """The links' verdict, once their probe is done."""
    if job.link_probe is not None and job.link_probe.done.is_set() and not job.links:
        job.links = verdict(job.link_probe.speeds, job.link_share, job.unit)


def verdict(speeds: list[LinkSpeed], comm_share: float, unit: str = "rank") -> str:
    """The links' verdict, as the dashboard and the record say it."""
    lead = (f"every {unit} waits in communication for most of its step (at least "
            f"{100 * comm_share:.0f}% of its latest steps)")
    measured = [s for s in speeds if s.slower > 0]
    if len(measured) < 2:
        answered = [s for s in speeds if s.slower_timed is not None]
        busy = _busy_host(answered)
        if busy is not None:
            return f"{lead}; the hosts' links could not be compared: {busy}"
        waited = [s.host for s in answered if s.slower == 0]  # every way mostly a wait
        if waited and len(answered) >= 2:
            who = f"host {waited[0]}" if len(waited) == 1 else f"hosts {', '.join(waited)}"
            return (f"{lead}; the hosts' links could not be compared: {who} waited for a CPU "
                    "for most of every round trip (its CPUs are busy: other work, or a CPU "
                    "quota)")
        return f"{lead}; the hosts' links could not be measured"
    slowest = min(measured, key=lambda s: s.slower)
    others = statistics.median(s.slower for s in measured if s is not slowest)
    if slowest.slower < SLOW_SHARE * others:
        return (f"{lead}; the link of host {slowest.host} is the slowest: "
                f"{_way(slowest.down)} to it and {_way(slowest.up)} from it, "
                f"against {others:,.0f} Mbit/s for the other hosts (measured from the driver "
                "while the job ran)")
    low, high = min(s.slower for s in measured), max(s.slower for s in measured)
    busy = _busy_host(measured)
    if busy is not None:
        return (f"{lead}; no one host's link holds the others back ({low:,.0f} to "
                f"{high:,.0f} Mbit/s, measured from the driver), but {busy}")
    return (f"{lead}; the hosts' links measured alike from the driver ({low:,.0f} to "
            f"{high:,.0f} Mbit/s): no one host's link holds the others back")


def _busy_host(measured: list[LinkSpeed]) -> str | None:
    """What to say of a host that answered under :data:`LATE_SHARE` of the others' pace, mostly
    waiting for a CPU (``None``: none did)."""
    if len(measured) < 2:
        return None
    # every host here answered (a way measured, or timed only): each has its slower way timed
    timed = {s.host: trip for s in measured if (trip := s.slower_timed) is not None}
    slowest = min(measured, key=lambda s: timed[s.host].mbit)
    trip = timed[slowest.host]
    others = statistics.median(timed[s.host].mbit for s in measured if s is not slowest)
    if trip.mbit >= LATE_SHARE * others or not trip.waited_mostly:
        return None
    waited = ("all" if trip.cpu_wait_s >= trip.seconds else
              f"{1000 * trip.cpu_wait_s:,.0f} ms")
    return (f"host {slowest.host} answered slowest ({trip.mbit:,.0f} Mbit/s against "
            f"{others:,.0f} for the other hosts) because it waited for a CPU for {waited} of "
            f"its {1000 * trip.seconds:,.0f} ms: its CPUs are busy (other work, or a CPU "
            "quota), which slows its ranks' communication too")


def _way(trips: tuple[RoundTrip, ...]) -> str:
    """One way of a host's link as the verdict says it."""
    best = best_mbit(trips)
    if best is not None:
        return f"{best:,.0f} Mbit/s"
    return "not known (its host waited for a CPU)" if trips else "no answer"
