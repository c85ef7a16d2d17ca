"""Checkpoints stay whole when a save fails; the plan of a resumed fit."""
from __future__ import annotations

import json

import pytest

from hvd_magics.common.checkpoints import (Position, checkpoint_folder, epoch_plan,
                                           latest_checkpoint, partial_folder, publish_folder,
                                           write_checkpoint)


def _writer(text: str):
    return lambda path: path.write_text(text)


def test_a_save_that_fails_leaves_the_last_checkpoint_whole(tmp_path):
    first = write_checkpoint(tmp_path, Position(1, 0, 10), "pkl", _writer("one"))

    def broken(path):
        path.write_text("half of a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_checkpoint(tmp_path, Position(2, 0, 20), "pkl", broken)
    assert latest_checkpoint(tmp_path) == (Position(1, 0, 10), first)
    assert sorted(p.name for p in checkpoint_folder(tmp_path).iterdir()) == [
        "ckpt-10-e1-s0.pkl", "latest.json"]  # no temporary file left behind


def test_the_newest_complete_checkpoint_is_found_when_latest_json_is_behind(tmp_path):
    write_checkpoint(tmp_path, Position(1, 0, 10), "pt", _writer("one"))
    second = write_checkpoint(tmp_path, Position(1, 4, 14), "pt", _writer("two"))
    (checkpoint_folder(tmp_path) / "latest.json").write_text(
        json.dumps({"file": "ckpt-99-e9-s0.pt", "epoch": 9, "step": 0, "global_step": 99}))
    assert latest_checkpoint(tmp_path) == (Position(1, 4, 14), second)
    assert latest_checkpoint(tmp_path / "nothing") is None and latest_checkpoint(None) is None


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in range(1, 6):
        write_checkpoint(tmp_path, Position(step, 0, step * 10), "pt", _writer(str(step)), keep=2)
    assert sorted(p.name for p in checkpoint_folder(tmp_path).glob("ckpt-*")) == [
        "ckpt-40-e4-s0.pt", "ckpt-50-e5-s0.pt"]


def test_a_sharded_checkpoint_counts_only_once_every_rank_wrote_it(tmp_path):
    """The ranks write a sharded checkpoint into a partial folder that no reader takes for a
    checkpoint; renamed into place, it is the newest; an older attempt's partial one goes."""
    write_checkpoint(tmp_path, Position(0, 0, 5), "pkl", _writer("five"))
    left = partial_folder(tmp_path, Position(0, 0, 9), "a0")  # an attempt killed mid-save
    (left / "__0_0.distcp").write_text("part")
    partial = partial_folder(tmp_path, Position(0, 0, 10), "a1")
    (partial / "__0_0.distcp").write_text("part")
    assert latest_checkpoint(tmp_path)[0] == Position(0, 0, 5)  # partial: not a checkpoint
    path = publish_folder(tmp_path, partial, Position(0, 0, 10), "a1", keep=1)
    assert latest_checkpoint(tmp_path) == (Position(0, 0, 10), path) and path.is_dir()
    assert sorted(p.name for p in checkpoint_folder(tmp_path).iterdir()) == [
        "ckpt-10-e0-s0.dcp", "latest.json"]  # the older one pruned, the partial ones gone
    again = partial_folder(tmp_path, Position(0, 0, 10), "a2")  # the same step saved again
    (again / "__0_0.distcp").write_text("new")
    publish_folder(tmp_path, again, Position(0, 0, 10), "a2")
    assert (path / "__0_0.distcp").read_text() == "new"


@pytest.mark.parametrize("position, epochs, max_steps, plan", [
    (Position(), 3, None, [(0, 0, 10), (1, 0, 10), (2, 0, 10)]),
    (Position(2, 0, 20), 4, None, [(2, 0, 10), (3, 0, 10)]),  # resume at an epoch's start
    (Position(1, 4, 14), 3, None, [(1, 4, 6), (2, 0, 10)]),  # inside an epoch
    (Position(), 4, 25, [(0, 0, 10), (1, 0, 10), (2, 0, 5)]),  # maxSteps ends it first
    (Position(4, 0, 40), 4, None, []),  # nothing left
    (Position(1, 0, 25), 4, 25, []),
])
def test_the_plan_of_a_fit(position, epochs, max_steps, plan):
    assert epoch_plan(position, 10, epochs, max_steps) == plan


def test_a_rank_killed_while_it_saves_leaves_the_last_checkpoint_whole(tmp_path, monkeypatch):
    """hvd_magics.checkpoint.save in a process SIGKILLed in the middle of writing a large
    state: latest() still gives the step before, whole."""
    import subprocess
    import sys

    script = (
        "import os, signal, threading, sys\n"
        "from hvd_magics import checkpoint\n"
        "checkpoint.save({'step': 5, 'data': b'x' * 1000}, 5)\n"
        "class Slow:\n"
        "    def __reduce__(self):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)  # halfway through pickling the state\n"
        "checkpoint.save({'step': 10, 'data': b'y' * 10_000_000, 'slow': Slow()}, 10)\n")
    from hvd_magics.protocol import ENV_CHECKPOINT_DIR, ENV_RANK
    from hvd_magics.rank.api import checkpoint

    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_RANK, "0")
    assert subprocess.run([sys.executable, "-c", script]).returncode == -9
    state, step = checkpoint.latest()
    assert (step, state["step"], state["data"]) == (5, 5, b"x" * 1000)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()
            if p.name.startswith("ckpt-")] == ["ckpt-5-e0-s0.pkl"]
    # its half-written file (58.7 MB of a real state) stayed for ever; the next save removes it
    left = [p.name for p in (tmp_path / "checkpoints").iterdir() if ".tmp-" in p.name]
    assert len(left) == 1 and left[0].startswith(".ckpt-10-e0-s0.pkl.tmp-"), left
    checkpoint.save({"step": 15}, 15)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "ckpt-15-e0-s0.pkl", "ckpt-5-e0-s0.pkl", "latest.json"]


