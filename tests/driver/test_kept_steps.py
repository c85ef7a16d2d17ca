"""Every step kept in the host's memory (issue 84), on ranks on the driver: a rank SIGKILLed
without notice costs at most the step under way, and the job ends with the weights and the
optimizer's state of an unbroken run, bit for bit."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from hvd_magics.common.kept_steps import whole_steps
from tests import engine_jobs
from tests.full_disk import small_disk


@pytest.fixture
def keep_dir(tmp_path, monkeypatch):
    """A folder of kept steps of the test's own (its keepers end once their jobs succeeded, or
    30 s after a failed one: longer than a restart takes)."""
    monkeypatch.setenv("HVD_MAGICS_KEEP_DIR", str(tmp_path / "keep"))
    monkeypatch.setenv("HVD_MAGICS_KEEP_IDLE_S", "30")
    return tmp_path / "keep"


def _steps_taken(path_prefix, rank=0):
    with open(f"{path_prefix}-{rank}") as lines:
        return [tuple(map(int, line.split())) for line in lines]


def _redone(taken):
    """Steps the later attempt took that the first one had taken already."""
    first = {step for attempt, step in taken if attempt == 0}
    return sorted(step for attempt, step in taken if attempt == 1 and step in first)


def _job_folders(keep_dir):
    return [p for p in keep_dir.glob("*/*") if p.is_dir()] if keep_dir.is_dir() else []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _keepers_of(keep_dir):
    found = []
    for said in keep_dir.glob("*/keeper.json"):
        pid = json.loads(said.read_text())["pid"]
        if _alive(pid):
            found.append(pid)
    return found


def _gone(keep_dir, limit=30.0):
    """Wait until no keeper of ``keep_dir`` runs; whether none does."""
    deadline = time.monotonic() + limit
    while _keepers_of(keep_dir) and time.monotonic() < deadline:
        time.sleep(0.1)  # polls for the keepers' exit
    return not _keepers_of(keep_dir)


@pytest.mark.parametrize("engine", ["torch", "horovod"])
def test_a_killed_rank_costs_at_most_one_step_and_the_job_ends_bit_for_bit(
        engine, tmp_path, keep_dir, capfd):
    whole = HorovodRunner(np=-2, engine=engine, checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_kept, engine=engine)
    steps = tmp_path / "steps"
    resumed = HorovodRunner(np=-2, engine=engine, restarts=1,
                            checkpoint_dir=tmp_path / "lost").run(
        engine_jobs.steps_kept, engine=engine, kill_on=(12, [0]), steps_file=str(steps))
    assert resumed["weights"] == whole["weights"]  # bit for bit
    assert resumed["moment"] == whole["moment"]  # Adam's state came back with the weights
    assert resumed["attempt"] == 1 and resumed["start"] in (12, 13)
    assert len(_redone(_steps_taken(steps))) <= 1
    said = capfd.readouterr().err
    record = last_run()
    assert "kept in the memory of 1 host" in record.attempts[0]
    assert (f"which resumes from step {resumed['start'] - 1} kept in the memory of 1 host"
            in said)
    assert not (tmp_path / "lost").exists()  # no file was ever written: memory alone
    assert record.kept.split(" steps kept in memory")[0] in ("20", "21"), record.kept
    assert "kept steps" in str(record) and "(2 steps on each of 1 host)" in record.kept
    assert _job_folders(keep_dir) == []  # the job succeeded: its steps went with it
    assert _gone(keep_dir)  # and its keeper, once idle


def test_plain_state_dicts_resume_with_the_optimizers_state(tmp_path, keep_dir):
    whole = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_kept, plain=True)
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1,
                            checkpoint_dir=tmp_path / "lost").run(
        engine_jobs.steps_kept, plain=True, kill_on=(7, [0]))
    assert (resumed["weights"], resumed["moment"]) == (whole["weights"], whole["moment"])
    assert resumed["start"] in (7, 8)


def test_a_newer_file_wins_over_older_kept_steps_and_memory_over_an_older_file(
        tmp_path, keep_dir):
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path).run(
        engine_jobs.steps_kept, kill_on=(12, [0]), every=5)
    assert resumed["start"] in (12, 13)  # memory's step 11 or 12, not the file of step 9
    assert "kept in the memory" in last_run().attempts[0]


def test_kept_steps_gone_with_the_host_resume_the_job_from_its_files(tmp_path, keep_dir):
    whole = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_kept)
    resumed = HorovodRunner(np=-2, engine="torch", restarts=2,
                            checkpoint_dir=tmp_path / "lost").run(
        engine_jobs.steps_kept, kill_on=(12, [0]), every=5, wipe=True)
    assert resumed["weights"] == whole["weights"]
    assert (resumed["attempt"], resumed["start"]) == (2, 10)  # the file of step 9
    first, second, _ = last_run().attempts
    assert "kept in the memory" in first
    assert "KeptStepUnreachable: the step" in second and "checkpoint of step 9" in second


def test_a_killed_keeper_loses_no_step_and_a_new_one_serves(tmp_path, keep_dir):
    whole = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_kept)
    said = tmp_path / "keeper"
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1,
                            checkpoint_dir=tmp_path / "lost").run(
        engine_jobs.steps_kept, kill_on=(12, [0]), kill_keeper=str(said))
    killed = json.loads(said.read_text())
    assert killed is not None and not _alive(killed[0])
    assert resumed["weights"] == whole["weights"] and resumed["start"] in (12, 13)


def test_running_a_failed_job_again_resumes_from_its_kept_steps(tmp_path, keep_dir, capfd):
    runner = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path)
    with pytest.raises(HorovodJobError, match="rank 1") as info:
        runner.run(engine_jobs.steps_kept, kill_on=(9, [0]))
    assert "stays kept in the hosts' memory for 30 s (HVD_MAGICS_KEEP_IDLE_S): run the job " \
           "again to resume from it" in str(info.value)
    (folder,) = _job_folders(keep_dir)
    assert whole_steps(folder)[0] in (8, 9)
    capfd.readouterr()
    again = runner.run(engine_jobs.steps_kept, kill_on=(9, [0]))  # the same job, run again
    assert again["start"] in (9, 10)  # attempt 0 of the new run: no kill on the way
    assert f"the hosts' memory holds step {again['start'] - 1} of this job, kept by its last " \
           "run" in capfd.readouterr().err
    fresh = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path, fresh=True).run(
        engine_jobs.steps_kept)
    assert fresh["start"] == 0


def test_a_host_without_room_goes_on_with_files_and_says_so_once(tmp_path, keep_dir, capfd):
    with small_disk(keep_dir, "64k"):
        resumed = HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path).run(
            engine_jobs.steps_kept, kill_on=(12, [0]), every=5, width=4096)
    said = "".join(capfd.readouterr())
    assert said.count("has no room for a step") == 1  # the host's first rank, once
    assert resumed["start"] == 10  # the file of step 9
    assert "resumes from the checkpoint of step 9" in last_run().attempts[0]


def test_two_notebooks_jobs_keep_their_steps_apart(tmp_path, keep_dir):
    script = textwrap.dedent(f"""
        import json, sys
        from hvd_magics import HorovodRunner
        from tests import engine_jobs
        got = HorovodRunner(np=-2, engine="torch", restarts=1,
                            checkpoint_dir={str(tmp_path / 'shared')!r}).run(
            engine_jobs.steps_kept, kill_on=(int(sys.argv[1]), [0]), width=int(sys.argv[2]))
        print(json.dumps(got))
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    runs = [subprocess.Popen([sys.executable, "-c", script, str(kill), str(width)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for kill, width in ((6, 16), (11, 24))]
    results = [json.loads(run.communicate(timeout=300)[0].splitlines()[-1]) for run in runs]
    alone = [HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / f"alone{w}").run(
        engine_jobs.steps_kept, width=w) for w in (16, 24)]
    assert [r["weights"] for r in results] == [a["weights"] for a in alone]
    assert [r["start"] in (kill, kill + 1) for r, kill in zip(results, (6, 11))] == [True, True]
    assert _job_folders(keep_dir) == []


def test_a_lightning_trainer_keeps_its_steps_with_no_line_added(tmp_path, keep_dir):
    """--keep-steps: the Trainer's checkpoint of every step kept by the host's first rank; a
    rank killed mid-epoch costs at most one step, and the fit goes on as one resumed from
    Lightning's own checkpoint of that step does, bit for bit. (Not as an unbroken fit: a fit
    Lightning resumes mid-epoch from its own file differs from one never stopped.)"""
    attempt, first, last, weights = HorovodRunner(
        np=-2, engine="torch", restarts=1, keep_steps=True, checkpoint_dir=tmp_path / "c").run(
        engine_jobs.lightning_kept, folder=str(tmp_path), kill_at=17, save_at=17)
    assert "resumes from step 17 kept in the memory of 1 host" in last_run().attempts[0], \
        last_run().attempts
    taken = [tuple(map(int, line.split())) for line in open(tmp_path / "steps-0")]
    assert [step for _, step in taken] == list(range(1, 41)), taken  # none redone
    assert (attempt, first, last) == (1, 18, 40)
    (tmp_path / "own").mkdir()
    *_, own = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "o").run(
        engine_jobs.lightning_kept, folder=str(tmp_path / "own"),
        ckpt_path=str(tmp_path / "own.ckpt"))
    assert weights == own


