"""Sixteen Horovod ranks on four hosts of four cores (tests/hosts.py), four ranks per Spark task:
what stays cheap of issue 85's 64 ranks on 16 hosts (those run in benchmarks/scale.py). The
ranks meet through our rendezvous, and ``%hvd_stacks`` says the ranks in the same place once."""
import os
import time
from pathlib import Path

import pytest

from hvd_magics import HorovodRunner, last_run
from tests import engine_jobs


@pytest.fixture(scope="module")
def four_hosts():
    from tests.conftest import _stop_active
    from tests.hosts import HostCluster

    cluster = HostCluster(hosts=4, cores=4)
    yield cluster
    _stop_active()
    cluster.stop()
    assert cluster.left() == []


@pytest.fixture()
def four_hosts_spark(four_hosts):
    from tests.conftest import hosts_session

    return hosts_session(four_hosts, wait_s=90)


def test_sixteen_horovod_ranks_on_four_hosts_meet_and_their_stacks_are_said_by_place(
        four_hosts_spark):
    """Rank 15 holds back; the other 15 wait for it in the allreduce. Their stacks read as two
    places, not sixteen; once rank 15 goes on, the sum over all 16 is right and each host ran
    local ranks 0-3."""
    release = Path("/dev/shm") / f"hvd-magics-release-{os.getpid()}"  # every host's /dev/shm
    release.unlink(missing_ok=True)
    job = HorovodRunner(np=16, ranks_per_task=4, timeout=300, start_timeout=240).start(
        engine_jobs.horovod_one_late, release=str(release), late=15)
    try:
        deadline = time.monotonic() + 240
        summary = ""
        while "ranks 0-14: " not in summary:  # every rank in hvd.init() gone by, 0-14 waiting
            assert time.monotonic() < deadline and not job.done(), summary or job.wait(1)
            summary = job.stacks(wait=10).summary()
        lines = summary.splitlines()
        assert lines[0].startswith("  ranks 0-14: ") and "horovod/torch/mpi_ops.py" in lines[0]
        assert lines[1].startswith("  rank 15: ") and "time.sleep(0.05)" in lines[1], lines
        assert lines[2] == ("  So: ranks 0-14 wait in a Horovod collective for rank 15, which "
                            "is elsewhere and never entered it."), lines
        stacks = str(job.stacks(wait=10))
        assert stacks.count(" have this stack:") == 1 and "rank 15 (" in stacks, stacks
        release.touch()
        result = job.wait(timeout=120)
    finally:
        release.touch()
        if not job.done():
            job.stop()
        release.unlink(missing_ok=True)
    assert result["size"] == 16 and result["sum"] == sum(range(16))
    by_host: dict[str, list[tuple[int, int]]] = {}
    for host, local_rank, local_size in result["places"]:
        by_host.setdefault(host, []).append((local_rank, local_size))
    assert sorted(by_host.values()) == [[(0, 4), (1, 4), (2, 4), (3, 4)]] * 4, by_host
    assert last_run().where.endswith("(4 tasks x 4 ranks)"), last_run().where
