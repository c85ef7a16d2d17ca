"""Training libraries that start processes of their own, plan other ranks than the job's, or
would train each rank alone, refused in one line naming the fix
(hvd_magics/rank/integrations/: lightning.py, accelerate.py, ...), or joined to the job: real Lightning,
accelerate, Hugging Face and Keras on two ranks on the driver."""
import pytest

from hvd_magics import HorovodJobError, HorovodRunner
from tests import engine_jobs


def test_a_lightning_trainer_that_fits_the_job_trains_one_that_does_not_is_refused():
    runner = HorovodRunner(np=-2, engine="torch", timeout=120)
    assert runner.run(engine_jobs.lightning_fit, devices=2, num_nodes=1,
                      strategy="ddp") == (0, 2, 0)
    # no layout written (devices="auto" is 1 on a CPU): it takes the job's shape by itself
    assert runner.run(engine_jobs.lightning_fit) == (0, 2, 0)
    # two ranks on one host: devices=1, num_nodes=2 failed deep in Lightning (IndexError)
    with pytest.raises(HorovodJobError, match=r"LaunchMismatchError: Lightning's Trainer\(devices"
                       r"=1, num_nodes=2\) plans 2 processes, 1 per node, and the job runs 2 "
                       r"ranks as 1 node of 2\. Fix: leave devices and num_nodes out of "
                       r"Trainer\(\.\.\.\) \(they then take the job's shape\), or write "
                       r"Trainer\(devices=2, num_nodes=1, strategy='ddp'\)"):
        runner.run(engine_jobs.lightning_fit, devices=1, num_nodes=2)
    with pytest.raises(HorovodJobError, match=r"Lightning's strategy starts its processes itself "
                                              r"\(spawn\).*Trainer\(devices=2"):
        runner.run(engine_jobs.lightning_fit, devices=2, num_nodes=1, strategy="ddp_spawn")


def test_a_fabric_without_a_layout_takes_the_jobs_shape():
    """``Fabric(accelerator="cpu")`` planned 1 process (devices="auto") on each rank."""
    assert HorovodRunner(np=-2, engine="torch", timeout=120).run(engine_jobs.fabric_sum) == (
        0, 2, 3.0)


def test_accelerates_notebook_launcher_in_a_cell_is_refused():
    with pytest.raises(HorovodJobError, match=r"accelerate's notebook_launcher starts processes "
                       r"of its own.*Fix: call the training function directly: Accelerator\(\) "
                       r"joins the job's torch.distributed group \(run the cell with --engine "
                       r"torch\)"):
        HorovodRunner(np=-2, timeout=60).run(engine_jobs.accelerate_notebook_launcher)


def test_a_default_accelerator_on_cpu_ranks_joins_the_job():
    """``Accelerator()`` without ``cpu=True`` saw WORLD_SIZE=2 and ran each rank alone
    (num_processes 1, no DDP) while the job reported 2 ranks and succeeded."""
    processes, wrapped, _logged = HorovodRunner(np=-2, engine="torch", timeout=120).run(
        engine_jobs.accelerate_loop, epochs=1, cpu=False)
    assert (processes, wrapped) == (2, "DistributedDataParallel")


@pytest.mark.parametrize("engine, library, says", [
    ("horovod", "accelerate", r"Accelerate runs this rank as 1 process of its own while the job "
                              r"has 2 ranks: each rank would train a model of its own on its own "
                              r"data\. Accelerate joins a torch.distributed group, which only "
                              r"the torch engine's ranks have\. Fix: run the cell with --engine "
                              r"torch"),
    ("tf", "hf", r"Hugging Face's Trainer \(on Accelerate\) runs this rank as 1 process of its "
                 r"own while the job has 2 ranks.*--engine torch"),
    ("horovod", "lightning", r"Lightning's Trainer runs this rank as 1 process of its own while "
                             r"the job has 2 ranks.*--engine torch"),
    ("tf", "keras", r"Keras trains this worker's model alone \(1 replica\) while the job has 2 "
                    r"workers.*MultiWorkerMirroredStrategy\(\)\.scope\(\)"),
])
def test_a_library_that_would_train_each_rank_alone_is_refused(engine, library, says):
    with pytest.raises(HorovodJobError, match=r"RunsAloneError: " + says):
        HorovodRunner(np=-2, engine=engine, timeout=120).run(engine_jobs.library_alone,
                                                             library=library)


def test_a_rank_s_own_single_process_work_runs_and_training_each_rank_alone_is_refused():
    """After DDP training, rank 0 alone predicting with ``Trainer(devices=1)`` was refused
    (LaunchMismatchError, with a fix that would hang on one rank); a probe model fitted outside
    the strategy on a tf job's workers was refused too (RunsAloneError). Only training the job
    alone on each rank is refused, and ``hvd_magics.alone()`` says that is meant."""
    torch_job = HorovodRunner(np=-2, engine="torch", timeout=120)
    assert torch_job.run(engine_jobs.work_alone, library="lightning") == 12
    with pytest.raises(HorovodJobError, match=r"RunsAloneError: Lightning's Trainer runs this "
                       r"rank as 1 process of its own while the job has 2 ranks.*inside `with "
                       r"hvd_magics\.alone\(\):`"):
        torch_job.run(engine_jobs.work_alone, library="lightning", fit_alone=True)
    assert torch_job.run(engine_jobs.work_alone, library="lightning", fit_alone="said") == \
        "fitted"
    loss = HorovodRunner(np=-2, engine="tf", timeout=120).run(engine_jobs.work_alone,
                                                                library="keras")
    assert loss >= 0.0


def _accelerators_with_plugins() -> list:
    """An Accelerator given an FSDP plugin, then one with cpu=True given a DeepSpeed plugin
    (which sets Accelerate's variable for DeepSpeed: it goes first): what each runs and what
    was said."""
    import os
    import warnings

    from accelerate import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState

    made = []
    for kwargs in ({"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)},
                   {"cpu": True, "deepspeed_plugin": DeepSpeedPlugin(zero_stage=2)}):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            runs = Accelerator(**kwargs).distributed_type.value
        made.append((runs, [str(w.message) for w in said if "plugin" in str(w.message)]))
        AcceleratorState._reset_state(True)  # the next Accelerator is made anew, and the
        for variable in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):  # plugins' marks
            os.environ.pop(variable, None)  # go, as in a process of its own
    return made


def test_an_accelerator_that_leaves_out_its_deepspeed_or_fsdp_plugin_says_so_with_the_fix():
    """Accelerate trained with DDP, saying nothing, an Accelerator(cpu=True) given a DeepSpeed
    plugin and one given an FSDP plugin on CPU ranks (Accelerate 1.15): the user believed the
    model's state was sharded."""
    (fsdp_runs, fsdp_said), (ds_runs, ds_said) = HorovodRunner(np=-2, engine="torch").run(
        _accelerators_with_plugins)
    assert (ds_runs, fsdp_runs) == ("MULTI_CPU", "MULTI_CPU")
    assert len(ds_said) == 1 and ds_said[0].startswith(
        "Accelerator(cpu=True) was given a DeepSpeed plugin and trains without DeepSpeed"), ds_said
    assert "Fix: leave out cpu=True" in ds_said[0], ds_said
    assert len(fsdp_said) == 1 and "Accelerate shards a model only on GPUs" in fsdp_said[0], \
        fsdp_said
