"""torch.distributed and tf.distribute ranks as processes on the driver (np < 0): real Gloo DDP,
a real MultiWorkerMirroredStrategy fit, failures, interrupts, pools and the drop-in."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvd_magics import (HorovodJobError, HorovodPool, HorovodRunner, JobInterrupted,
                        TorchDistributor, last_run)
from hvd_magics.launch.payload import serialize_job
from tests import engine_jobs
from tests.conftest import interrupt_once_marked, rank_processes_alive


def test_ddp_allreduce_on_two_driver_ranks_with_torchrun_variables():
    views = HorovodRunner(np=-2, engine="torch").run(engine_jobs.ddp_allreduce)
    assert [v["sum"] for v in views] == [3.0, 3.0]
    assert [(v["rank"], v["size"], v["local_rank"], v["local_world_size"]) for v in views] == [
        (0, 2, 0, 2), (1, 2, 1, 2)]
    assert views[0]["horovod_vars"] == []  # no Horovod environment on another engine's ranks
    record = last_run()
    assert record.status == "succeeded" and record.engine == "torch"
    assert ("engine", "torch.distributed") in record._rows()
    assert rank_processes_alive([v["pid"] for v in views]) == []


def test_a_ddp_training_loop_reports_its_progress_and_epochs():
    result = HorovodRunner(np=-2, engine="torch").run(engine_jobs.ddp_mlp, epochs=2, steps=10)
    assert len(set(result["checksums"])) == 1  # DDP kept the ranks' weights equal
    epochs = last_run().epochs
    assert sorted({(row["epoch"]) for row in epochs}) == [1, 2]
    assert all(row["samples"] == 640 and set(row["rank_seconds"]) == {0, 1} for row in epochs)


@pytest.mark.parametrize("engine, job, expect", [
    ("torch", engine_jobs.ddp_fail, "ValueError: boom from DDP rank 1"),
    ("tf", engine_jobs.tf_mwms_fit, "ValueError: boom from tf worker 1"),
])
def test_a_failing_rank_ends_the_job_promptly_under_each_engine(engine, job, expect):
    kwargs = {"bad_rank": 1} if engine == "torch" else {"fail_rank": 1}
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine=engine).run(job, **kwargs)
    assert time.monotonic() - start < 60
    text = str(info.value)
    assert "rank 1" in text and expect in text, text
    assert rank_processes_alive(list(last_run().pids.values())) == []


@pytest.mark.parametrize("engine", ["torch", "tf"])
def test_an_interrupt_stops_every_rank_under_each_engine(engine, tmp_path):
    interrupt_once_marked(tmp_path, limit=120)
    with pytest.raises(JobInterrupted) as info:
        HorovodRunner(np=-2, engine=engine).run(engine_jobs.wait_marked, marks=str(tmp_path),
                                                engine=engine)
    text = str(info.value)
    assert "nothing is left running" in text and "wait_marked" in text, text
    assert last_run().status == "interrupted"
    assert rank_processes_alive(list(last_run().pids.values())) == []


def test_hvd_init_on_the_torch_engine_fails_with_one_line_naming_it():
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine="torch").run(engine_jobs.horovod_on_torch_engine)
    assert time.monotonic() - start < 60
    assert ("WrongEngineError: hvd.init() was called, but this job runs on the torch engine"
            in str(info.value))


def test_a_keras_fit_under_multi_worker_mirrored_strategy_on_two_driver_ranks():
    result = HorovodRunner(np=-2, engine="tf").run(engine_jobs.tf_mwms_fit, epochs=2)
    assert result["workers"] == 2 and result["index"] == 0
    assert len(result["cluster"]) == 2 and result["loss"] > 0
    record = last_run()
    assert record.engine == "tf" and sorted({row["epoch"] for row in record.epochs}) == [1, 2]


def test_a_warm_pool_keeps_the_process_group_across_runs():
    with HorovodPool(np=-2, engine="torch") as pool:
        assert "engine='torch'" in repr(pool)
        first = pool.run(engine_jobs.ddp_allreduce_kept)
        again = pool.run(engine_jobs.ddp_allreduce_kept)
        assert first["sum"] == again["sum"] == 3.0
        assert first["pid"] == again["pid"] and again["initialised_before"]
        with pytest.raises(ValueError, match="not the warm pool's engine"):
            HorovodRunner(np=-2, engine="tf", pool=pool)


def test_the_drop_in_runs_pysparks_docstring_example_unchanged_but_for_cpu():
    # pyspark's TorchDistributor docstring, with backend="gloo" and use_gpu=False (no GPU here)
    # and the process group destroyed with torch.distributed's own call (the docstring's
    # torch.destroy_process_group() does not exist)
    def train(learning_rate):
        import torch.distributed
        torch.distributed.init_process_group(backend="gloo")
        model = {"lr": learning_rate, "rank": torch.distributed.get_rank()}
        torch.distributed.destroy_process_group()
        return model  # or anything else

    distributor = TorchDistributor(
        num_processes=2,
        local_mode=True,
        use_gpu=False)
    model = distributor.run(train, 1e-3)
    assert model == {"lr": 1e-3, "rank": 0}
    assert last_run().engine == "torch" and last_run().size == 2


def test_a_ddp_model_freed_after_its_group_was_destroyed_never_hangs_its_rank():
    """Train DDP, destroy the group, return (the TorchDistributor pattern): freeing the model
    destroyed the group with the GIL held while a Gloo thread waited for the GIL to free its
    last collective, and one rank hung for good, its peer done (PyTorch 2.13; about one job in
    five under the suite, the second job of a fresh zygote in 3 of 3 tries). A rank now keeps
    each destroyed group until the next init_process_group (hvd_magics.rank.torch_group_hold)."""
    runner = HorovodRunner(np=-2, engine="torch", timeout=60)  # a hang fails, not waits
    losses = [runner.run(engine_jobs.ddp_then_destroy) for _ in range(8)]
    assert all(0.0 < loss < 3.0 for loss in losses), losses


def test_a_pools_cell_lets_go_of_the_groups_it_destroyed_before_the_next_cell_starts_one():
    """A group a warm pool's cell destroyed is kept while the cell's code runs, and let go when
    the cell ends: kept into the next cell, its store (rank 0's, on the pool's MASTER_PORT)
    answered a peer's next init_process_group with the old group's addresses, and the peer's
    first collective failed with "Connection reset by peer" (a fresh clone's suite)."""
    with HorovodPool(np=-2, engine="torch") as pool:
        first = pool.run(engine_jobs.ddp_then_destroy)
        kept = pool.run(engine_jobs.groups_kept_around_init)
        again = pool.run(engine_jobs.ddp_then_destroy)
    assert kept == (0, 0, 1)  # none from the cell before; its own, once it destroyed it
    assert 0.0 < first < 3.0 and again == pytest.approx(first)


def test_rank_0_keeps_the_store_until_its_peers_have_left_also_when_the_job_destroyed_the_group():
    """Rank 0 holds the group's store. Where the job's code destroyed the group, rank 0 ended
    at once, while a peer could still be inside init_process_group reading the store: that
    peer failed with "DistNetworkError: Connection reset by peer" (the docstring example's
    test, in a fresh clone's suite). Now the ranks leave through the destroyed group's store as
    through a live one's: rank 0 sends its result only once rank 1 has left, 1.5 s after
    rank 0 itself left its code (the two ranks' events travel apart: their order on arrival
    says nothing within a millisecond)."""
    arrived = []

    class Arrivals:
        def on_event(self, job, event):
            arrived.append((event.get("kind"), event.get("rank"), time.monotonic()))

        def on_tick(self, job):
            pass

        def on_end(self, job):
            pass

    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.destroy_then_linger, {"seconds": 1.5}), views=[Arrivals()])
    assert record.value == 0
    at = {(kind, rank): when for kind, rank, when in arrived}
    assert at[("leaving", 1)] - at[("leaving", 0)] >= 1.0, arrived  # rank 1 lingered
    assert at[("result", 0)] - at[("leaving", 0)] >= 1.0, arrived  # and rank 0 stayed for it


