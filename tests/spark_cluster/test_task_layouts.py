"""Several ranks per Spark task (issue 41) on the tier's standalone cluster of two 2-core
workers on loopback, each with two simulated GPUs (``tests/fake_gpus.sh``, a discovery script
as pyspark's own tests use: no GPU here). The session gives each task 2 GPUs, so jobs run 2
ranks per task by default, each task holding 2 CPUs through a stage-level resource profile.
(This module's name sorts after the tier's others: the tier switches its session once.)

A rank's host is its executor's address as Spark's barrier tasks report it. On loopback both
executors report 127.0.0.1 (even a worker started on 127.0.0.2: an executor without an RPC server
of its own is known by the address it connects from), so the four ranks share one host, which
is the truth here; ranks of tasks on different hosts are planned node by node in the unit tests
(``tests/unit/test_engines.py``, ``tests/unit/test_slots.py``)."""
from __future__ import annotations

import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from hvd_magics.errors import NotEnoughSlotsError
from tests import engine_jobs, jobs
from tests.conftest import rank_processes_alive
from tests.spark_cluster.test_standalone_cluster import kill_rank_1s_executor_once_marked

def _by_rank(views):
    return sorted(views, key=lambda v: v["rank"])


def test_horovod_ranks_two_per_task_know_their_host(gpu_cluster_spark):
    views = _by_rank(HorovodRunner(np=4).run(engine_jobs.topology_views, engine="horovod"))
    record = last_run()
    assert record.where.endswith("(2 tasks x 2 ranks)"), record.where
    assert [v["sum"] for v in views] == [10.0] * 4  # the allreduce spans both tasks
    assert len({v["pid"] for v in views}) == 4
    # one host: four local ranks, numbered task by task
    assert [(v["local_rank"], v["local_size"], v["cross_rank"], v["cross_size"])
            for v in views] == [(0, 4, 0, 1), (1, 4, 0, 1), (2, 4, 0, 1), (3, 4, 0, 1)]
    # two executors each told they hold GPUs 0 and 1: a rank each, and since two ranks of the
    # host then hold the same one, each rank sees only its own (never a list with repeats)
    assert [v["cuda"] for v in views] == ["0", "1", "0", "1"]


def test_torch_ranks_get_torchruns_node_variables(gpu_cluster_spark):
    views = _by_rank(HorovodRunner(np=4, engine="torch").run(engine_jobs.topology_views,
                                                             engine="torch"))
    assert [v["sum"] for v in views] == [10.0] * 4
    assert [v["torchrun"] for v in views] == [
        {"RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4",
         "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"} for r in range(4)]
    # and a DDP step over the four
    views = HorovodRunner(np=4, engine="torch").run(engine_jobs.ddp_allreduce)
    assert [v["sum"] for v in views] == [10.0] * 4


def test_tf_workers_one_per_rank_each_with_its_own_gpu(gpu_cluster_spark):
    views = _by_rank(HorovodRunner(np=4, engine="tf").run(engine_jobs.topology_views,
                                                          engine="tf"))
    assert [v["sum"] for v in views] == [10.0] * 4
    assert len(views[0]["workers"]) == 4 and len({v["pid"] for v in views}) == 4
    assert [v["cuda"] for v in views][:1] == ["0"]  # a worker would take every GPU it sees


def test_each_rank_gets_its_own_shard_of_its_tasks_rows(gpu_cluster_spark, tmp_path):
    import json

    frame = gpu_cluster_spark.range(0, 1000).selectExpr("id", "cast(id % 7 as double) as x")
    HorovodRunner(np=4).run(jobs.shard_report, out=str(tmp_path), train=frame)
    shards = last_run().shards[0]
    assert len(shards["rows_per_rank"]) == 4 and sum(shards["rows_per_rank"]) == 1000
    assert min(shards["rows_per_rank"]) > 0
    ids = [json.loads((tmp_path / f"{r}.json").read_text())["train"]["ids"] for r in range(4)]
    assert [len(mine) for mine in ids] == shards["rows_per_rank"]
    assert sorted(i for mine in ids for i in mine) == list(range(1000))  # disjoint, whole


def test_a_failing_rank_ends_every_tasks_ranks(gpu_cluster_spark):
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=4).run(jobs.fail_on_rank, bad_rank=3)
    assert [f.rank for f in info.value.failures][:1] == [3], info.value
    assert rank_processes_alive(last_run().pids.values()) == []
    assert HorovodRunner(np=4).run(jobs.print_lines, count=1) == 0  # the cluster serves again


def test_a_lost_executor_names_both_of_its_ranks(gpu_cluster_spark, tmp_path):
    kill_rank_1s_executor_once_marked(tmp_path)
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=4).run(jobs.sleep_in_allreduce, pid_dir=str(tmp_path))
    lost = sorted(f.rank for f in info.value.failures if f.error == "RankLost")
    assert lost[:2] == [0, 1], info.value  # rank 1's task held ranks 0 and 1
    assert rank_processes_alive(last_run().pids.values()) == []


def test_np_that_does_not_fill_the_tasks_is_refused_at_once(gpu_cluster_spark):
    began = time.monotonic()
    with pytest.raises(NotEnoughSlotsError, match=r"np=3 ranks do not fill tasks of 2 ranks "
                       r"each \(the default: spark.task.resource.gpu.amount=2"):
        HorovodRunner(np=3).run(jobs.print_lines, count=1)
    with pytest.raises(NotEnoughSlotsError, match=r"np=6 as 3 tasks of 2 ranks needs 3 free "
                       r"Spark task slots at once \(barrier mode\), but the cluster has 2 free"):
        HorovodRunner(np=6).run(jobs.print_lines, count=1)
    assert time.monotonic() - began < 30


def test_the_torch_distributor_drop_in_runs_a_rank_per_gpu_of_each_task(gpu_cluster_spark):
    """As pyspark's TorchDistributor with spark.task.resource.gpu.amount=2: num_processes / 2
    tasks, two processes each (the ranks train with Gloo here: the GPUs are simulated)."""
    from hvd_magics import TorchDistributor

    def train():
        import os

        import torch.distributed as dist

        dist.init_process_group("gloo")
        return dist.get_world_size(), os.environ["LOCAL_WORLD_SIZE"]

    assert TorchDistributor(num_processes=4, local_mode=False, use_gpu=True).run(train) == (
        4, "4")
    assert last_run().where.endswith("(2 tasks x 2 ranks)")
    # without GPUs a rank per task, as pyspark's (each task still holds the session's 2 GPUs,
    # so the cluster runs 2 of them)
    assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train) == (
        2, "2")
    assert not last_run().where.endswith("ranks)")
    with pytest.raises(RuntimeError, match=r"num_processes=3 is not a multiple of that\. "
                                           r"Fix: num_processes=2"):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=True).run(train)
