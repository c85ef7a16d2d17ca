"""Warm pools on local Spark: one long barrier stage holds the ranks across runs."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hvd_magics import (HorovodPool, HorovodRunner, JobInterrupted, NotEnoughSlotsError,
                        PayloadError, last_run)
from tests import jobs
from hvd_magics.task.shard_files import ENV_SHARD_DIR
from tests.frames import mixed_frame


def test_a_pool_on_spark_keeps_its_ranks_and_their_model_and_holds_its_slots(local_spark):
    with HorovodPool(np=2) as pool:
        first = pool.run(jobs.pool_build_model)
        trained = pool.run(jobs.pool_train_kept, steps=3)
        assert trained != first
        assert last_run().where == "spark local[2] (warm pool)"
        kept, pid = pool.run(jobs.pool_read, name="model")
        assert kept is not None and pool.run(jobs.pool_read, name="model")[1] == pid
        with pytest.raises(NotEnoughSlotsError, match=r"has 0 free of 2.*warm pools and "
                                                      r"background jobs hold 2 of the "
                                                      r"slots.*%hvd_pool stop"):
            HorovodRunner(np=2).run(jobs.print_lines, count=1)
        with pytest.raises(PayloadError, match=r"reads the DataFrame 'train', but dealing its "
                                               r"rows to the warm pool needs one free Spark task "
                                               r"slot beside the 2 the pools hold.*local\[N\+1\]"):
            pool.run(jobs.shard_report, out="/nonexistent", train=mixed_frame(local_spark))
        assert pool.run(jobs.pool_read, name="model")[1] == pid  # refused before it ran
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0  # the slots are free again


def test_a_stuck_rank_on_spark_restarts_the_pool_in_place(local_spark):
    with HorovodPool(np=2) as pool:
        pool.run(jobs.pool_keep, kept="yes")
        with pytest.raises(Exception, match="The ranks were restarted: rank 0 did not come back"):
            pool.run(jobs.pool_raise_on_rank_1_while_0_allreduces)
        assert pool.run(jobs.pool_read, name="kept")[0] is None
        assert pool.run(jobs.pool_keep, kept="again") > 0


def _deals(root: Path) -> list[str]:
    """The deals whose shards the pool's one task holds under ``root``."""
    return sorted(p.name for task in root.iterdir() for p in task.iterdir() if p.is_dir())


def _small(spark):
    """A DataFrame built anew each call, always with the same plan."""
    return spark.range(0, 40, 1, 2).selectExpr("id", "cast(id * 2 as double) as x")


def _until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_dataframe_is_dealt_to_the_pool_once_kept_replaced_and_forgotten(local_spark,
                                                                            tmp_path, capfd):
    frame = mixed_frame(local_spark)
    cold_out, warm_out, root = tmp_path / "cold", tmp_path / "warm", tmp_path / "shards"
    cold_out.mkdir()
    warm_out.mkdir()
    # one rank held, one slot free to deal (and to run the cold job the shards are checked by)
    with HorovodPool(np=1, env={ENV_SHARD_DIR: str(root)}) as pool:
        warm = pool.run(jobs.shard_report, out=str(warm_out), train=frame)
        assert "dealt 'train' to the pool's 1 rank: 400 rows in" in capfd.readouterr().err
        cold = HorovodRunner(np=1).run(jobs.shard_report, out=str(cold_out), train=frame)
        for key in ("rows_per_rank", "dtypes", "steps", "name", "vec", "arr"):
            assert warm["train"][key] == cold["train"][key], key
        assert sorted(warm["train"]["ids"]) == sorted(cold["train"]["ids"]) == \
            list(range(100)) + list(range(900, 1200))
        first = _deals(root)
        assert len(first) == 1
        # the same DataFrame is not dealt again, nor one with the same plan
        again = pool.run(jobs.shard_report, out=str(warm_out), train=frame)
        assert again["train"]["ids"] == warm["train"]["ids"]
        assert "the shards of 'train' dealt earlier were reused (400 rows; same " \
               "plan and data: spark.range)" in capfd.readouterr().err
        pool.run(jobs.shard_report, out=str(warm_out), small=_small(local_spark))
        assert "dealt 'small'" in capfd.readouterr().err
        pool.run(jobs.shard_report, out=str(warm_out), small=_small(local_spark))
        assert "the shards of 'small' dealt earlier were reused" in \
            capfd.readouterr().err
        assert len(_deals(root)) == 2
        # another plan under the same name replaces the old shards, whose files go
        fewer = pool.run(jobs.shard_report, out=str(warm_out), train=frame.where("id < 950"))
        assert sorted(fewer["train"]["ids"]) == list(range(100)) + list(range(900, 950))
        _until(lambda: len(_deals(root)) == 2 and first[0] not in _deals(root),
               f"the replaced deal's files stay: {_deals(root)}")
        assert pool.forget_shards() == 2
        _until(lambda: _deals(root) == [], f"forgotten shards stay: {_deals(root)}")
        pool.run(jobs.shard_report, out=str(warm_out), train=frame.where("id < 950"))
        assert "dealt 'train'" in capfd.readouterr().err
        assert json.loads((warm_out / "0.json").read_text())["train"]["rows_per_rank"] == [150]
    _until(lambda: not any(root.iterdir()), "the pool's shard folder outlives it")


