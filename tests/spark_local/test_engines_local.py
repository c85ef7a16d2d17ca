"""torch.distributed and tf.distribute ranks as Spark barrier tasks on local Spark: Gloo DDP with
torchrun's variables, DataFrame shards feeding DDP, a Keras fit under
MultiWorkerMirroredStrategy, the magic's --engine and the drop-in's Spark mode."""
import pytest

from hvd_magics import HorovodJobError, HorovodRunner, TorchDistributor, last_run
from tests import engine_jobs


def test_ddp_on_two_spark_tasks_of_one_host(local_spark):
    views = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_allreduce)
    assert [v["sum"] for v in views] == [3.0, 3.0]
    # one rank per task, the two tasks on one host: each rank is told it shares it
    assert [(v["rank"], v["local_rank"], v["local_world_size"]) for v in views] == [
        (0, 0, 2), (1, 1, 2)]
    assert views[0]["horovod_vars"] == []
    assert last_run().where.startswith("spark") and last_run().engine == "torch"


def test_ddp_trains_on_dataframe_shards(local_spark):
    frame = local_spark.range(0, 1280).selectExpr(
        "array(cast(id % 7 as float), cast(id % 5 as float), 1.0f, 0.0f, 0.5f, 0.25f, 2.0f, "
        "cast(id % 3 as float)) as x", "cast(id % 7 + id % 5 as float) as y")
    result = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_mlp, epochs=2, batch=32,
                                                      shard=frame)
    assert len(set(result["checksums"])) == 1
    record = last_run()
    assert record.shards[0]["name"] == "shard" and sum(record.shards[0]["rows_per_rank"]) == 1280
    assert [row["samples"] for row in record.epochs] == [1280, 1280]  # both ranks


def test_a_keras_fit_under_multi_worker_mirrored_strategy_on_spark(local_spark):
    result = HorovodRunner(np=2, engine="tf").run(engine_jobs.tf_mwms_fit, epochs=2)
    assert result["workers"] == 2 and len(result["cluster"]) == 2
    assert last_run().engine == "tf" and len(last_run().epochs) == 2
    frame = local_spark.range(0, 512).selectExpr(
        "array(cast(id % 7 as float), 1.0f, 0.5f, cast(id % 3 as float)) as x",
        "cast(id % 7 + id % 3 as float) as y")
    on_shards = HorovodRunner(np=2, engine="tf").run(engine_jobs.tf_mwms_fit, epochs=2,
                                                      shard=frame)
    assert on_shards["workers"] == 2 and on_shards["loss"] > 0
    assert sum(last_run().shards[0]["rows_per_rank"]) == 512


def test_the_magic_runs_a_ddp_cell_and_refuses_hvd_init_in_one(ip, local_spark, capsys):
    cell = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "t = torch.tensor([float(dist.get_rank() + 1)])\n"
            "dist.all_reduce(t)\n"
            "total = t.item()\n")
    ip.run_cell_magic("horovod", "np=2 --engine torch --return total -q", cell)
    assert ip.user_ns["total"] == 3.0
    assert ip.run_cell_magic("horovod", "np=2 engine=torch -q",
                             "import os\nos.environ['MASTER_PORT'] != ''\n") is True
    with pytest.raises(HorovodJobError, match="WrongEngineError: hvd.init.. was called, but "
                                              "this job runs on the torch engine"):
        ip.run_cell_magic("horovod", "np=2 --engine torch -q",
                          "import horovod.torch as hvd\nhvd.init()\n")


def test_the_drop_in_on_spark_tasks_and_its_gpu_check(local_spark):
    def train(learning_rate):
        import torch.distributed
        torch.distributed.init_process_group(backend="gloo")
        return {"lr": learning_rate, "size": torch.distributed.get_world_size()}

    assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        train, 1e-3) == {"lr": 1e-3, "size": 2}
    assert last_run().where.startswith("spark")
    with pytest.raises(RuntimeError, match="use_gpu=True, but spark.task.resource.gpu.amount "
                                           "is unset.* Fix: set spark.task.resource.gpu.amount=1"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True).run(train, 1e-3)


def test_a_warm_torch_pool_on_spark_keeps_its_process_group(local_spark):
    from hvd_magics import HorovodPool

    with HorovodPool(np=2, engine="torch") as pool:
        first = pool.run(engine_jobs.ddp_allreduce_kept)
        again = pool.run(engine_jobs.ddp_allreduce_kept)
    assert first["sum"] == again["sum"] == 3.0
    assert first["pid"] == again["pid"] and again["initialised_before"]
    assert not pool.alive


