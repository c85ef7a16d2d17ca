"""Background jobs on driver ranks: the handle's value, error, stop and stacks."""
import time

import pytest
from IPython.core.error import UsageError

import hvd_magics
from hvd_magics import HorovodJobError, HorovodRunner, JobInterrupted
from tests import jobs
from tests.conftest import rank_processes_alive


def _until(condition, seconds: float = 60.0, what=lambda: "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"the condition never held; {what()}"
        time.sleep(0.05)


def test_a_background_job_returns_at_once_and_its_value_comes_through_wait():
    job = HorovodRunner(np=-2).start(jobs.torch_allreduce)
    assert not job.done() and job in hvd_magics.jobs()  # start returned before the job ended
    seen = job.wait(timeout=120)
    assert [s["sum"] for s in seen] == [3.0, 3.0] and job.done()
    assert job.record.status == "succeeded" and job not in hvd_magics.jobs()
    assert "succeeded" in repr(job)


def test_the_error_of_a_failed_background_job_is_raised_by_wait():
    job = HorovodRunner(np=-2).start(jobs.fail_on_rank, bad_rank=1)
    with pytest.raises(HorovodJobError, match="rank 1"):
        job.wait(timeout=120)
    assert job.record.status == "failed"


def test_stacks_name_where_each_rank_is_and_stop_leaves_nothing_running():
    job = HorovodRunner(np=-2).start(jobs.wait_for_a_sleeping_peer)

    def both_in_place() -> bool:  # rank 1 asleep, and rank 0 seen in its allreduce
        where = job.stacks().where()
        return "slow_down" in where.get(1, "") and "mpi_ops.py" in where.get(0, "")

    _until(both_in_place)
    with pytest.raises(TimeoutError, match=r"still runs after 0\.1 s"):
        job.wait(timeout=0.1)
    stacks = job.stacks()
    assert "slow_down (time.sleep(600))" in stacks.where()[1]
    assert "wait_for_a_sleeping_peer" in stacks.where()[0] and "mpi_ops.py" in stacks.where()[0]
    assert "rank 0 waits in a Horovod collective for rank 1" in str(stacks)
    assert stacks.seconds < 1.0
    pids = list(job.record.pids.values()) or [r.pid for r in job._live.job.ranks]
    job.stop()
    with pytest.raises(JobInterrupted, match="nothing is left running"):
        job.wait(timeout=5)
    assert job.record.status == "interrupted"
    assert rank_processes_alive([p for p in pids if p]) == []


def test_two_background_jobs_run_at_once():
    first = HorovodRunner(np=-1).start(jobs.torch_allreduce)
    second = HorovodRunner(np=-1).start(jobs.torch_allreduce)
    assert first.wait(timeout=120)[0]["size"] == 1 and second.wait(timeout=120)[0]["size"] == 1


def test_the_magic_starts_a_background_job_and_the_notebook_goes_on(ip, capsys):
    with pytest.raises(UsageError, match="no background job runs"):
        ip.run_line_magic("hvd_stacks", "")
    ip.user_ns["x"] = 5
    job = ip.run_cell_magic("horovod", "np=-2 --background -o job --return y",
                            "import time\ndef train_loop():\n    time.sleep(3)\n"
                            "train_loop()\ny = x * 2\n'done'")
    assert ip.user_ns["job"] is job and not job.done()
    assert "job.wait() for its value" in capsys.readouterr().out
    ip.run_cell("z = 1 + 1")  # the kernel runs other cells meanwhile
    assert ip.user_ns["z"] == 2 and not job.done()
    _until(lambda: "train_loop" in str(ip.run_line_magic("hvd_stacks", "job")))
    assert job.wait(timeout=60) == "done" and ip.user_ns["y"] == 10
    with pytest.raises(UsageError, match="the job has ended"):
        ip.run_line_magic("hvd_stacks", "job")
    with pytest.raises(UsageError, match="'z' is not a background job's handle"):
        ip.run_line_magic("hvd_stacks", "z")


def test_the_timeline_of_a_running_background_job_is_shown_so_far(ip, tmp_path):
    import json

    ip.run_line_magic("hvd_timeline", f"on {tmp_path}/")
    try:
        job = ip.run_cell_magic("horovod", "np=-2 --background -o job",
                                "import time\nimport horovod.torch as hvd, torch\nhvd.init()\n"
                                "for step in range(100000):\n"
                                "    hvd.allreduce(torch.ones(10), name='g')\n"
                                "    time.sleep(0.1)\n")
        seen = []

        def sleeping() -> bool:  # rank 0 between two allreduces: at least one done
            seen.append(job.stacks().where().get(0, ""))
            return "<%%horovod cell>:7" in seen[-1]

        _until(sleeping, what=lambda: f"rank 0 was at {seen[-3:]}; the job: {job!r}")
        shown = []

        def allreduced() -> bool:  # Horovod's writer thread has written an ALLREDUCE so far
            shown.append(ip.run_line_magic("hvd_timeline", "show"))
            return "ALLREDUCE" in shown[-1].activity_us

        _until(allreduced, what=lambda: f"the timeline so far: {shown[-1].activity_us}")
        assert shown[-1].path.endswith(".so-far.json") and not job.done()
        json.loads(open(shown[-1].path).read())  # valid JSON although rank 0 still writes it
    finally:
        ip.run_line_magic("hvd_timeline", "off")
        for running in hvd_magics.jobs():
            running.stop()
