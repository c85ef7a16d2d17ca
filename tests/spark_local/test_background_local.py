"""Background jobs on local Spark: the notebook goes on, held slots refuse a job at once."""
import os
import signal
import time

import pytest

from hvd_magics import HorovodRunner, JobInterrupted, NotEnoughSlotsError
from tests import jobs
from tests.conftest import active_spark_jobs


def test_a_background_job_holds_its_slots_and_another_is_refused_at_once(local_spark):
    job = HorovodRunner(np=2).start(jobs.wait_for_a_sleeping_peer)
    try:
        began = time.monotonic()
        with pytest.raises(NotEnoughSlotsError, match=r"background jobs hold 2 of the slots.*"
                                                      r"job\.stop\(\)"):
            HorovodRunner(np=2).run(jobs.print_lines, count=1)
        assert time.monotonic() - began < 10
        deadline = time.monotonic() + 120
        where = job.stacks().where()
        while "slow_down" not in where.get(1, "") or "mpi_ops.py" not in where.get(0, ""):
            # rank 0 answers from Horovod's allreduce once it has started, over the event
            # channel, from the task
            assert time.monotonic() < deadline, where
            time.sleep(0.1)
            where = job.stacks().where()
        # the stop button on another cell (pyspark's Ctrl-C cancels every job) leaves it running
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        assert not job.done() and "slow_down" in job.stacks().where()[1]
    finally:
        job.stop()
    with pytest.raises(JobInterrupted, match="cancelled Spark job group"):
        job.wait(timeout=5)
    assert active_spark_jobs(local_spark) == []  # the cancelled job, once Spark's status heard
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0  # the slots are free again


def test_a_background_job_that_loses_a_rank_restarts_on_the_slots_it_held(local_spark, tmp_path):
    """Its restart was refused: 'np=2 needs 2 free Spark task slots ... This notebook's warm
    pools and background jobs hold 2 of the slots' (its own)."""
    from hvd_magics import last_run
    from tests import engine_jobs

    job = HorovodRunner(np=2, engine="torch", restarts=1, checkpoint_dir=tmp_path).start(
        engine_jobs.steps_with_checkpoints, kill_on=(12, [0]))
    resumed = job.wait(timeout=240)
    assert (resumed["attempt"], resumed["start"]) == (1, 10)
    assert job.record.status == "succeeded" and len(job.record.attempts) == 2
    assert last_run() is job.record and "killed by signal 9" in job.record.attempts[0]
