"""Elastic jobs (np=MIN:MAX) on a local[2] SparkSession: a lost rank process, the bounds, and
an interrupt. The executor-loss and growth cases need a cluster (tests/spark_elastic)."""
import glob
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, PayloadError, last_run
from tests import jobs
from tests.conftest import rank_processes_alive


def wait_for(pattern: str, timeout: float = 120.0) -> str:
    """The first file matching ``pattern`` (a glob), once one exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = glob.glob(pattern)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing matched {pattern} within {timeout} s")


def kill_rank_of_task(marks: Path, task: int, then_release: str | None = None) -> threading.Thread:
    """In the background: kill the rank process of ``task`` at its first commit; then, when the
    mark ``then_release`` appears, let the job run at full speed."""
    def drive() -> None:
        os.kill(int(Path(wait_for(f"{marks}/*-task{task}-*.pid")).read_text()), signal.SIGKILL)
        if then_release:
            wait_for(f"{marks}/{then_release}")
            (marks / "hold").unlink()

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread


def test_an_elastic_job_goes_on_when_a_rank_process_dies(local_spark, tmp_path):
    (tmp_path / "hold").touch()
    kill_rank_of_task(tmp_path, 1, then_release="size1")
    result = HorovodRunner(np="1:2").run(jobs.elastic_torch, steps=60, marks=str(tmp_path))
    record = last_run()
    assert [(r["size"], r["step"]) for r in result] == [(1, 60)]
    assert record.status == "succeeded" and record.elastic == "1:2"
    assert [r["size"] for r in record.resets] == [1]
    assert record.resets[0]["causes"] == ["the rank of task 1 exited with code -9"]
    assert record.exit_codes == {0: 0, 1: -9}
    assert "reset 1" in str(record) and "elastic 1:2, ended with 1" in str(record)
    assert rank_processes_alive(record.pids.values()) == []


def test_an_elastic_job_that_loses_a_rank_brings_rank_0s_timeline_back(local_spark, tmp_path):
    import json

    from hvd_magics.job.records.timeline import summarize

    marks, trace = tmp_path / "marks", tmp_path / "trace.json"
    marks.mkdir()
    (marks / "hold").touch()
    kill_rank_of_task(marks, 1, then_release="size1")
    HorovodRunner(np="1:2", timeline=trace).run(jobs.elastic_torch, steps=40, marks=str(marks))
    assert last_run().timeline_path == str(trace) and len(last_run().resets) == 1
    names = {e.get("name") for e in json.loads(trace.read_text())}
    assert "ALLREDUCE" in names, sorted(n for n in names if n)[:20]
    assert summarize(trace).activity_us["ALLREDUCE"] > 0


def test_below_the_minimum_for_longer_than_the_elastic_timeout_ends_the_job(local_spark,
                                                                           tmp_path):
    (tmp_path / "hold").touch()
    kill_rank_of_task(tmp_path, 1)
    start = time.monotonic()
    with pytest.raises(HorovodJobError, match=r"fewer than the minimum of 2 ranks \(np=2:2\) were "
                                              r"left for longer than elastic_timeout=3 s"):
        HorovodRunner(np=(2, 2), elastic_timeout=3).run(jobs.elastic_torch, steps=10_000,
                                                        marks=str(tmp_path))
    assert time.monotonic() - start < 60
    record = last_run()
    assert record.status == "failed"
    assert rank_processes_alive(record.pids.values()) == []
    # the kernel stays usable: the next job runs
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


def test_the_reset_limit_ends_the_job_naming_it(local_spark, tmp_path):
    (tmp_path / "hold").touch()
    kill_rank_of_task(tmp_path, 1)
    with pytest.raises(HorovodJobError, match=r"reset_limit=0 \(--reset-limit\)"):
        HorovodRunner(np=(1, 2), reset_limit=0).run(jobs.elastic_torch, steps=10_000,
                                                    marks=str(tmp_path))
    assert rank_processes_alive(last_run().pids.values()) == []


def test_an_interrupt_stops_an_elastic_job_and_its_ranks(local_spark, tmp_path):
    (tmp_path / "hold").touch()

    def interrupt_when_training() -> None:
        wait_for(f"{tmp_path}/*-task1-*.pid")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_training, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        HorovodRunner(np="2:2").run(jobs.elastic_torch, steps=10_000, marks=str(tmp_path))
    record = last_run()
    assert record.status == "interrupted" and len(record.pids) == 2
    assert rank_processes_alive(record.pids.values()) == []
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


def test_an_elastic_job_refuses_a_dataframe_before_it_starts(local_spark):
    frame = local_spark.range(10)
    with pytest.raises(PayloadError, match=r"elastic job \(np=1:2\) cannot reshard a DataFrame"):
        HorovodRunner(np=(1, 2)).run(jobs.shard_report, out="/nonexistent", data=frame)
    assert last_run() is None


def test_an_elastic_minimum_above_the_slots_is_refused_in_elastic_terms(local_spark):
    """np=3:4 on local[2] was refused as a barrier job ('np=3 needs 3 free Spark task slots at
    once (barrier mode) ... Fix: use np<=2')."""
    from hvd_magics.errors import NotEnoughSlotsError

    with pytest.raises(NotEnoughSlotsError) as info:
        HorovodRunner(np="3:4").run(jobs.elastic_torch, steps=5)
    text = str(info.value)
    assert text.startswith("np=3:4 is an elastic job that needs at least 3 Spark task slots to "
                           "start"), text
    assert "Fix: lower the minimum (np=2:4)" in text and "barrier" not in text


def test_an_elastic_loop_without_hvd_elastic_run_says_to_decorate_it(local_spark):
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np="1:2").run(jobs.undecorated_elastic_loop)
    text = str(info.value)
    assert text.startswith("Every rank of the elastic job failed"), text
    assert "@hvd.elastic.run" in text and "Fix: put the training loop in such a function" in text
