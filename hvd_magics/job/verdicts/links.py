"""The hosts' links measured once every rank of a job on several hosts waits in communication
for most of its steps (:mod:`hvd_magics.job.verdicts.link_probe` times them)."""
from __future__ import annotations

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.verdicts.link_probe import COMM_BOUND_SHARE, LinkProbe
from hvd_magics.job.verdicts.link_probe import verdict as link_verdict
from hvd_magics.job.verdicts.monitor import Turn


class Links:
    """Starts the links' probe once a job; says its verdict when it is done."""

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
        job.links = link_verdict(job.link_probe.speeds, job.link_share, job.unit)