def test_the_drop_in_runs_a_file_with_its_arguments(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, os, pathlib\n"
        "import torch, torch.distributed as dist\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--learning-rate', type=float)\n"
        "args = parser.parse_args()\n"
        "dist.init_process_group('gloo')\n"
        "total = torch.tensor([1.0]); dist.all_reduce(total)\n"
        f"pathlib.Path({str(tmp_path)!r}, f'rank{{dist.get_rank()}}').write_text("
        "f'{args.learning_rate} {total.item()}')\n")
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert distributor.run(str(script), "--learning-rate=1e-3") is None
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["0.001 2.0"] * 2
    with pytest.raises(HorovodJobError, match=r"the first was rank [01] on localhost: SystemExit: "
                                              r"2\n  rank [01] on localhost: the same SystemExit"):
        distributor.run(str(script), "--nope")
    # both ranks print it; the cell shows it once, from whichever rank printed it first
    assert re.search(r"^\[[01]\] train.py: error: unrecognized arguments: --nope$",
                     capsys.readouterr().out, re.M)


def test_a_background_ddp_job_and_its_stacks():
    job = HorovodRunner(np=-2, engine="torch").start(engine_jobs.ddp_allreduce)
    views = job.wait(120)
    assert [v["sum"] for v in views] == [3.0, 3.0]
    assert job.record.engine == "torch" and job.record.status == "succeeded"


