"""Issue 60: an executor decommissioned as Spark does it for a spot instance taken back (a
``SIGPWR`` to its worker, ``spark.decommission.enabled``): every rank saves at the same step,
the attempt ends on purpose, and the next one, on the executor that took its place, redoes no
step."""
import contextlib
import os
import re
import signal
import threading
import time

import psutil
import pytest

from hvd_magics import HorovodRunner, last_run
from tests.conftest import _session, supervisor_of
from tests.engine_jobs import steps_with_checkpoints
from tests.standalone import StandaloneCluster


def _worker_jvm(pid: int) -> psutil.Process:
    """The standalone worker JVM above rank ``pid`` (it started the rank's executor)."""
    for parent in supervisor_of(pid).parents():
        if "org.apache.spark.deploy.worker.Worker" in " ".join(parent.cmdline()):
            return parent
    raise AssertionError(f"no worker JVM above process {pid}")


def _decommission_rank_1s_worker_once_marked(cluster: StandaloneCluster, folder,
                                             marks: tuple[str, ...] = ("rank1",)) -> dict:
    """In a thread: each time rank 1 wrote its pid to a file of ``marks``, ``SIGPWR`` its
    worker (Spark decommissions the worker and its executor) and start a worker in its place,
    as a cluster's autoscaler does."""
    done: dict = {"workers": []}

    def decommission() -> None:
        for mark in marks:
            deadline = time.monotonic() + 120
            while not (folder / mark).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.05)  # its pid is written whole
            worker = _worker_jvm(int((folder / mark).read_text()))
            os.kill(worker.pid, signal.SIGPWR)
            done["workers"].append(worker.pid)
            cluster.add_worker(wait=False)

    thread = threading.Thread(target=decommission, daemon=True)
    thread.start()
    done["thread"] = thread
    return done


def spark_executors() -> list[str]:
    from pyspark.sql import SparkSession

    ids = SparkSession.getActiveSession().sparkContext._jsc.sc().getExecutorIds()
    return [ids.apply(i) for i in range(ids.size())]


def _spark_with_decommission(cluster: StandaloneCluster) -> None:
    """The tests' session on ``cluster`` with decommissioning on, its two executors up."""
    spark = _session(cluster.url, **{
        "spark.executor.cores": "1", "spark.executor.memory": "1g", "spark.cores.max": "2",
        "spark.decommission.enabled": "true"})
    deadline = time.monotonic() + 60
    while spark.sparkContext._jsc.sc().getExecutorIds().size() < 2:
        assert time.monotonic() < deadline, "the executors did not register"
        time.sleep(0.2)


def _retire(cluster: StandaloneCluster, decommissioned: dict) -> None:
    """The decommissioned workers leave the cluster (the ones started in their place stay)."""
    decommissioned["thread"].join(10)
    for pid in decommissioned["workers"]:
        with contextlib.suppress(psutil.Error):
            worker = psutil.Process(pid)
            for process in [*worker.children(recursive=True), worker]:
                process.kill()
    cluster.wait_for_workers(2)


#: The weights of :func:`steps_with_checkpoints` (80 steps, a checkpoint every 20) run without a
#: notice, by engine: the first test that compares with them runs it, the next reuses them.
_UNINTERRUPTED: dict[str, list] = {}


def _uninterrupted_weights(folder, engine: str) -> list:
    """The weights a job of this cluster ends with when no notice comes (see above)."""
    if engine not in _UNINTERRUPTED:
        _UNINTERRUPTED[engine] = HorovodRunner(np=2, engine=engine, checkpoint_dir=folder).run(
            steps_with_checkpoints, steps=80, every=20, engine=engine)["weights"]
    return _UNINTERRUPTED[engine]


