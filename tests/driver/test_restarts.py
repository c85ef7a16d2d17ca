"""A job that loses a rank starts again and resumes from its last checkpoint (issue 40), on
ranks on the driver: rank 1 SIGKILLs itself mid-training, as a lost executor would take it."""
from datetime import datetime

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, JobInterrupted, last_run
from tests import engine_jobs
from tests.conftest import interrupt_once_marked, rank_processes_alive


def test_a_lost_rank_restarts_the_job_which_resumes_to_the_same_weights(tmp_path, capfd):
    whole = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.steps_with_checkpoints)
    runner = HorovodRunner(np=-2, engine="torch", restarts=2, checkpoint_dir=tmp_path / "lost")
    began = datetime.now()
    resumed = runner.run(engine_jobs.steps_with_checkpoints, kill_on=(12, [0]))
    said = capfd.readouterr().err
    assert resumed["weights"] == whole["weights"]  # bit for bit
    assert (resumed["attempt"], resumed["start"]) == (1, 10)  # from the checkpoint of step 10
    record = last_run()
    assert record.status == "succeeded" and len(record.attempts) == 2
    assert (record.started_at - began).total_seconds() < 1  # the record times both attempts
    assert "rank 1" in record.attempts[0] and "signal 9" in record.attempts[0]
    assert "attempt 1 of 3 ended: rank 1" in said and "starting attempt 2" in said
    # when it ended and where the next attempt resumed: the steps done twice are the rest
    assert "attempt 2 resumes from the checkpoint of step 10)" in record.attempts[0]
    assert "starting attempt 2, which resumes from the checkpoint of step 10 in" in said


def test_an_interrupt_during_a_later_attempt_stops_the_job_at_once(tmp_path, capfd):
    marks = tmp_path / "marks"
    marks.mkdir()
    interrupt_once_marked(marks)  # both ranks of attempt 2 resumed and wait
    runner = HorovodRunner(np=-2, engine="torch", restarts=3, checkpoint_dir=tmp_path / "c")
    with pytest.raises(JobInterrupted, match="nothing is left running"):
        runner.run(engine_jobs.steps_with_checkpoints, kill_on=(12, [0]), hold_on=(1, str(marks)))
    record = last_run()
    assert record.status == "interrupted"
    assert rank_processes_alive(record.pids.values()) == []
    said = capfd.readouterr().err
    assert "starting attempt 2" in said and "starting attempt 3" not in said  # not retried


def test_a_ranks_own_error_is_not_retried(tmp_path, capfd):
    runner = HorovodRunner(np=-2, engine="torch", restarts=2, checkpoint_dir=tmp_path)
    with pytest.raises(HorovodJobError) as info:
        runner.run(engine_jobs.steps_with_checkpoints, bad_rank=1)
    assert "ValueError: bad shard on rank 1" in str(info.value)
    assert "starting attempt" not in capfd.readouterr().err


def test_restarts_used_up_end_the_job_with_every_attempts_cause(tmp_path):
    runner = HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path)
    with pytest.raises(HorovodJobError) as info:
        runner.run(engine_jobs.steps_with_checkpoints, kill_on=(3, [0, 1]))
    text = str(info.value)
    assert "The job was started 2 times, and each ended with a loss" in text
    assert "attempt 1: rank 1" in text and "attempt 2: rank 1" in text


def test_the_same_job_run_again_finds_its_checkpoint_and_fresh_starts_over(tmp_path, capfd):
    runner = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path)
    assert runner.run(engine_jobs.steps_with_checkpoints, steps=10)["start"] == 0
    assert last_run().attempts == [] and "attempt" not in str(last_run())  # it ran once
    capfd.readouterr()
    again = runner.run(engine_jobs.steps_with_checkpoints, steps=15)  # as after a restart
    assert again["start"] == 10
    assert f"the job's checkpoints in {tmp_path} hold step 10" in capfd.readouterr().err
    fresh = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path, fresh=True)
    assert fresh.run(engine_jobs.steps_with_checkpoints, steps=5)["start"] == 0


def test_every_rank_resumes_from_the_same_checkpoint_though_rank_0_saves_newer_ones(tmp_path):
    """Rank 1 reads ``checkpoint.latest()`` after rank 0 has saved three newer checkpoints (a
    peer that starts late): it read a newer one than rank 0's, or none once rank 0's saves had
    removed it; both now resume from the step the attempt started with."""
    runner = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path)
    assert runner.run(engine_jobs.steps_with_checkpoints, steps=10)["start"] == 0
    assert runner.run(engine_jobs.resume_points) == [10, 10]
    assert runner.run(engine_jobs.resume_points) == [102, 102]  # the next run: the newest
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # marks gone