def test_fsdp2_parts_kept_by_every_rank_resume_bit_for_bit(tmp_path, keep_dir):
    """Each rank keeps its own part of the sharded model and Adam's state; a rank killed right
    after keeping step 9 costs at most that step, and the full weights and moments end as an
    unbroken run's."""
    whole = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.fsdp_kept)
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1,
                            checkpoint_dir=tmp_path / "lost").run(engine_jobs.fsdp_kept, kill_at=9)
    assert (resumed["weights"], resumed["moments"]) == (whole["weights"], whole["moments"])
    assert resumed["start"] in (9, 10)
    record = last_run()
    assert "kept in the memory of 1 host" in record.attempts[0], record.attempts
    assert "2 parts of" in record.kept, record.kept


def test_a_keras_fit_keeps_its_steps_with_no_line_added(tmp_path, keep_dir):
    """--keep-steps under Horovod: a tf_keras fit's variables (a BatchNormalization's moving
    statistics too) and Adam's slots kept every batch; a rank killed mid-epoch costs at most
    one step, and the fit ends with an unbroken fit's weights, bit for bit."""
    (tmp_path / "whole").mkdir()
    whole, _ = HorovodRunner(np=-2, checkpoint_dir=tmp_path / "w").run(
        engine_jobs.keras_kept, folder=str(tmp_path / "whole"))
    weights, attempt = HorovodRunner(np=-2, restarts=1, keep_steps=True,
                                     checkpoint_dir=tmp_path / "c").run(
        engine_jobs.keras_kept, folder=str(tmp_path), kill_at=27)
    assert attempt == 1 and "kept in the memory of 1 host" in last_run().attempts[0], \
        last_run().attempts
    taken = [tuple(map(int, line.split())) for line in open(tmp_path / "steps-0")]
    before = {step for a, step in taken if a == 0}
    assert len([s for a, s in taken if a == 1 and s in before]) <= 1, taken
    assert sorted({s for _, s in taken}) == list(range(1, 81))
    assert weights == whole