# DDP; a Horovod loop of this job's saves on the notice in the warm pool's test at the end. The
# libraries that save by themselves on the notice (Hugging Face's and Lightning's Trainers,
# Horovod's Keras fit) are tests/driver/test_restarts.py's, the order handed to their ranks as
# their supervisor hands it on: the rank's side is the same wherever the notice came from.
@pytest.mark.parametrize("engine", ["torch"])
def test_a_decommissioned_executor_s_job_saves_one_step_everywhere_and_redoes_none(
        standalone_cluster, tmp_path, engine):
    _spark_with_decommission(standalone_cluster)
    decommissioned = _decommission_rank_1s_worker_once_marked(standalone_cluster, tmp_path)
    try:
        resumed = HorovodRunner(np=2, engine=engine, restarts=1,
                                checkpoint_dir=tmp_path / "spot").run(
            steps_with_checkpoints, steps=80, every=20, step_s=0.05, spot=(10, str(tmp_path)),
            engine=engine)
    finally:
        _retire(standalone_cluster, decommissioned)
    record = last_run()
    assert record.attempts[-1] == "succeeded" and len(record.attempts) == 2, record.attempts
    assert record.attempts[0].startswith("preempted: the checkpoint of step "), record.attempts
    assert "being decommissioned" in record.attempts[0]  # one executor, or both on its worker
    # the decommissioned executor was asked to go once the attempt had saved (it would keep the
    # application's cores until its machine died; the next attempt would wait for them)
    gone = re.search(r"executor (\S+) \(host", record.attempts[0]).group(1)
    executors = spark_executors()
    assert gone not in executors and len(executors) >= 2, (gone, executors)
    ran = {rank: [tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    for rank, steps in ran.items():  # every step once, across both attempts, on every rank
        assert [step for _, step in steps] == list(range(80)), (rank, steps)
    first = {rank: max(step for attempt, step in steps if attempt == 0)
             for rank, steps in ran.items()}
    assert first[0] == first[1] and 10 < first[0] < 79, first  # both ranks left at one step
    assert (resumed["attempt"], resumed["start"]) == (1, first[0] + 1)
    assert resumed["weights"] == _uninterrupted_weights(tmp_path / "whole", engine)  # bit for bit


def test_a_notice_whose_save_is_cut_short_resumes_from_the_last_whole_checkpoint(
        standalone_cluster, tmp_path):
    """The machine of the rank that writes the checkpoint goes while it writes the one of the
    notice (its file half written): the next attempt resumes from the last whole checkpoint
    (a periodic one), never from the torn file, and ends with an uninterrupted run's weights."""
    _spark_with_decommission(standalone_cluster)
    decommissioned = _decommission_rank_1s_worker_once_marked(standalone_cluster, tmp_path)
    seen: dict = {}

    def cut_rank_0_while_it_saves() -> None:
        deadline = time.monotonic() + 180
        while not (tmp_path / "saving").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        seen["partial"] = [(p.name, p.stat().st_size) for p in
                           (tmp_path / "spot").rglob(".*.tmp-*")]
        worker = _worker_jvm(int((tmp_path / "saving").read_text()))
        for process in [*worker.children(recursive=True), worker]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        standalone_cluster.add_worker(wait=False)

    cutter = threading.Thread(target=cut_rank_0_while_it_saves, daemon=True)
    cutter.start()
    try:
        resumed = HorovodRunner(np=2, engine="torch", restarts=1,
                                checkpoint_dir=tmp_path / "spot").run(
            steps_with_checkpoints, steps=80, every=20, step_s=0.05, spot=(25, str(tmp_path)),
            torn_save=str(tmp_path))
    finally:
        cutter.join(10)
        _retire(standalone_cluster, decommissioned)
    assert seen["partial"] and all(size > 0 for _, size in seen["partial"]), seen
    attempts = last_run().attempts
    assert attempts[-1] == "succeeded" and len(attempts) == 2, attempts
    ran = [tuple(map(int, line.split())) for line in
           (tmp_path / "steps-0").read_text().splitlines()]
    cut = max(step for attempt, step in ran if attempt == 0)  # its save (of cut + 1) was torn
    # the last whole checkpoint, a periodic one (every 20), before the torn one
    assert (resumed["attempt"], resumed["start"]) == (1, cut // 20 * 20), (cut, resumed)
    assert resumed["start"] < cut + 1
    # told as what it was: a loss of the rank that writes, and the step the next attempt took
    # (it was "preempted: the checkpoint of step 56 was saved ...; resumes from ... 56", rank
    # 1's word, while rank 0 had saved nothing)
    assert not attempts[0].startswith("preempted"), attempts
    assert f"attempt 2 resumes from the checkpoint of step {resumed['start']})" in attempts[0], \
        attempts
    assert not list((tmp_path / "spot").rglob(".*.tmp-*"))  # the torn file was cleared
    assert resumed["weights"] == _uninterrupted_weights(tmp_path / "whole", "torch")  # bit for bit


def test_a_background_job_decommissioned_twice_resumes_twice_without_using_its_restart(
        standalone_cluster, tmp_path):
    """Two workers taken one after the other (in attempts 1 and 2) of a background job with
    ``restarts=1``: preemptions do not count against it; every step still runs once."""
    _spark_with_decommission(standalone_cluster)
    decommissioned = _decommission_rank_1s_worker_once_marked(standalone_cluster, tmp_path,
                                                              ("rank1", "rank1-1"))
    try:
        job = HorovodRunner(np=2, engine="torch", restarts=1,
                            checkpoint_dir=tmp_path / "spot").start(
            steps_with_checkpoints, steps=140, every=20, step_s=0.05,
            spot=(10, str(tmp_path), 2))  # 60+ steps after each mark: time for the notice
        resumed = job.wait(240)
    finally:
        _retire(standalone_cluster, decommissioned)
    attempts = last_run().attempts
    assert [a.split(":")[0] for a in attempts] == ["preempted", "preempted", "succeeded"], \
        attempts
    assert resumed["attempt"] == 2
    ran = {rank: [tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    for rank, steps in ran.items():
        assert [step for _, step in steps] == list(range(140)), (rank, steps)
        assert {attempt for attempt, _ in steps} == {0, 1, 2}


def test_a_horovod_estimator_saves_on_the_notice_by_itself_and_resumes_where_it_saved(
        standalone_cluster, tmp_path):
    from pyspark.sql import SparkSession

    from hvd_magics.estimator import HorovodEstimator
    from tests.estimator_models import model_weights, torch_mlp, torch_mlp_on_spot
    from tests.frames import digits_frames

    _spark_with_decommission(standalone_cluster)
    spark = SparkSession.getActiveSession()
    # the same rows in every evaluation: digits_frames' randomSplit of a repartition() draws
    # other rows each time a cluster's executors compute it (a fit's next attempt reads its
    # DataFrame again), as Spark's docs warn
    train = digits_frames(spark)[0].collect()
    train = spark.createDataFrame(train, "pixels array<float>, label int")
    params = dict(loss="cross_entropy", learningRate=0.01, batchSize=32, epochs=3, np=2,
                  featuresCol="pixels", shuffle=True, seed=5)
    decommissioned = _decommission_rank_1s_worker_once_marked(standalone_cluster, tmp_path)
    try:
        fitted = HorovodEstimator(model=torch_mlp_on_spot(str(tmp_path), 10),
                                  modelDir=str(tmp_path / "spot"), restarts=1, **params).fit(train)
    finally:
        _retire(standalone_cluster, decommissioned)
    attempts = fitted.run_record.attempts
    assert len(attempts) == 2 and attempts[-1] == "succeeded", attempts
    assert attempts[0].startswith("preempted: the checkpoint of step "), attempts
    saved = int(re.search(r"the checkpoint of step (\d+)", attempts[0]).group(1))
    assert fitted.resumed_from["global_step"] == saved  # its own checkpoint of that step
    total = 3 * fitted.steps_per_epoch
    assert 10 < saved < total
    for rank in (0, 1):  # every step once, on every rank: the first attempt's up to the save
        attempt_of_step = (tmp_path / f"forwards-{rank}").read_text().split()
        assert attempt_of_step == ["0"] * saved + ["1"] * (total - saved), rank
    assert fitted.optimizer_step == total
    whole = HorovodEstimator(model=torch_mlp(), modelDir=str(tmp_path / "whole"),
                             **params).fit(train)
    for a, b in zip(model_weights(whole), model_weights(fitted), strict=True):
        assert (a == b).all(), float(abs(a - b).max())  # bit for bit


def test_a_warm_pool_s_cell_saves_on_the_notice_and_its_ranks_leave_the_executor(
        standalone_cluster, tmp_path):
    """A cell on a warm pool gets the notice as a cold job does: every rank saves at one step
    and the cell ends, saying how to resume; the pool's ranks start again away from the
    decommissioned executor (the pool stays usable), and the cell run again resumes from the
    step saved: every step once, and an uninterrupted run's weights, bit for bit."""
    from hvd_magics import HorovodJobError, HorovodPool

    _spark_with_decommission(standalone_cluster)
    decommissioned = _decommission_rank_1s_worker_once_marked(standalone_cluster, tmp_path)
    job = dict(steps=80, every=20, step_s=0.05, spot=(10, str(tmp_path)), engine="horovod")
    try:
        with HorovodPool(np=2, start_timeout=120) as pool:
            runner = HorovodRunner(np=2, pool=pool, checkpoint_dir=tmp_path / "spot")
            first_tasks = set(pool.tasks.values())
            with pytest.raises(HorovodJobError) as preempted:
                runner.run(steps_with_checkpoints, **job)
            assert pool.alive and pool.restarts == 1
            resumed = runner.run(steps_with_checkpoints, **job)
    finally:
        _retire(standalone_cluster, decommissioned)
    told = str(preempted.value)
    first_line = told.splitlines()[0]
    assert first_line.startswith("The job was preempted: the checkpoint of step "), told
    assert "being decommissioned" in first_line and "run the cells that set them up" in told
    assert str(tmp_path / "spot") in told
    assert first_tasks and not first_tasks & set(pool.tasks.values())  # new tasks: restarted
    ran = {rank: [step for _, step in (tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines())] for rank in (0, 1)}
    for rank, steps in ran.items():  # every step once, across the two runs of the cell
        assert steps == list(range(80)), (rank, steps)
    saved = int(re.search(r"the checkpoint of step (\d+)", first_line).group(1))
    assert 10 < saved < 80 and resumed["start"] == saved, (saved, resumed["start"])
    whole = _uninterrupted_weights(tmp_path / "whole", "horovod")
    assert resumed["weights"] == whole  # bit for bit
