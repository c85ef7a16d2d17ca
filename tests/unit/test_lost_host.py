"""Which host the driver takes for lost (hvd_magics/job/verdicts/lost_host.py): the one
whose rank supervisors went silent while another host's still beat, never when the driver
itself stalled (every host silent) or the job has one host. The silences here are given; the
cut links are in tests/spark_hosts."""
import time

from hvd_magics.job.job_state import JobState
from hvd_magics.job.verdicts.lost_host import lost_host


class Heard:
    """What the event channel heard of each rank, seconds ago."""

    def __init__(self, ago):
        self.ago = ago

        self.lost = []

    def heard_ago(self, now):
        return dict(self.ago)

    def lose_host(self, host):
        self.lost.append(host)


def _job(tmp_path, hosts):
    job = JobState(len(hosts), tmp_path / "ranks.log")
    for rank, host in enumerate(hosts):
        job.handle({"kind": "started", "rank": rank, "host": host, "pid": 100 + rank,
                    "time": time.time(), "recv": time.monotonic()})
    return job


def test_the_silent_host_and_its_ranks_are_named_and_lost(tmp_path):
    job = _job(tmp_path, ["10.77.0.2", "10.77.0.2", "10.77.0.3", "10.77.0.3"])
    heard = Heard({0: 0.4, 1: 0.9, 2: 12.3, 3: 11.8})
    said = lost_host(job, heard, time.monotonic(), 10.0)
    assert heard.lost == ["10.77.0.3"]  # Spark is told to give it no more work
    assert said == ("host 10.77.0.3 (ranks 2, 3) stopped answering 12 s ago: its link or "
                    "machine was lost")
    assert [f.rank for f in job.failures()] == [2, 3]
    assert job.failures()[0].headline() == f"rank 2 on 10.77.0.3: RankLost: {said}"


def test_no_verdict_when_every_host_is_silent_or_there_is_one_host(tmp_path):
    job = _job(tmp_path, ["10.77.0.2", "10.77.0.2", "10.77.0.3", "10.77.0.3"])
    assert lost_host(job, Heard({0: 11, 1: 11, 2: 12, 3: 12}), time.monotonic(), 10.0) is None
    assert lost_host(job, Heard({0: 0.5, 1: 0.5, 2: 9, 3: 9}), time.monotonic(), 10.0) is None
    one = _job(tmp_path, ["10.77.0.2", "10.77.0.2"])
    assert lost_host(one, Heard({0: 30, 1: 30}), time.monotonic(), 10.0) is None
    assert not job.any_failed and not one.any_failed
