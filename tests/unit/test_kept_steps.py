"""Steps kept in a host's memory (issue 84; hvd_magics.common.kept_steps, rank.api.keeping): what
is whole, the two buffers, a copy killed half way, the state loaded back bit for bit, what keep
refuses, and a host without room."""
import os
import subprocess
import sys
import textwrap

import pytest

from hvd_magics.common.kept_steps import PartName, whole_steps
from hvd_magics.job.readings.kept_steps import KeptSteps
from tests.full_disk import small_disk


@pytest.fixture
def keep_dir(tmp_path, monkeypatch):
    """A folder of kept steps of the test's own, its keeper ending soon after the test."""
    monkeypatch.setenv("HVD_MAGICS_KEEP_DIR", str(tmp_path / "keep"))
    monkeypatch.setenv("HVD_MAGICS_KEEP_IDLE_S", "30")
    monkeypatch.setenv("HVD_MAGICS_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("HVD_MAGICS_RANK_HOST", "host-a")
    from hvd_magics.rank.api import keeping
    monkeypatch.setattr(keeping, "_keeper", keeping._Keeper())
    return tmp_path / "keep"


def _job_folder(keep_dir):
    (folder,) = [p for p in (keep_dir / "host-a").iterdir() if p.is_dir()]
    return folder


def _model_and_adam(seed=0):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _step(model, optimizer, step):
    import torch
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(step))
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def test_a_step_is_whole_once_every_part_of_it_is_in_place(tmp_path):
    for name in (PartName(4, 0, 2), PartName(4, 1, 2), PartName(5, 0, 2), PartName(3)):
        (tmp_path / name.file).write_bytes(b"x")
    (tmp_path / f".{PartName(5, 1, 2).file}.tmp-123").write_bytes(b"x")  # a copy under way
    assert whole_steps(tmp_path) == [4, 3]


def test_the_model_and_optimizer_come_back_bit_for_bit_with_plain_values(keep_dir):
    import numpy as np
    import torch

    from hvd_magics import checkpoint
    model, optimizer = _model_and_adam()
    state = {"model": model, "optimizer": optimizer, "epoch": 2, "ids": np.arange(4),
             "rng": torch.get_rng_state()}
    for step in range(4):
        _step(model, optimizer, step)
        checkpoint.keep(state, step)
    _step(model, optimizer, 4)  # waits for the last copy before it changes the weights
    wanted = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint.keep(state, 4)
    again, adam = _model_and_adam(seed=1)
    found = checkpoint.latest({"model": again, "optimizer": adam, "epoch": 0, "ids": None,
                               "rng": None})
    assert found is not None and found[1] == 4
    assert all(torch.equal(wanted[k], v) for k, v in again.state_dict().items())
    first, second = optimizer.state_dict()["state"], adam.state_dict()["state"]
    assert all(torch.equal(first[i]["exp_avg_sq"], second[i]["exp_avg_sq"]) for i in first)
    assert found[0]["epoch"] == 2 and found[0]["ids"].tolist() == [0, 1, 2, 3]
    assert torch.equal(found[0]["rng"], state["rng"])
    plain = checkpoint.latest()[0]  # without a state: the state dicts
    assert set(plain["model"]) == set(wanted) and "param_groups" in plain["optimizer"]


def test_a_part_keeps_two_steps_and_the_third_reuses_the_oldest_ones_pages(keep_dir):
    from hvd_magics import checkpoint
    from hvd_magics.rank.api.keeping import wait
    model, optimizer = _model_and_adam()
    state = {"model": model, "optimizer": optimizer}
    inodes = []
    for step in range(3):
        _step(model, optimizer, step)
        checkpoint.keep(state, step)
        wait()
        folder = _job_folder(keep_dir)
        inodes.append(os.stat(folder / PartName(step).file).st_ino)
    assert whole_steps(folder) == [2, 1]
    assert inodes[2] == inodes[0]  # step 0's buffer became step 2's


