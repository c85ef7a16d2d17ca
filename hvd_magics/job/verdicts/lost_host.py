"""A host lost from a job on several hosts: every running rank's supervisor on it silent while
another host's still beat (the driver itself was not the one that stalled)."""
from __future__ import annotations

import os

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.verdicts.monitor import Turn
from hvd_magics.launch.backend import Backend
from hvd_magics.options import from_text, positive_seconds
from hvd_magics.protocol import ENV_HOST_SILENT

#: Seconds a host's rank supervisors may be silent (they beat every second) before the host is
#: taken for lost (``HVD_MAGICS_HOST_SILENT_S``): Spark itself waits 60 s, Gloo 30 s.
HOST_SILENT_S = 10.0


def host_silent_after() -> float:
    """Seconds a host's supervisors may be silent before it is taken for lost."""
    return positive_seconds(from_text(os.environ.get(ENV_HOST_SILENT, HOST_SILENT_S)),
                            ENV_HOST_SILENT)


def lost_host(job: JobState, backend: Backend, now: float, silent_after: float) -> str | None:
    """The verdict on a host all of whose running ranks' supervisors have been silent for
    ``silent_after`` seconds while another host's were heard within half that, its ranks marked
    lost; else ``None``. Jobs on one host (the driver's ranks, local Spark) are never judged
    so."""
    heard = backend.heard_ago(now)
    hosts: dict[str, list[int]] = {}
    for rank in job.running_ranks():
        if rank in heard and job.ranks[rank].host:
            hosts.setdefault(job.ranks[rank].host, []).append(rank)
    if len(hosts) < 2:
        return None
    quiet = {host: min(heard[r] for r in ranks) for host, ranks in hosts.items()}
    silent = [host for host, seconds in quiet.items() if seconds > silent_after]
    if not silent or min(quiet.values()) > silent_after / 2:
        return None
    host = max(silent, key=quiet.__getitem__)
    verdict = job.lose_host(host, sorted(hosts[host]), quiet[host])
    backend.lose_host(host)
    return verdict


class LostHost:
    """Marks a lost host's ranks lost and tells Spark (the job's end then names the host)."""

    def __init__(self) -> None:
        self.silent_after = host_silent_after()

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        lost_host(turn.job, turn.backend, turn.now, self.silent_after)
        return None
