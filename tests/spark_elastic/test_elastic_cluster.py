"""Elastic jobs on a real standalone cluster of three one-core workers: losing a worker (its
JVMs killed) or a rank process, growing back when a worker starts again, and Keras."""
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from hvd_magics import HorovodRunner, last_run
from tests import jobs
from tests.conftest import _session, _stop_active, rank_processes_alive, supervisor_of
from tests.standalone import StandaloneCluster
from tests.spark_local.test_elastic_local import wait_for

WORKERS = 3
STEPS = 400
#: After a rank's first commit, how long the test waits before it kills: a few steps (0.1 s
#: each while the job is held) are then done since the last commit and lost at the reset.
KILL_AFTER_S = 0.35


@pytest.fixture(scope="module")
def elastic_cluster():
    """Its own cluster (workers are killed and added here), stopped after the module."""
    # a SIGPWR decommissions a worker, as Spark does for a spot instance taken back
    cluster = StandaloneCluster(workers=WORKERS, worker_opts="-Dspark.decommission.enabled=true")
    yield cluster
    _stop_active()
    cluster.stop()


@pytest.fixture()
def elastic_spark(elastic_cluster):
    """A session that takes every core of the cluster, with three workers and executors."""
    from hvd_magics.launch.spark_slots import task_slots

    while elastic_cluster.alive_workers() < WORKERS:
        elastic_cluster.add_worker()
    # spark.cores.max said here: a session's options outlive it as the JVM's system properties,
    # so the standalone tier's earlier session (2 cores) would otherwise cap this one
    spark = _session(elastic_cluster.url, **{"spark.executor.cores": "1",
                                             "spark.executor.memory": "1g",
                                             "spark.cores.max": str(WORKERS),
                                             "spark.decommission.enabled": "true"})
    deadline = time.monotonic() + 90
    while task_slots(spark.sparkContext)[0] < WORKERS:
        assert time.monotonic() < deadline, "the cluster's executors did not all come up"
        time.sleep(0.25)
    return spark


def _executor_and_worker(pid: int) -> tuple[psutil.Process, psutil.Process]:
    """The executor JVM above rank process ``pid`` and the worker JVM that started it."""
    for parent in supervisor_of(pid).parents():
        if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
            return parent, parent.parent()
    raise AssertionError(f"no executor JVM above process {pid}")


def _same_model_everywhere(result: list[dict]) -> None:
    flat = [[v for part in r["weights"] for v in part] for r in result]
    for other in flat[1:]:
        assert other == pytest.approx(flat[0], abs=1e-6)


def _report(record, killed_at: float, marks: Path, capsys, result: list[dict]) -> None:
    """The figures the issue asks for, in the test's log: time from the loss to training
    going on, and the work lost (steps since the last commit)."""
    resumed = float((marks / "resumed-1").read_text())
    lost = sorted({r["lost"][0] for r in result if r["lost"]})
    with capsys.disabled():
        print(f"\nelastic figures: lost at +0.00 s, ranks re-formed at "
              f"+{record.resets[0]['time'] - killed_at:.2f} s, first commit after it at "
              f"+{resumed - killed_at:.2f} s; steps lost at the reset (done since the last "
              f"commit, commits every 5): {lost}")


def _lose_task_1s_worker(cluster: StandaloneCluster, folder: Path,
                         grace_s: float | None = None) -> dict:
    """In a thread, while the job is held (``folder/hold``): kill task 1's worker and executor
    a few steps after its first commit (with ``grace_s``: ``SIGPWR`` it first, as Spark
    decommissions a spot instance, and kill it that many seconds later, as the machine goes),
    start a worker once the job shrank to 2, and let the job go once it grew back to 3. The
    moment of the kill goes in the returned dict (``killed``)."""
    (folder / "hold").touch()
    moments: dict = {}

    def drive() -> None:
        pid = int(Path(wait_for(f"{folder}/*-task1-*.pid")).read_text())
        executor, worker = _executor_and_worker(pid)
        time.sleep(KILL_AFTER_S)
        if grace_s is not None:
            os.kill(worker.pid, signal.SIGPWR)
            time.sleep(grace_s)
        moments["killed"] = time.time()
        worker.kill()
        executor.kill()
        wait_for(f"{folder}/size2")
        cluster.add_worker()
        wait_for(f"{folder}/size3", timeout=180)
        (folder / "hold").unlink()

    threading.Thread(target=drive, daemon=True).start()
    return moments