def test_a_copy_killed_half_way_leaves_the_step_before_it_whole(keep_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    script = textwrap.dedent("""
        import os, signal, torch
        from hvd_magics import checkpoint
        from hvd_magics.rank.api import state_tree
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        checkpoint.keep({"model": model, "optimizer": optimizer}, 7)
        checkpoint.keep({"model": model, "optimizer": optimizer}, 7)  # waits: step 7 whole
        copy = state_tree.copy_leaf
        def killed(buffer, leaf):  # the rank is killed in the middle of step 8's copy
            copy(buffer, leaf)
            os.kill(os.getpid(), signal.SIGKILL)
        state_tree.copy_leaf = killed
        import hvd_magics.rank.api.keeping as keeping
        keeping.copy_leaf = killed
        checkpoint.keep({"model": model, "optimizer": optimizer}, 8)
        checkpoint.keep({"model": model, "optimizer": optimizer}, 9)
    """)
    ended = subprocess.run([sys.executable, "-c", script], env=env, timeout=120)
    assert ended.returncode == -9
    folder = _job_folder(keep_dir)
    assert whole_steps(folder) == [7]
    assert [p.name for p in folder.iterdir() if ".tmp-" in p.name]  # step 8's copy, torn
    from hvd_magics import checkpoint
    assert checkpoint.latest()[1] == 7


def test_what_pickle_refuses_is_refused_with_the_fix(keep_dir):
    from hvd_magics import checkpoint
    from hvd_magics.errors import KeepRefused
    with pytest.raises(KeepRefused, match=r"cannot copy the state of step 3.*Fix: keep tensors"):
        checkpoint.keep({"loss": lambda x: x}, 3)


def test_a_host_without_room_says_so_once_and_the_loop_goes_on(keep_dir, tmp_path, capfd):
    import torch

    from hvd_magics import checkpoint
    with small_disk(keep_dir, "256k"):
        state = {"weights": torch.zeros(100_000)}  # 400 kB
        for step in range(3):
            checkpoint.keep(state, step)
        said = capfd.readouterr().err
    assert said.count("has no room for a step") == 1
    assert "a restart resumes from the newest checkpoint file" in said and "Fix:" in said


def test_the_driver_resumes_from_the_newest_step_every_host_holds():
    kept = KeptSteps()

    def event(host, step):
        return {"kind": "kept", "step": step, "part": 0, "parts": 1, "holder": host,
                "keeper": f"{host}:1", "nbytes": 10, "copy_s": 0.0, "stall_s": 0.0,
                "peer": False}
    for step in range(5):
        kept.observe(event("a", step))
    for step in range(4):  # host b was a step behind when the job was lost
        kept.observe(event("b", step))
    assert kept.hosts["a"].steps == [3, 4] and kept.hosts["b"].steps == [2, 3]
    assert kept.resume_step() == 3 and kept.newest() == 4
    assert kept.peers(3) == "a=a:1,b=b:1" and kept.peers(4) == "a=a:1"
    assert kept.memory_bytes() == 40


def test_state_dicts_saved_to_a_file_are_loaded_into_the_state_given(keep_dir):
    """The state given to latest() held the model and optimizer; the file, their state dicts:
    they were returned as saved and the model silently trained on from its first weights."""
    import torch

    from hvd_magics import checkpoint
    model, optimizer = _model_and_adam()
    _step(model, optimizer, 0)
    checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": 4}, 0)
    again, adam = _model_and_adam(seed=1)
    state, step = checkpoint.latest({"model": again, "optimizer": adam, "epoch": 0})
    assert step == 0 and state["model"] is again and state["epoch"] == 4
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))
    assert adam.state_dict()["state"][0]["exp_avg"].abs().sum() > 0


def test_a_sharded_step_is_whole_once_every_part_is_on_a_host_not_lost():
    kept = KeptSteps()

    def event(host, step, part, peer=False):
        kept.observe({"kind": "kept", "step": step, "part": part, "parts": 2, "holder": host,
                      "keeper": f"{host}:1", "nbytes": 10, "copy_s": 0.0, "stall_s": 0.0,
                      "peer": peer})
    for step in range(6):  # rank 0 on host a, rank 1 on b; each part copied to the other
        event("a", step, 0)
        event("b", step, 1)
        event("b", step, 0, peer=True)
        if step < 4:  # b's link is slow: its part's copies on a lag two steps
            event("a", step, 1, peer=True)
    assert kept.resume_step() == 5 and kept.peer_lag() == 2
    kept.lost("b")  # a holds part 0 of steps 4-5 and part 1 of steps 2-3: none whole
    assert kept.resume_step() is None
    assert kept.hosts["a"].held == {2: {1}, 3: {1}, 4: {0}, 5: {0}}
