"""A real standalone Spark cluster on loopback: a master and two one-core workers."""
import os
import re
import signal
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from tests import jobs
from tests.conftest import rank_processes_alive, supervisor_of
from tests.environments import arrow_only_python
from tests.frames import MIXED_IDS, check_cover, mixed_frame, read_reports


def test_ranks_of_two_executors_fork_from_one_zygote_of_the_host(cluster_spark):
    """Each executor keeps the travelled package zip in its own folder; its ranks import the
    host's copy of it (named by its content), so both executors' ranks fork from one zygote."""
    deadline = time.monotonic() + 120
    while True:  # the first runs of this environment start fresh while its zygote imports
        ranks = HorovodRunner(np=2).run(jobs.zygote_place)
        if all(rank["zygote"] for rank in ranks):
            break
        assert time.monotonic() < deadline, f"no job of forked ranks within 120 s: {ranks}"
    assert len({rank["cwd"] for rank in ranks}) == 2, ranks  # two executors
    assert len({rank["zygote"] for rank in ranks}) == 1, ranks  # one zygote
    folder = os.path.join(os.environ["HVD_MAGICS_ZYGOTE_DIR"], "packages")
    assert all(rank["package"].startswith(folder) for rank in ranks), ranks


def test_a_failing_rank_on_the_cluster_ends_the_job(cluster_spark):
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=0, how="raise")
    assert time.monotonic() - start < 30
    assert "boom from rank 0" in "\n".join(info.value._render_traceback_())
    assert rank_processes_alive(last_run().pids.values()) == []
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


def test_the_timeline_comes_back_from_the_executor(cluster_spark, tmp_path):
    import json

    path = tmp_path / "cluster-trace.json"
    HorovodRunner(np=2, timeline=path).run(jobs.torch_allreduce_steps, steps=10)
    assert last_run().timeline_path == str(path)
    assert any(e.get("name") == "ALLREDUCE" for e in json.loads(path.read_text()))


def _executor_jvm(pid: int):
    """The executor JVM that (through the Python worker and the keeper) started rank ``pid``."""
    for parent in supervisor_of(pid).parents():
        if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
            return parent
    raise AssertionError(f"no executor JVM above process {pid}")


def kill_rank_1s_executor_once_marked(folder) -> None:
    """In a thread: SIGKILL the executor JVM of rank 1 once it wrote its pid to ``folder/rank1``."""
    import threading

    def kill() -> None:
        deadline = time.monotonic() + 120
        while not (folder / "rank1").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        rank = int((folder / "rank1").read_text())
        try:
            _executor_jvm(rank).kill()
        except BaseException:  # the test must fail now, not wait for the paused rank's 600 s
            os.kill(rank, signal.SIGKILL)
            raise

    threading.Thread(target=kill, daemon=True).start()


def test_a_killed_executor_costs_at_most_the_step_under_way_kept_in_memory(cluster_spark,
                                                                           tmp_path):
    """Issue 84: the executor JVM of rank 1 SIGKILLed while DDP trains, every step kept in the
    host's memory and no checkpoint file written: the next attempt redoes at most one step and
    the job ends bit for bit."""
    from tests import engine_jobs

    env = {"HVD_MAGICS_KEEP_DIR": str(tmp_path / "keep"), "HVD_MAGICS_KEEP_IDLE_S": "30"}
    whole = HorovodRunner(np=2, engine="torch", env=env,
                          checkpoint_dir=tmp_path / "whole").run(engine_jobs.steps_kept, steps=40)
    kill_rank_1s_executor_once_marked(tmp_path)
    steps = tmp_path / "steps"
    resumed = HorovodRunner(np=2, engine="torch", restarts=1, env=env,
                            checkpoint_dir=tmp_path / "lost").run(
        engine_jobs.steps_kept, steps=40, step_s=0.05, mark_pid=(8, str(tmp_path)),
        steps_file=str(steps))
    assert (resumed["weights"], resumed["moment"]) == (whole["weights"], whole["moment"])
    record = last_run()
    assert "executor was lost or killed" in record.attempts[0], record.attempts
    assert "kept in the memory of 1 host" in record.attempts[0], record.attempts
    taken = [tuple(map(int, line.split())) for line in open(f"{steps}-0")]
    before = {step for attempt, step in taken if attempt == 0}
    assert len([s for a, s in taken if a == 1 and s in before]) <= 1, taken
    assert not (tmp_path / "lost").exists()  # no file: memory alone


def test_a_lost_executor_is_named_first_with_its_rank(cluster_spark, tmp_path):
    """Regression: only the surviving rank's 'Horovod has been shut down' was shown."""
    kill_rank_1s_executor_once_marked(tmp_path)
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=2).run(jobs.sleep_in_allreduce, pid_dir=str(tmp_path))
    first = info.value.failures[0]
    assert first.rank == 1 and first.error == "RankLost", info.value
    assert "executor was lost or killed" in first.headline()
    assert rank_processes_alive(last_run().pids.values()) == []
    # run again at once, while the worker starts the executor anew: the job waits for it
    # (a job was refused in 5 s, "NotEnoughSlotsError ... 1 free", while it came back)
    assert len(HorovodRunner(np=2).run(jobs.torch_allreduce)) == 2