@pytest.mark.parametrize("engine", ["torch", "horovod"])
def test_a_rank_lost_in_a_spark_job_restarts_it_on_a_new_stage_from_its_checkpoint(
        local_spark, tmp_path, engine):
    whole = HorovodRunner(np=2, engine=engine, checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_with_checkpoints, engine=engine)
    runner = HorovodRunner(np=2, engine=engine, restarts=1, checkpoint_dir=tmp_path / "lost")
    resumed = runner.run(engine_jobs.steps_with_checkpoints, kill_on=(12, [0]), engine=engine)
    assert resumed["weights"] == whole["weights"]
    assert (resumed["attempt"], resumed["start"]) == (1, 10)
    assert len(last_run().attempts) == 2 and last_run().where == "spark local[2]"


def test_a_rank_lost_in_a_spark_job_resumes_from_the_step_its_host_kept_in_memory(
        local_spark, tmp_path):
    """Issue 84, in Spark tasks: Horovod's ranks keep every step in the host's memory; a rank
    SIGKILLed costs at most the step under way, and the job ends bit for bit."""
    env = {"HVD_MAGICS_KEEP_DIR": str(tmp_path / "keep"), "HVD_MAGICS_KEEP_IDLE_S": "30"}
    whole = HorovodRunner(np=2, checkpoint_dir=tmp_path / "whole", env=env).run(
        engine_jobs.steps_kept, engine="horovod")
    resumed = HorovodRunner(np=2, restarts=1, checkpoint_dir=tmp_path / "lost", env=env).run(
        engine_jobs.steps_kept, engine="horovod", kill_on=(12, [0]))
    assert (resumed["weights"], resumed["moment"]) == (whole["weights"], whole["moment"])
    assert resumed["attempt"] == 1 and resumed["start"] in (12, 13)
    assert "kept in the memory of 1 host" in last_run().attempts[0]
    assert [p for p in (tmp_path / "keep").glob("*/*") if p.is_dir()] == []  # dropped


def test_a_shard_given_to_a_trainer_that_deals_it_out_again_is_refused_with_the_fix(
        local_spark):
    """Hugging Face's Trainer and Lightning's (its DistributedSampler) would each train every
    rank on half of its shard; with use_distributed_sampler=False Lightning trains every row."""
    frame = local_spark.range(0, 100).selectExpr(
        "array(cast(id % 7 as float), 1.0f, 0.5f, cast(id % 3 as float)) as x",
        "cast(id % 7 as float) as y")
    refusals, trained, rows = HorovodRunner(np=2, engine="torch").run(
        engine_jobs.trainers_given_a_shard, train=frame)
    assert len(refusals) == 2, refusals
    assert refusals[0].startswith(f"ShardDealtAgainError: the Trainer's train_dataset holds this "
                                  f"rank's shard of train ({rows} of its 100 rows), and the "
                                  f"Trainer deals its dataset out over the 2 ranks again"), refusals
    assert "Fix: give every rank all the rows (in the notebook, rows = train.toPandas()" \
        in refusals[0]
    assert refusals[1].startswith("ShardDealtAgainError: the DataLoader given to Trainer.fit "
                                  "holds this rank's shard of train"), refusals
    assert "Fix: Trainer(use_distributed_sampler=False, ...)" in refusals[1]
    assert rows == 50 and trained == 50  # its shard, every row once
    assert [row["samples"] for row in last_run().epochs] == [100]  # the DataFrame


def test_distributed_runs_a_decorated_function_on_spark_tasks_and_returns_every_ranks_value(
        local_spark, capsys):
    """Databricks' serverless ``@distributed`` as its docs write it (``remote=True``: the
    executors), on a CPU cluster: every rank's value comes back, in rank order."""
    from hvd_magics import distributed

    @distributed(gpus=2, gpu_type="A10", remote=True)
    def run_train(scale):
        import os

        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.tensor(float(dist.get_rank() + 1))
        dist.all_reduce(total)
        dist.destroy_process_group()
        return {"rank": dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"]),
                "sum": float(total) * scale}

    assert run_train.distributed(scale=2) == [{"rank": 0, "sum": 6.0}, {"rank": 1, "sum": 6.0}]
    assert last_run().where.startswith("spark") and last_run().values == [
        {"rank": 0, "sum": 6.0}, {"rank": 1, "sum": 6.0}]
    assert "no GPU where the ranks run: 2 processes on CPU" in capsys.readouterr().err
    assert run_train.__name__ == "run_train"