def test_a_dataframe_on_a_pool_of_driver_ranks_is_refused_with_the_fix(local_spark):
    with HorovodPool(np=-1) as pool:
        with pytest.raises(PayloadError, match=r"this pool's ranks run on the driver without "
                                               r"Spark\. Fix: start the pool with np=1"):
            pool.run(jobs.shard_report, out="/nonexistent", train=mixed_frame(local_spark))
        assert pool.run(jobs.pool_keep, kept="yes") > 0


def test_an_interrupt_stops_the_cell_and_the_users_job_but_not_the_pools_stage(local_spark,
                                                                             tmp_path):
    """pyspark's Ctrl-C handler cancels every Spark job: the pool's stage must not be one of
    them (it was, and the pool lost its ranks while the cell said it kept them)."""
    tracker = local_spark.sparkContext.statusTracker()
    pysparks_handler = signal.getsignal(signal.SIGINT)
    with HorovodPool(np=1) as pool:  # local[2]: the user's own job runs on the other slot
        pid = pool.run(jobs.pool_keep, kept="yes")
        pool_jobs = tracker.getJobIdsForGroup(pool.backend._group)
        users_job: dict = {}

        def users_long_job():
            local_spark.sparkContext.setJobGroup("users-own", "a long job of the user's")
            try:
                local_spark.range(0, 10**12, 1, 1).selectExpr("sum(id % 7)").collect()
            except Exception as exc:  # noqa: BLE001
                users_job["error"] = str(exc)

        def interrupt_when_both_run():
            while not ((tmp_path / "0").exists() and tracker.getJobIdsForGroup("users-own")):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)

        user = threading.Thread(target=users_long_job, daemon=True)
        user.start()
        threading.Thread(target=interrupt_when_both_run, daemon=True).start()
        with pytest.raises(JobInterrupted, match=r"the pool keeps its ranks and their "
                                                 r"variables\. Where each rank was:\n"
                                                 r"  rank 0: .*jobs\.py:\d+ pool_sleep_marked"):
            pool.run(jobs.pool_sleep_marked, marks=str(tmp_path))
        user.join(60)
        assert "cancel" in users_job.get("error", "").lower(), users_job  # the user's job: ended
        # the same interrupt would have cancelled the pool's job in the same scheduler event
        assert [tracker.getJobInfo(j).status for j in pool_jobs] == ["RUNNING"]
        assert pool.run(jobs.pool_read, name="kept") == ("yes", pid)
    assert signal.getsignal(signal.SIGINT) is pysparks_handler  # put back with the last pool