def test_uneven_collectives_under_torch_end_the_job_in_seconds_naming_both_ranks(capfd):
    """Rank 0 makes three all_reduce calls, rank 1 two: the cell hung until interrupted (rank 1
    waited in the end's barrier, rank 0 in its third all_reduce). The first two values are
    right; no wrong value is shown."""
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine="torch").run(engine_jobs.uneven_all_reduces)
    took = time.monotonic() - start
    text = str(info.value)
    assert "rank 0 waits in a torch.distributed collective that rank 1 will never enter" in text
    assert "uneven_all_reduces" in text and "same collective calls in the same order" in text
    assert took < 45, took
    out = capfd.readouterr()
    # two calls, two ranks: the log has every line; the cell shows each once (rank 1's copy of
    # a line rank 0 showed is folded) and says it folded two
    log = Path(last_run().log_path).read_text()
    assert log.count("all_reduce gave 2.0") == 4
    assert (out.out + out.err).count("all_reduce gave 2.0") == 2
    assert "2 lines another rank had already shown" in out.out
    assert "all_reduce gave" not in (out.out + out.err + log).replace("all_reduce gave 2.0", "")
    assert rank_processes_alive(list(last_run().pids.values())) == []


def test_ddp_ranks_taking_different_numbers_of_steps_end_the_job_in_seconds_naming_both():
    """Rank 0 takes 30 DDP steps, rank 1 15: rank 0 waited for ever in DDP's allreduce inside
    backward(), whose innermost frame is autograd's, not torch.distributed's."""
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine="torch", timeout=150).run(engine_jobs.ddp_uneven_steps)
    took = time.monotonic() - start
    text = str(info.value)
    assert text.startswith("rank 0 waits in DDP's gradient allreduce (inside backward()) for "
                           "rank 1, which finished the job's code (rank 1 after 15 steps); rank 0 "
                           "is in its step 16."), text
    assert "ddp_uneven_steps" in text and "drop_last=True" in text and "model.join()" in text
    assert "JobTimeoutError" not in text and took < 45, (took, text)
    assert rank_processes_alive(list(last_run().pids.values())) == []


def test_ddp_ranks_taking_different_numbers_of_steps_inside_join_succeed():
    """DDP's join context is the fix the verdict names: it must not be taken for a hang."""
    assert HorovodRunner(np=-2, engine="torch", timeout=150).run(
        engine_jobs.ddp_uneven_steps, steps=(30, 5), join=True) == 30


def test_uneven_collectives_on_a_torch_pool_end_the_cell_and_the_pool_serves_again():
    with HorovodPool(np=-2, engine="torch") as pool:
        with pytest.raises(HorovodJobError, match="rank 0 waits in a torch.distributed "
                                                  "collective that rank 1 will never enter"):
            pool.run(engine_jobs.uneven_all_reduces)
        assert pool.run(engine_jobs.ddp_allreduce_kept)["sum"] == 3.0


def test_an_all_reduce_against_a_broadcast_ends_the_job_once_the_ranks_stall(capfd):
    """Both ranks wait in collectives that never meet; the cell hung with a stall line. Once
    both are stalled (here after 3 s) and found there twice, the job ends, naming both."""
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine="torch", stall_after=3, timeout=120).run(
            engine_jobs.all_reduce_against_broadcast)
    text = str(info.value)
    assert re.search(r"Rank 0 waits in all_reduce \(.*all_reduce_against_broadcast.*\), rank 1 "
                     r"in broadcast \(.*\): these collectives never meet; the job was stopped",
                     text), text
    out = capfd.readouterr()
    assert "value" not in out.out + out.err  # no rank went on with a value


