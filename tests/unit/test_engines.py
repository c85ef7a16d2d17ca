"""Engines: how each one's ranks meet, the wrong engine's start call, the options that pick one."""
import json

import pytest

from hvd_magics.options import horovod_only, validate_engine
from hvd_magics.rank.guards.engine_guard import wrong_engine_message
from hvd_magics.task.engines import PortOffer, engine_of, meet_env, offers_port, start_env
from hvd_magics.task.slots import node_ranks, plan_ranks


def test_torch_ranks_get_what_torchrun_sets():
    slots = plan_ranks(["10.0.0.1", "10.0.0.2"])
    on_spark = start_env("torch", slots[1], "10.0.0.1", "eth0", 1, 2)
    assert on_spark["MASTER_ADDR"] == "10.0.0.1" and on_spark["RANK"] == "1"
    assert on_spark["WORLD_SIZE"] == "2" and on_spark["GROUP_RANK"] == "1"
    assert (on_spark["NODE_RANK"], on_spark["GROUP_WORLD_SIZE"]) == ("1", "2")
    # alone on its host
    assert (on_spark["LOCAL_RANK"], on_spark["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert on_spark["GLOO_SOCKET_IFNAME"] == "eth0"
    assert on_spark["HVD_MAGICS_RANK"] == "1" and on_spark["HVD_MAGICS_ENGINE"] == "torch"
    assert not any(k.startswith("HOROVOD_") for k in on_spark)
    on_driver = start_env("torch", plan_ranks(["h"] * 3)[2], "127.0.0.1", "lo")
    assert (on_driver["LOCAL_RANK"], on_driver["LOCAL_WORLD_SIZE"]) == ("2", "3")
    assert on_driver["GROUP_RANK"] == "0"
    # two hosts of two ranks each, the tasks in any order: ranks node by node, the truth told
    shared = plan_ranks(["b", "a", "b", "a"])
    nodes = node_ranks(shared)
    views = [start_env("torch", s, "b", "", nodes[s.hostname], len(nodes)) for s in shared]
    assert [(v["RANK"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"], v["GROUP_RANK"])
            for v in views] == [("0", "0", "2", "0"), ("2", "0", "2", "1"),
                                ("1", "1", "2", "0"), ("3", "1", "2", "1")]
    assert meet_env("torch", 1, [("10.0.0.1", 29500), ("10.0.0.2", 0)]) == {
        "MASTER_PORT": "29500"}


def test_tf_ranks_get_a_tf_config_naming_every_worker_in_rank_order():
    config = json.loads(meet_env("tf", 1, [("10.0.0.1", 5000), ("10.0.0.2", 6000)])["TF_CONFIG"])
    assert config == {"cluster": {"worker": ["10.0.0.1:5000", "10.0.0.2:6000"]},
                      "task": {"type": "worker", "index": 1}}
    assert json.loads(meet_env("tf", 0, [("::1", 7)])["TF_CONFIG"])["cluster"]["worker"] == [
        "[::1]:7"]
    env = start_env("tf", plan_ranks(["h"])[0], "h", "")
    assert env == {"HVD_MAGICS_ENGINE": "tf", "HVD_MAGICS_RANK": "0", "HVD_MAGICS_SIZE": "1",
                   "HVD_MAGICS_RANK_HOST": "h", "HVD_MAGICS_HOST_RANK": "0"}


def test_horovod_ranks_keep_their_gloo_environment():
    env = start_env("horovod", plan_ranks(["h", "h"])[1], "127.0.0.1", "lo")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_GLOO_IFACE"] == "lo"
    assert meet_env("horovod", 1, [("h", 1234), ("h", 0)]) == {
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234"}


def test_who_offers_a_port():
    assert [offers_port("torch", r) for r in (0, 1)] == [True, False]
    assert [offers_port("tf", r) for r in (0, 1)] == [True, True]
    assert [offers_port("horovod", r) for r in (0, 1)] == [False, False]  # its rendezvous


def test_an_offered_port_is_held_until_released():
    import socket

    offer = PortOffer()
    probe = socket.socket()
    with pytest.raises(OSError):
        probe.bind(("", offer.port))
    probe.close()
    offer.release()
    listener = socket.socket()
    listener.bind(("", offer.port))  # free for the rank now
    listener.close()


def test_a_port_is_offered_from_outside_the_range_outgoing_connections_take_theirs():
    """An offered port is free for a moment before its rank listens on it: one from the
    ephemeral range was taken by another process's connection then ("Could not start gRPC
    server")."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral = int(ranges.read().split()[0])
    offers = [PortOffer() for _ in range(20)]
    assert all(offer.port < ephemeral for offer in offers), [offer.port for offer in offers]
    for offer in offers:
        offer.release()


def test_two_offers_that_draw_the_same_port_first_hold_two_ports(monkeypatch):
    """Two driver ranks of one tf job were both offered port 29444 (each offer's socket let
    the other bind it too, SO_REUSEADDR on both): rank 0 listened on it and rank 1 failed,
    "Could not start gRPC server" (seen in the driver tier)."""
    from hvd_magics.task import engines

    first = PortOffer()
    drawn = [first.port] + list(range(*engines.offered_ports()))[:49]
    monkeypatch.setattr(engines.random, "sample", lambda population, k: drawn[:k])
    second = PortOffer()
    try:
        assert second.port != first.port
    finally:
        first.release()
        second.release()


def test_engine_options_name_the_choices():
    assert [validate_engine(e) for e in ("horovod", "Torch", "ddp", "tensorflow", "tf")] == [
        "horovod", "torch", "torch", "tf", "tf"]
    with pytest.raises(ValueError, match="'jax' is not an engine: use 'horovod'"):
        validate_engine("jax")
    with pytest.raises(ValueError, match="not an engine"):
        engine_of({"HVD_MAGICS_ENGINE": "mxnet"})
    assert engine_of({}) == "horovod"
    horovod_only("x", "horovod", "")
    with pytest.raises(ValueError, match="x is Horovod's and this job runs on the torch engine"):
        horovod_only("x", "torch", "Fix: y")


def test_the_wrong_engine_message_is_one_line_naming_both():
    text = wrong_engine_message("horovod", "torch")
    assert "\n" not in text
    assert text.startswith("hvd.init() was called, but this job runs on the torch engine")
    assert "--engine" not in text.split("Fix:")[0] and "%%horovod without --engine" in text


def test_the_runner_refuses_what_only_horovod_has():
    from hvd_magics import HorovodRunner

    with pytest.raises(ValueError, match="an elastic job .* is Horovod's .* torch engine"):
        HorovodRunner(np="1:2", engine="torch")
    with pytest.raises(ValueError, match="Horovod Timeline .* tf engine. Fix: record a trace"):
        HorovodRunner(np=2, engine="tf", timeline="/tmp/t.json")
    runner = HorovodRunner(np=2, engine="DDP")
    assert runner.engine == "torch" and runner.env["HVD_MAGICS_ENGINE"] == "torch"
    assert HorovodRunner(np=2).engine == "horovod"


def test_torch_distributor_checks_its_input_as_pyspark_does():
    from hvd_magics import TorchDistributor

    with pytest.raises(ValueError, match="num_processes must be a positive whole number"):
        TorchDistributor(num_processes=0)
    with pytest.raises(ValueError, match="TorchDistributor sets engine itself"):
        TorchDistributor(num_processes=2, engine="tf")
    with pytest.raises(RuntimeError, match="use_gpu=True, but the driver has no GPU. Fix: .*"
                                           "use_gpu=False"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=True).run(print)
    with pytest.raises(FileNotFoundError, match="no Python file at 'nope.py' on the driver"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run("nope.py")
    with pytest.raises(TypeError, match="must be a function or the path of a Python file"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(42)


def test_the_drop_ins_check_their_gpus_when_made_and_keep_pysparks_input_params(monkeypatch):
    """As pyspark's: ``use_gpu=True`` without a GPU raises at construction (not at ``run``),
    ``input_params`` is there, and DeepSpeed's ``numGpus=True`` is one process."""
    from hvd_magics import DeepspeedTorchDistributor, TorchDistributor

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(RuntimeError, match=r"^use_gpu=True, but the driver has no GPU\. Fix: "):
        TorchDistributor(2, True, True)
    with pytest.raises(RuntimeError, match=r"^use_gpu=True, but spark\.task\.resource\.gpu\."
                                           "amount is unset"):
        TorchDistributor(2, False, True)
    with pytest.raises(RuntimeError, match=r"^useGpu=True, but the driver has no GPU"):
        DeepspeedTorchDistributor(numGpus=2)
    assert TorchDistributor(2, False, False).input_params == {
        "num_processes": 2, "local_mode": False, "use_gpu": False, "num_tasks": 2}
    one = DeepspeedTorchDistributor(numGpus=True, useGpu=False, localMode=False,
                                    deepspeedConfig={"train_batch_size": 2})
    assert one.num_processes == 1 and one.input_params == {
        "num_processes": 1, "local_mode": False, "use_gpu": False, "num_tasks": 1,
        "deepspeed_config": {"train_batch_size": 2}}
    with pytest.raises(ValueError, match="numGpus must be a positive whole number, got False"):
        DeepspeedTorchDistributor(numGpus=False, useGpu=False)


def test_the_stall_diagnosis_names_the_engine_whose_collective_a_rank_waits_in():
    from hvd_magics.job.readings.stacks import JobStacks

    def stacks(file):
        return {"threads": [{"main": True, "frames": [
            ["<%%horovod cell>", 3, "<module>", "dist.all_reduce(t)", "user"],
            [file, 10, "wait", "", "library"]]}]}

    torch_wait = stacks("/x/site-packages/torch/distributed/distributed_c10d.py")
    elsewhere = stacks("/x/site-packages/numpy/core/fromnumeric.py")
    assert JobStacks({0: torch_wait, 1: elsewhere}).diagnosis() == (
        "rank 0 waits in a torch.distributed collective for rank 1, which is elsewhere and "
        "never entered it")
    tf_wait = stacks("/x/site-packages/tensorflow/python/distribute/cross_device_ops.py")
    assert "in a tf.distribute collective" in JobStacks({0: tf_wait, 1: elsewhere}).diagnosis()
    hvd_wait = stacks("/x/site-packages/horovod/torch/mpi_ops.py")
    assert "in a Horovod collective" in JobStacks({0: hvd_wait, 1: elsewhere}).diagnosis()



def test_a_lightning_trainer_of_another_shape_than_the_jobs_is_named_with_the_fix(monkeypatch):
    from types import SimpleNamespace

    from hvd_magics.rank.integrations.lightning import fit_alone_message, lightning_message

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("HVD_MAGICS_SIZE", "8")
    class Trainer(SimpleNamespace):
        """Named as Lightning's is: the message names the class it refuses."""

    fits = Trainer(strategy=SimpleNamespace(num_processes=4, num_nodes=2))
    assert lightning_message(fits) is None
    # Trainer(devices=1) on a CPU, one process: a rank's own work (predicting on rank 0);
    # only its fit is refused, by fit_alone_message
    alone = Trainer(strategy=SimpleNamespace(), world_size=1)
    assert lightning_message(alone) is None
    assert fit_alone_message(alone).startswith(
        "Lightning's Trainer runs this rank as 1 process of its own while the job has 8 ranks")
    other = Trainer(strategy=SimpleNamespace(num_processes=2, num_nodes=1))
    assert lightning_message(other) == (
        "Lightning's Trainer(devices=2, num_nodes=1) plans 2 processes, 2 per node, and the job "
        "runs 8 ranks as 2 nodes of 4. Fix: leave devices and num_nodes out of Trainer(...) "
        "(they then take the job's shape), or write Trainer(devices=4, num_nodes=2, "
        "strategy='ddp').")
    spawned = Trainer(strategy=SimpleNamespace(_start_method="fork", num_processes=4,
                                               num_nodes=2))
    assert "starts its processes itself (fork)" in lightning_message(spawned)

def test_sixty_four_ranks_in_two_places_are_said_in_two_lines_and_two_stacks():
    """``%hvd_stacks`` at 64 ranks: the ranks at the same place are said once (``ranks 0-62``),
    as py-spy and NCCL's flight recorder group theirs; the odd one is named alone."""
    from hvd_magics.job.readings.stacks import JobStacks

    def stacks(host, code, file, line):
        return {"host": host, "threads": [{"main": True, "name": "MainThread", "frames": [
            ["<%%horovod cell>", line, "<module>", code, "user"],
            [file, 10, "wait", "", "library"]]}]}

    waiting = {rank: stacks(f"host{rank // 4}", "hvd.allreduce(loss)",
                            "/x/site-packages/horovod/torch/mpi_ops.py", 7) for rank in range(63)}
    loading = stacks("host15", "batch = next(loader)", "/x/site-packages/torch/utils/data.py", 5)
    jobs = JobStacks({**waiting, 63: loading}, missing=[], starting=[])
    lines = jobs.summary().splitlines()
    assert lines[0].startswith("  ranks 0-62: <%%horovod cell>:7 <module> (hvd.allreduce(loss))")
    assert lines[1].startswith("  rank 63: <%%horovod cell>:5 <module> (batch = next(loader))")
    assert lines[2] == ("  So: ranks 0-62 wait in a Horovod collective for rank 63, which is "
                        "elsewhere and never entered it.")
    text = str(jobs)
    assert text.count("hvd.allreduce(loss)") == 1 and text.count("next(loader)") == 1
    assert "ranks 0-62 (16 hosts: host0, host1, ...) have this stack:" in text
    assert "rank 63 (host15):" in text
    assert len(text.splitlines()) < 15