def test_a_lost_worker_leaves_two_ranks_and_a_new_worker_brings_the_third_back(
        elastic_spark, elastic_cluster, tmp_path, capsys):
    moments = _lose_task_1s_worker(elastic_cluster, tmp_path)
    result = HorovodRunner(np=(2, 3)).run(jobs.elastic_torch, steps=STEPS, marks=str(tmp_path))
    record = last_run()
    assert [(r["size"], r["step"]) for r in result] == [(3, STEPS)] * 3
    _same_model_everywhere(result)
    assert [r["size"] for r in record.resets] == [2, 3]
    assert record.resets[0]["causes"] == ["task 1 was lost (its executor went away)"]
    assert record.resets[1]["causes"] == ["task 1 joined"]
    # the task that came back is a new attempt on the new worker
    assert sorted(r["host"].split("-", 1)[1] for r in result) == [
        "task0-try0", "task1-try1", "task2-try0"]
    assert rank_processes_alive(record.pids.values()) == []
    _report(record, moments["killed"], tmp_path, capsys, result)


def test_a_decommissioned_worker_s_elastic_job_shrinks_without_an_error_and_grows_back(
        elastic_spark, elastic_cluster, tmp_path):
    """Issue 60: a spot instance taken back as Spark does it (a ``SIGPWR`` to its worker, whose
    machine goes 3 s later): the elastic job shrinks to the two other ranks and grows back on
    the worker started in its place, and ends without an error."""
    _lose_task_1s_worker(elastic_cluster, tmp_path, grace_s=3.0)
    result = HorovodRunner(np=(2, 3)).run(jobs.elastic_torch, steps=STEPS, marks=str(tmp_path))
    record = last_run()
    assert record.status == "succeeded"
    assert [(r["size"], r["step"]) for r in result] == [(3, STEPS)] * 3
    _same_model_everywhere(result)
    assert [r["size"] for r in record.resets] == [2, 3]
    assert rank_processes_alive(record.pids.values()) == []


def test_a_killed_rank_process_leaves_the_others_training(elastic_spark, tmp_path, capsys):
    (tmp_path / "hold").touch()
    moments = {}

    def drive() -> None:
        pid = int(Path(wait_for(f"{tmp_path}/*-task1-*.pid")).read_text())
        time.sleep(KILL_AFTER_S)
        moments["killed"] = time.time()
        os.kill(pid, signal.SIGKILL)
        wait_for(f"{tmp_path}/size2")
        (tmp_path / "hold").unlink()

    threading.Thread(target=drive, daemon=True).start()
    result = HorovodRunner(np="2:3").run(jobs.elastic_torch, steps=STEPS, marks=str(tmp_path))
    record = last_run()
    assert [(r["size"], r["step"]) for r in result] == [(2, STEPS)] * 2
    _same_model_everywhere(result)
    assert [(r["size"], r["causes"]) for r in record.resets] == [
        (2, ["the rank of task 1 exited with code -9"])]
    assert rank_processes_alive(record.pids.values()) == []
    _report(record, moments["killed"], tmp_path, capsys, result)


def test_a_keras_elastic_job_survives_losing_a_rank(elastic_spark, tmp_path):
    def kill_task_1() -> None:
        pid = int(Path(wait_for(f"{tmp_path}/*-task1-*.pid", timeout=180)).read_text())
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_task_1, daemon=True).start()
    result = HorovodRunner(np=(2, 3)).run(jobs.elastic_keras, epochs=6, marks=str(tmp_path))
    record = last_run()
    assert [r["size"] for r in record.resets] == [2]
    assert sorted(r["rank"] for r in result) == [0, 1]
    assert all(r["epoch"] == 6 for r in result)
    _same_model_everywhere(result)
    assert [row["epoch"] for row in record.epochs] == [1, 2, 3, 4, 5, 6]  # across the reset