@pytest.mark.parametrize("np", [2, "1:2"])  # a barrier stage, and an elastic job's tasks
@pytest.mark.parametrize("python, cause", [
    ("bare", "No module named 'pyarrow'"),  # Spark's Arrow task itself cannot run
    # hvd_magics travels with the job (issue 39) and the task plans the ranks without Horovod:
    # a job that needs nothing more runs; one that imports Horovod fails on the rank
    ("arrow_only", "No module named 'horovod'"),
])
def test_executors_without_our_packages_get_the_cause_and_the_fix(cluster_spark, tmp_path,
                                                                   python, cause, np):
    """Regression: 15 lines of JVM stack, the cause (No module named ...) only in the log."""
    import sys

    from tests import engine_jobs

    sc = cluster_spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = sys._base_executable if python == "bare" else arrow_only_python(tmp_path)
    try:
        start = time.monotonic()
        if python == "arrow_only":
            assert HorovodRunner(np=np).run(jobs.print_lines, count=1) == 0
            if np != 2:
                return
        with pytest.raises(HorovodJobError) as info:
            HorovodRunner(np=np).run(jobs.print_lines if python == "bare" else
                                     engine_jobs.horovod_where, **(
                                         {"count": 1} if python == "bare" else {}))
        assert time.monotonic() - start < 60  # not the start timeout
    finally:
        sc.pythonExec = saved
    text = str(info.value)
    assert cause in text, text
    assert ("Fix: ship the notebook's environment with every job: "
            "hvd_magics.ship_environment() (%hvd_env ship)") in text, text
    assert "\tat " not in text and "py4j" not in text
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


def test_two_executors_get_disjoint_shards_in_the_same_order_in_every_job(cluster_spark,
                                                                          tmp_path):
    """(Training on shards across hosts, and the estimator there:
    tests/spark_hosts/test_hosts.py; on shards in local mode: tests/spark_local.)"""
    from tests.frames import MIXED_IDS, check_cover, mixed_frame, read_reports

    train = mixed_frame(cluster_spark)
    HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path), train=train)
    counts = check_cover(read_reports(tmp_path, 2), "train", MIXED_IDS)
    assert max(counts) - min(counts) <= 4
    # a second job over the same DataFrame: each rank gets the same rows in the same order (the
    # shuffle hands a task its rows as its fetches complete, which differs between jobs on a
    # cluster; a seeded shuffle of a shard's batches, a resumed fit, needs the same order)
    first = [report["train"]["ids"] for report in read_reports(tmp_path, 2)]
    (tmp_path / "again").mkdir()
    HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path / "again"), train=train)
    assert [report["train"]["ids"] for report in read_reports(tmp_path / "again", 2)] == first
    assert len(set(last_run().hosts.values())) >= 1 and len(last_run().shards) == 1


def test_a_warm_pool_spans_two_executors_and_survives_losing_one_between_runs(cluster_spark,
                                                                               capsys):
    from hvd_magics import HorovodPool

    with HorovodPool(np=2) as pool:
        first = pool.run(jobs.pool_build_model)
        assert pool.run(jobs.pool_train_kept, steps=3) != first
        assert last_run().where.endswith("(warm pool)")
        _executor_jvm(pool.pids[1]).kill()  # rank 1's executor goes away while nothing runs
        deadline = time.monotonic() + 60
        while not pool.lost_since_last_cell() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.run(jobs.pool_read, name="model")[0] is None  # new ranks, nothing kept
        # the lost executor is seen as rank 1's channel closing, or as the stage failing
        assert re.search(r"the warm pool lost (rank 1|its ranks \(an executor was lost).* since "
                         "its last cell", capsys.readouterr().err)
        assert pool.run(jobs.pool_keep, again=1) > 0


def test_a_warm_pool_on_one_executor_gets_a_dataframe_dealt_from_the_other(cluster_spark,
                                                                           tmp_path, capsys):
    from hvd_magics import HorovodPool

    with HorovodPool(np=1) as pool:  # the other executor's one slot runs the dealing task
        pool.run(jobs.shard_report, out=str(tmp_path), train=mixed_frame(cluster_spark))
        assert sum(check_cover(read_reports(tmp_path, 1), "train", MIXED_IDS)) == 400
        assert "dealt 'train' to the pool's 1 rank: 400 rows" in capsys.readouterr().err