def test_restarts_with_an_elastic_np_or_a_bad_count_are_refused():
    with pytest.raises(ValueError, match="an elastic job already goes on when ranks are lost"):
        HorovodRunner(np="1:2", restarts=1)
    with pytest.raises(ValueError, match="must be a whole number >= 0"):
        HorovodRunner(np=2, restarts=-1)


def test_the_magic_restarts_a_cell_that_lost_a_rank(ip, tmp_path, capfd):
    cell = ("import os, signal\nfrom hvd_magics import checkpoint\n"
            "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "found = checkpoint.latest()\nstart = found[1] if found else 0\n"
            "checkpoint.save({'done': 3}, 3)\n"
            "dist.barrier()  # rank 0 has written it\n"
            "if dist.get_rank() == 1 and checkpoint.attempt() == 0:\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "dist.barrier()\n(checkpoint.attempt(), start)\n")
    line = f"np=-2 --engine torch --restarts 1 --checkpoint-dir {tmp_path} -q"
    assert ip.run_cell_magic("horovod", line, cell) == (1, 3)
    said = capfd.readouterr().err
    assert "attempt 1 of 2 ended: rank 1" in said and "killed by signal 9" in said
    assert "attempt 1" in str(last_run()) and "attempt 2" in str(last_run())


def test_a_keras_fit_under_tf_distribute_resumes_with_backup_and_restore(tmp_path):
    runner = HorovodRunner(np=-2, engine="tf", restarts=1, checkpoint_dir=tmp_path)
    resumed = runner.run(engine_jobs.tf_fit_with_backup, kill_after_epoch=3)
    assert resumed["attempt"] == 1 and resumed["ran"] == [4, 5, 6], resumed
    # the epoch timing reads as one run: epochs 1-3 of the first attempt, 4-6 of the second
    assert [row["epoch"] for row in last_run().epochs] == [1, 2, 3, 4, 5, 6]
    whole = HorovodRunner(np=-2, engine="tf", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.tf_fit_with_backup)
    assert whole["ran"] == [1, 2, 3, 4, 5, 6]
    assert abs(resumed["weights"] - whole["weights"]) < 1e-4, (resumed, whole)


def test_a_keras_fit_under_tf_distribute_saves_on_the_notice_by_itself_on_every_worker(tmp_path):
    """Every worker takes part in the save (rank 0 writing alone waited forever in the read of
    the BatchNormalization's statistics, a collective); the next attempt resumes at the batch
    after the one saved. The order is handed to the workers as their supervisor does (driver
    ranks have no executor to decommission; tests/spark_cluster/test_preemption.py has Spark's
    notice reaching them)."""
    import numpy as np

    attempt, ran, weights = HorovodRunner(np=-2, engine="tf", restarts=1,
                                          checkpoint_dir=tmp_path).run(engine_jobs.keras_mwms_spot)
    saved = last_run().attempts[0]
    assert saved.startswith("preempted: the checkpoint of step 14 was saved"), saved
    assert attempt == 1 and ran == list(range(15, 49)), (attempt, ran)
    assert (tmp_path / "keras_on_notice" / "step-14" / "position.json").is_file()
    _, _, whole = HorovodRunner(np=-2, engine="tf", checkpoint_dir=tmp_path / "whole").run(
        engine_jobs.keras_mwms_spot, order_at=0)
    moving = {4, 5}  # the BatchNormalization's moving mean and variance
    for index, (a, b) in enumerate(zip(weights, whole, strict=True)):
        if index in moving:  # saved as the workers' mean, as TensorFlow saves such variables
            assert np.allclose(a, b, rtol=0, atol=1e-6), index
        else:
            assert a == b, index  # bit for bit


def test_a_hugging_face_trainer_saves_on_the_notice_by_itself_and_resumes_where_it_saved(
        tmp_path, capfd):
    """The Trainer's code says nothing of preemption: its own checkpoint is saved at the
    notice's step (between its every-20-steps saves) and the next attempt's train() resumes
    from it. (Moved from the standalone cluster's tier, where Spark's notice reached it: the
    Trainers and the Keras fit below save on the notice on the rank's side, wherever it came
    from, and tests/spark_cluster/test_preemption.py keeps Spark's notice for DDP, Horovod's
    loops and the estimator.)"""
    attempt, first, last = HorovodRunner(np=-2, engine="torch", restarts=1).run(
        engine_jobs.hf_trainer_spot, out=str(tmp_path / "out"), folder=str(tmp_path))
    record = last_run()
    assert record.attempts[0].startswith("preempted: the checkpoint of step "), record.attempts
    ran = {rank: [tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    for rank, steps in ran.items():  # steps 1..60 once each, across both attempts
        assert [step for _, step in steps] == list(range(1, 61)), (rank, steps)
    saved = max(step for attempt_, step in ran[0] if attempt_ == 0)
    assert saved % 20 != 0 or saved == 20, saved  # its own save, not only a periodic one
    assert (attempt, first, last) == (1, saved + 1, 60)
    assert (tmp_path / "out" / f"checkpoint-{saved}").is_dir()
    told = capfd.readouterr().err
    assert f"which resumes from the checkpoint of step {saved} (where the job's code saved it)" \
        in told, told


def test_a_lightning_trainer_saves_on_the_notice_by_itself_and_resumes_where_it_saved(
        tmp_path):
    attempt, first, last = HorovodRunner(
        np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path / "spot").run(
        engine_jobs.lightning_spot, folder=str(tmp_path), steps=80)
    assert last_run().attempts[0].startswith("preempted: the checkpoint of step ")
    ran = {rank: [tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    for rank, steps in ran.items():  # global steps 1..80 once each, across both attempts
        assert [step for _, step in steps] == list(range(1, 81)), (rank, steps)
    saved = max(step for attempt_, step in ran[0] if attempt_ == 0)
    assert (attempt, first, last) == (1, saved + 1, 80)
    assert (tmp_path / "spot" / "lightning" / f"step-{saved}.ckpt").is_file()


def test_a_keras_fit_saves_on_the_notice_by_itself_and_ends_with_the_same_weights_bit_for_bit(
        tmp_path):
    """A Horovod Keras ``fit`` that says nothing of preemption: rank 0 saves the model and
    Adam's state at the notice's batch, the next attempt's ``fit`` resumes at the next batch of
    that epoch with its input advanced past the batches done, and the weights are those of an
    uninterrupted run, bit for bit."""
    weights, attempt = HorovodRunner(np=-2, restarts=1, checkpoint_dir=tmp_path / "spot").run(
        engine_jobs.keras_spot, folder=str(tmp_path))
    assert last_run().attempts[0].startswith("preempted: the checkpoint of step "), \
        last_run().attempts
    ran = {rank: [tuple(map(int, line.split())) for line in
                  (tmp_path / f"steps-{rank}").read_text().splitlines()] for rank in (0, 1)}
    for rank, steps in ran.items():  # global steps 1..80 once each, across both attempts
        assert [step for _, step in steps] == list(range(1, 81)), (rank, steps)
    saved = max(step for attempt_, step in ran[0] if attempt_ == 0)
    assert attempt == 1 and 10 < saved < 80, (attempt, saved)
    assert (tmp_path / "spot" / "keras_on_notice" / f"step-{saved}" / "position.json").is_file()
    whole, _ = HorovodRunner(np=-2, checkpoint_dir=tmp_path / "whole").run(engine_jobs.keras_spot)
    assert weights == whole  # bit for bit


def test_rank_0_s_long_save_on_the_notice_is_waited_for_and_the_next_attempt_resumes_from_it(
        tmp_path):
    """The other ranks end as soon as their part of the save is done; rank 0 then writes for
    3 s. The job was stopped 1 s after they ended (their Preempted taken for a failure): rank
    0's checkpoint was lost, and the error blamed rank 1, which had done what it should."""
    attempt, start = HorovodRunner(np=-2, engine="torch", restarts=1,
                                   checkpoint_dir=tmp_path).run(engine_jobs.ddp_slow_save_on_notice,
                                                                save_s=3.0)
    assert (attempt, start) == (1, 8)
    assert last_run().attempts[0].startswith("preempted: the checkpoint of step 8 was saved")


def test_a_save_on_the_notice_past_its_limit_names_the_rank_that_still_saves(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("HVD_MAGICS_NOTICE_SAVE_WAIT_S", "1")
    with pytest.raises(HorovodJobError) as failed:
        HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path).run(
            engine_jobs.ddp_slow_save_on_notice, save_s=30.0)
    first = str(failed.value).splitlines()[0]
    assert first.startswith("rank 0 waits in its save for more than 1 s after the preemption "
                            "notice, while rank 1 ended on it"), first
    assert "__reduce__" in first and "HVD_MAGICS_NOTICE_SAVE_WAIT_S=SECONDS" in first, first


def test_a_job_preempted_without_restarts_says_how_to_resume_and_is_not_a_failure(tmp_path):
    with pytest.raises(HorovodJobError) as preempted:
        HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path).run(
            engine_jobs.ddp_slow_save_on_notice, save_s=0.1)
    first = str(preempted.value).splitlines()[0]
    assert first.startswith("The job was preempted: the checkpoint of step 8 was saved on a "
                            "preemption notice (executor 1 is going). Run it again to resume "
                            f"from that checkpoint in {tmp_path}"), first
    assert last_run().status == "preempted"  # the ranks ended on purpose (it said "failed")
    # and its error says the same (it said "2 of 2 ranks failed")
    assert last_run().error.startswith("preempted: the checkpoint of step 8 was saved"), \
        last_run().error
    assert "ranks failed" not in last_run().error