def test_uneven_collectives_under_tf_end_the_job_in_seconds_naming_both_ranks(capfd):
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, engine="tf").run(engine_jobs.uneven_tf_reduces)
    text = str(info.value)
    assert time.monotonic() - start < 60
    # rank 1 waits for rank 0 to leave (it used to leave at once, and rank 0's collective failed)
    assert text.startswith("rank 0 waits in a tf.distribute collective that rank 1 will never "
                           "enter"), text
    assert "same collective calls in the same order" in text
    out = capfd.readouterr()
    assert set(re.findall(r"reduce gave (\S+)", out.out + out.err)) == {"2.0"}


def test_keras_3_fit_under_two_tf_workers_is_refused_and_its_custom_loop_trains():
    """Keras 3.15's fit under a MultiWorkerMirroredStrategy of two workers failed at its first
    batch with "Attempt to convert a value (PerReplica...)" (keras-team/keras#20585): it is
    refused before it starts, with the fix; the custom loop the fix names trains both workers
    to the same weights."""
    refusal, weights = HorovodRunner(np=-2, engine="tf").run(engine_jobs.keras_3_on_tf_engine)
    assert refusal.startswith("KerasVersionError: the model is a Keras 3 model"), refusal
    assert "keras-team/keras#20585" in refusal and "Fix: build the model" in refusal
    assert len(weights) == 2 and weights[0] == weights[1], weights


def test_keras_3_fit_on_the_torch_backend_is_refused_where_it_would_train_each_rank_alone():
    with pytest.raises(HorovodJobError, match=r"KerasVersionError: Keras 3's Model.fit on the "
                                              r"torch backend would train each of the job's 2 "
                                              r"ranks alone.*Fix: on the torch backend wrap"):
        HorovodRunner(np=-2, engine="torch", env={"KERAS_BACKEND": "torch"}).run(
            engine_jobs.keras_3_fit)
    assert HorovodRunner(np=-1, engine="torch", env={"KERAS_BACKEND": "torch"}).run(
        engine_jobs.keras_3_fit) == "torch"


def test_distributed_on_the_driver_returns_every_ranks_value_and_names_a_failing_rank():
    """``@distributed`` (AI Runtime's spelling, ``num_accelerators``) with the ranks on the driver;
    a plain call runs the function here, once; a rank's error names that rank."""
    from hvd_magics import distributed

    @distributed(num_accelerators=2)
    def train(fail_on=-1):
        import os
        rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
        if rank == fail_on:
            raise ValueError(f"rank {rank} could not read its data")
        return rank, int(os.environ.get("WORLD_SIZE", "1"))

    assert train.distributed() == [(0, 2), (1, 2)]
    assert train() == (None, 1)  # called as itself: here, once
    with pytest.raises(HorovodJobError, match=r"the first was rank 1 on .*ValueError: rank 1 "
                                              r"could not read its data"):
        train.distributed(fail_on=1)
    with pytest.raises(ValueError, match=r"@distributed\(\) runs a process per GPU of the "
                                         r"driver, and it has none. Fix: @distributed\(gpus=N\)"):
        distributed(lambda: 1).distributed()
    with pytest.raises(ValueError, match=r"@distributed\(remote=True\) runs on the cluster's "
                                         r"executors.*Fix: @distributed\(gpus=N, remote=True\)"):
        distributed(remote=True)(lambda: 1).distributed()
    with pytest.raises(ValueError, match="gpus=2 and num_accelerators=4 disagree"):
        distributed(gpus=2, num_accelerators=4)


# The engine guard of a fresh rank process (each imports Horovod and its framework: the driver
# tier's cost, not the quick tier's).
_GUARDED = """
import os, sys
os.environ["HVD_MAGICS_ENGINE"] = sys.argv[1]
from hvd_magics.rank.guards import engine_guard
engine_guard.install()
call = sys.argv[2]
try:
    if call == "hvd":
        import horovod.torch as hvd
        hvd.init()
    elif call == "torch":
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:1")
    print("NO ERROR")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("engine, call, expect", [
    ("torch", "hvd", "WrongEngineError hvd.init() was called, but this job runs on the torch"),
    ("tf", "hvd", "WrongEngineError hvd.init() was called, but this job runs on the tf engine"),
    ("horovod", "torch", "WrongEngineError torch.distributed.init_process_group() was called, "
                         "but this job runs on the horovod engine"),
])
def test_the_guard_refuses_another_engines_start_call(engine, call, expect):
    out = subprocess.run([sys.executable, "-c", _GUARDED, engine, call], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip().startswith(expect), out.stdout + out.stderr