def _changed_data_cases(spark, pool, folder, capfd) -> None:
    """Data changed under an unchanged plan (a table, a query of it, a temp view, a Parquet path
    overwritten) is dealt again, and unchanged data is reused; each says so. (Local Spark deals
    by the same path, from the slot the pool leaves free: one run of it is enough.)"""
    from pyspark.sql import functions as F

    table, path = f"events_{os.getpid()}", str(folder / "pq")
    reads = {"table": lambda: spark.table(table),
             "sql": lambda: spark.sql(f"SELECT * FROM {table}"),
             "view": lambda: spark.table(f"{table}_view")}
    try:
        for name, read in reads.items():
            pool.forget_shards()
            spark.sql(f"DROP TABLE IF EXISTS {table}")
            spark.sql(f"CREATE TABLE {table} (x double) USING parquet "
                      f"LOCATION '{folder / name}'")
            spark.sql(f"INSERT INTO {table} VALUES (1.0), (2.0)")
            spark.table(table).createOrReplaceTempView(f"{table}_view")
            assert pool.run(jobs.shard_sums, df=read()) == {"df": (3.0, 2)}, name
            assert "dealt 'df' to the pool's 1 rank: 2 rows" in capfd.readouterr().err
            assert pool.run(jobs.shard_sums, df=read()) == {"df": (3.0, 2)}, name
            assert re.search(r"the shards of 'df' dealt earlier were reused \(2 rows; same plan "
                             r"and data: \d+ files? unchanged\)", capfd.readouterr().err), name
            spark.sql(f"INSERT INTO {table} VALUES (3.0), (4.0)")
            assert pool.run(jobs.shard_sums, df=read()) == {"df": (10.0, 4)}, name
            err = capfd.readouterr().err
            assert "dealt 'df' again to the pool's 1 rank: 4 rows in" in err, (name, err)
            assert re.search(r"\(its files changed since it was dealt: \d+ files? added[,)]",
                             err), (name, err)
        spark.range(20).selectExpr("cast(id as double) x").write.parquet(path)
        frame = spark.read.parquet(path)
        assert pool.run(jobs.shard_sums, df=frame) == {"df": (190.0, 20)}
        spark.range(20).selectExpr("cast(id * 3 as double) x").write.mode("overwrite") \
            .parquet(path)
        assert pool.run(jobs.shard_sums, df=spark.read.parquet(path)) == {"df": (570.0, 20)}
        assert "dealt 'df' again to the pool's 1 rank: 20 rows in" in capfd.readouterr().err
        # what cannot be proven unchanged is dealt by every cell, and the cell says so
        random = spark.range(10).withColumn("x", F.rand(1))
        pool.run(jobs.shard_sums, df=random)
        assert "(each cell that reads it deals it again: its plan is not deterministic" in \
            capfd.readouterr().err
        pool.run(jobs.shard_sums, df=random)
        assert "dealt 'df' again to the pool's 1 rank: 10 rows in" in capfd.readouterr().err
        cached = random.cache()
        cached.count()
        pool.run(jobs.shard_sums, df=cached)
        capfd.readouterr()
        pool.run(jobs.shard_sums, df=cached)
        assert "were reused (10 rows; same plan and data: cached)" in capfd.readouterr().err
        cached.unpersist()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
        spark.catalog.dropTempView(f"{table}_view")


def test_a_warm_pool_on_the_cluster_deals_again_data_changed_under_the_same_plan(
        cluster_spark, tmp_path, capfd):
    from hvd_magics import HorovodPool

    with HorovodPool(np=1) as pool:  # the other executor deals (and lists nothing: the driver)
        _changed_data_cases(cluster_spark, pool, tmp_path, capfd)


def test_a_killed_executor_restarts_the_job_which_resumes_to_the_same_weights(cluster_spark,
                                                                              tmp_path):
    """Issue 40: SIGKILL the executor JVM of rank 1 mid-training (Keras under tf.distribute
    with its BackupAndRestore); the job starts again on the executor the cluster puts in its
    place and ends as an uninterrupted run. (DDP and Horovod restarts after a lost host:
    tests/spark_hosts/test_lost_hosts.py; bit for bit after a lost rank:
    tests/driver/test_restarts.py.)"""
    from tests import engine_jobs

    kill_rank_1s_executor_once_marked(tmp_path)
    runner = HorovodRunner(np=2, engine="tf", restarts=1, checkpoint_dir=tmp_path / "lost")
    resumed = runner.run(engine_jobs.tf_fit_with_backup, epochs=4,
                         pause_after_epoch=(2, str(tmp_path)))
    assert resumed["attempt"] == 1 and resumed["ran"] == [3, 4], resumed
    record = last_run()
    assert record.attempts[-1] == "succeeded" and "rank 1" in record.attempts[0], record.attempts
    assert "executor was lost or killed" in record.attempts[0]
    whole = HorovodRunner(np=2, engine="tf", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.tf_fit_with_backup, epochs=4)
    assert abs(resumed["weights"] - whole["weights"]) < 1e-4, (resumed, whole)