def test_a_rank_that_does_not_see_the_drivers_folder_is_refused_before_it_trains(
        tmp_path, monkeypatch):
    """Executors with folders of their own (the default one on several hosts): rank 1 resumed
    from none while rank 0 resumed from step 15, and the job hung."""
    from hvd_magics import checkpoint
    from hvd_magics.errors import CheckpointFolderNotShared

    monkeypatch.setattr(checkpoint, "_seen", set())
    monkeypatch.setenv("HVD_MAGICS_CHECKPOINT_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("HVD_MAGICS_CHECKPOINT_TOKEN", ".hvd_magics-attempt-abc")
    monkeypatch.setenv("HVD_MAGICS_RESUME_STEP", "none")
    monkeypatch.setenv("HVD_MAGICS_RANK", "1")
    for call in (checkpoint.latest, lambda: checkpoint.save({}, 5)):
        with pytest.raises(CheckpointFolderNotShared, match=r"^rank 1 on .* does not see the "
                           r"job's checkpoint folder .*job as the notebook's machine does.*Fix: "
                           r"a folder that every executor and the driver share: %%horovod "
                           r"--checkpoint-dir"):
            call()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / ".hvd_magics-attempt-abc").write_text("")
    assert checkpoint.latest() is None and checkpoint.save({}, 5) is None  # rank 1 writes none


def test_saves_keep_the_checkpoint_the_attempt_resumes_from(tmp_path):
    for step in (10, 100, 101, 102):
        write_checkpoint(tmp_path, Position(0, 0, step), "pkl", _writer(str(step)), keep=2,
                         spare=10)
    names = sorted(p.name for p in checkpoint_folder(tmp_path).glob("ckpt-*"))
    assert names == ["ckpt-10-e0-s0.pkl", "ckpt-101-e0-s0.pkl", "ckpt-102-e0-s0.pkl"]
