"""Which failures a restart can get past, and how a job's checkpoint folder is named."""
from pathlib import Path

from hvd_magics.causes import AttemptCause
from hvd_magics.errors import HorovodJobError, RankFailure
from hvd_magics.job.controller import JobController
from hvd_magics.job.failure_policy import FailurePolicy, loss
from hvd_magics.job.restarts import checkpoint_folder, job_name


class _Made:
    """An attempt whose making ran it whole (``launch(request)``: its record, or its error)."""

    def __init__(self, record):
        self.record = record

    def start(self):
        pass

    def turn(self):
        return True

    def succeeded(self):
        pass

    def end(self, failure):
        if failure is not None:
            raise failure
        return self.record


def _run(request, launch, restarts, folder, resume_fix=None):
    """The job's controller over attempts that ``launch`` runs whole as they are made."""
    return JobController(request, FailurePolicy(restarts), folder, fresh=False,
                         resume_fix=resume_fix,
                         attempts=lambda attempt: _Made(launch(attempt))).run()


def _error(*failures: RankFailure, summary: str = "2 of 2 ranks failed") -> HorovodJobError:
    return HorovodJobError(summary, list(failures))


def test_a_killed_rank_and_its_peers_collective_error_are_a_loss():
    killed = RankFailure(1, "h", -9)
    peer = RankFailure(0, "h", 1, "RuntimeError", "[../gloo/transport/tcp/pair.cc:534] "
                       "Connection closed by peer [127.0.0.1]:5000")
    assert loss(_error(killed, peer)) == \
        "rank 1 on h: killed by signal 9 without a Python exception"
    lost = RankFailure(1, "h", None, "RankLost", "its executor was lost or killed")
    assert loss(_error(lost)).startswith("rank 1 on h: RankLost")
    stage = "The Spark job failed: an executor was lost (exit 137)"
    assert loss(HorovodJobError(stage, cause=AttemptCause.LOST_EXECUTOR)) == stage
    # the policy reads the cause its maker gave, never the words: the same text is not a loss
    assert loss(_error(summary=stage)) is None


def test_a_ranks_own_error_is_not_a_loss_even_beside_a_dead_rank():
    own = RankFailure(0, "h", 1, "ValueError", "bad shard")
    assert loss(_error(own)) is None
    assert loss(_error(RankFailure(1, "h", -9), own)) is None  # its own error would come back
    peer_only = RankFailure(0, "h", 1, "RuntimeError", "Connection reset by peer")
    assert loss(_error(peer_only)) is None  # nobody died: not a loss seen here


def test_a_jobs_folder_is_its_names_and_other_arguments_make_another_job(tmp_path):
    source = "def train(lr):\n    ...\n"
    one, other = job_name(source, {"lr": 0.1}), job_name(source, {"lr": 0.2})
    assert checkpoint_folder(one, None) == checkpoint_folder(job_name(source, {"lr": 0.1}), None)
    assert checkpoint_folder(one, None) != checkpoint_folder(other, None)
    assert checkpoint_folder(None, None) != checkpoint_folder(None, None)  # unnamed: its own
    assert checkpoint_folder(one, str(tmp_path)) == tmp_path


def test_the_attempts_epoch_timing_reads_as_one_run():
    from hvd_magics.job.restarts import one_timing

    first = [{"epoch": 1, "wall_s": 1.0}, {"epoch": 2, "wall_s": 1.1}, {"epoch": 3, "wall_s": 9.0}]
    second = [{"epoch": 3, "wall_s": 1.2}, {"epoch": 4, "wall_s": 1.3}]
    assert [(r["epoch"], r["wall_s"]) for r in one_timing(first, second)] == \
        [(1, 1.0), (2, 1.1), (3, 1.2), (4, 1.3)]
    assert one_timing(first, []) == first  # an attempt lost before its first epoch's end
    assert one_timing([], second) == second



def test_a_loss_without_restarts_is_raised_as_it_is_and_used_up_restarts_keep_each_attempt(
        tmp_path):
    """Without restarts the error said 'The job was started 1 times, and each ended with a
    loss'; with restarts used up, ``last_run().attempts`` was ``[]``."""
    import pytest

    from hvd_magics.job.records.run_record import RunRecord
    from hvd_magics.job.launch_request import LaunchRequest
    from hvd_magics.options import JobOptions
    from hvd_magics.job.session import SESSION
    from hvd_magics.launch.payload import JobPayload

    def launch(request):  # as job_life.launch: the session's last run, carried on the error
        error = _error(RankFailure(1, "h", -9), summary="1 of 2 ranks failed")
        SESSION.last_run = error.record = RunRecord(job_id="j", np=2, where="driver",
                                                    log_path="")
        raise error

    request = LaunchRequest(JobPayload(b""), JobOptions(ranks=2, start_timeout=10.0), {}, [])
    with pytest.raises(HorovodJobError) as info:
        _run(request, launch, 0, tmp_path / "c")
    assert "started 1 times" not in str(info.value)
    with pytest.raises(HorovodJobError, match="The job was started 2 times, and each ended"):
        _run(request, launch, 1, tmp_path / "c")
    attempts = SESSION.last_run.attempts
    assert len(attempts) == 2 and all(a.startswith("rank 1 on h: killed by signal 9")
                                      for a in attempts), attempts
    assert not (tmp_path / "c").exists()  # no checkpoint was written: no folder is left


def test_an_interrupt_while_the_next_attempt_is_set_up_is_a_job_interrupted(tmp_path):
    """An interrupt during a restart ended with a bare KeyboardInterrupt (it came while the next
    attempt was being set up, outside the part of a launch that stops ranks)."""
    import pytest

    from hvd_magics.errors import JobInterrupted
    from hvd_magics.job.launch_request import LaunchRequest
    from hvd_magics.options import JobOptions
    from hvd_magics.launch.payload import JobPayload

    attempts = []

    def launch(request):
        attempts.append(request.attempt)
        if request.attempt == 0:
            raise _error(RankFailure(1, "h", -9), summary="1 of 2 ranks failed")
        raise KeyboardInterrupt  # as the cluster's slots are waited for

    with pytest.raises(JobInterrupted, match=r"^interrupted while attempt 2 of the job was being "
                                             r"set up, before any of its ranks started: nothing "
                                             r"is left running$"):
        _run(LaunchRequest(JobPayload(b""), JobOptions(ranks=2,
                                                                       start_timeout=10.0),
                                           {}, []), launch, 3, tmp_path / "c")
    assert attempts == [0, 1]


def test_preempted_attempts_start_again_without_counting_and_without_restarts_say_how_to_resume(
        tmp_path, capsys):
    import pytest

    from hvd_magics.job.records.run_record import RunRecord
    from hvd_magics.job.launch_request import LaunchRequest
    from hvd_magics.options import JobOptions
    from hvd_magics.launch.payload import JobPayload

    saved = "the checkpoint of step 45 was saved on a preemption notice (executor 1 ...)"

    def launch(request):
        if request.attempt < 2:  # two preemptions in a row, then the job ends
            raise _error(RankFailure(0, "h", 1, "Preempted", saved),
                         RankFailure(1, "h", 1, "Preempted", saved))
        return RunRecord(job_id="j", np=2, where="driver", log_path="")

    request = LaunchRequest(JobPayload(b""), JobOptions(ranks=2, start_timeout=10.0), {}, [])
    record = _run(request, launch, 1, tmp_path / "c")
    assert [a.split(" (ended")[0] for a in record.attempts] == [f"preempted: {saved}"] * 2 + [
        "succeeded"]  # restarts=1 and two preemptions: they do not count
    assert capsys.readouterr().err.count("ended on a preemption notice") == 2
    with pytest.raises(HorovodJobError, match=(
            r"^The job was preempted: the checkpoint of step 45 was saved on a preemption notice "
            r".*\. Run it again to resume from that checkpoint in .*c \(checkpoint.latest\(\) gives "
            r"it to the ranks\), or give --restarts N")):
        _run(request, launch, 0, tmp_path / "c")
    # the HorovodEstimator's way: fit again with its modelDir, or set restarts
    from hvd_magics.job.restarts import ResumeFix

    fix = ResumeFix("Fit again with modelDir='/m' to resume from it", "set restarts=N")
    with pytest.raises(HorovodJobError, match=(
            r"^The job was preempted: the checkpoint of step 45 .*\. Fit again with "
            r"modelDir='/m' to resume from it, or set restarts=N\.$")):
        _run(request, launch, 0, tmp_path / "c", resume_fix=fix)


def test_a_checkpoint_folder_that_is_a_file_or_unwritable_is_said_so_and_a_relative_one_is_the_notebooks(
        tmp_path, monkeypatch):
    """An existing file as --checkpoint-dir raised FileExistsError's traceback from
    job/restarts.py; a folder nobody may write in, PermissionError's."""
    import pytest

    from hvd_magics.errors import CheckpointFolderUnusable
    from hvd_magics.job.restarts import attempt_checkpoints

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointFolderUnusable, match="is a file. Fix: name a folder"):
        with attempt_checkpoints(checkpoint_folder(None, str(tmp_path / "a-file"))):
            pass
    with pytest.raises(CheckpointFolderUnusable, match="not writable from the notebook"):
        with attempt_checkpoints(Path("/proc/hvd_magics-no-such/checkpoints")):
            pass
    monkeypatch.chdir(tmp_path)
    assert checkpoint_folder(None, "ckpt") == tmp_path / "ckpt"


def test_a_restart_that_finds_no_slots_names_the_checkpoint_to_resume_from(tmp_path):
    """A restart with no replacement executor waited in silence, then NotEnoughSlotsError,
    ``attempts == []``, and neither the error nor the record named the checkpoint (step 26)."""
    import pytest

    from hvd_magics.errors import NotEnoughSlotsError
    from hvd_magics.job.records.run_record import RunRecord
    from hvd_magics.job.launch_request import LaunchRequest
    from hvd_magics.options import JobOptions
    from hvd_magics.job.session import SESSION
    from hvd_magics.launch.payload import JobPayload
    from hvd_magics.common.checkpoints import Position, write_checkpoint

    folder = tmp_path / "c"
    tries = []

    def launch(request):
        tries.append(request.attempt)
        if request.attempt == 0:
            write_checkpoint(folder, Position(0, 0, 26), "pkl",
                             lambda path: path.write_bytes(b"x"), 2)
            error = _error(RankFailure(1, "h", -9), summary="1 of 2 ranks failed")
            SESSION.last_run = error.record = RunRecord(job_id="j", np=2, where="driver",
                                                        log_path="")
            raise error
        raise NotEnoughSlotsError("np=2 needs 2 free Spark task slots at once, but 1 free of 1.")

    request = LaunchRequest(JobPayload(b""), JobOptions(ranks=2, start_timeout=10.0), {}, [])
    with pytest.raises(NotEnoughSlotsError, match=r"(?s)1 free of 1\..*The job's checkpoint of "
                       r"step 26 in .* stays: Run it again to resume from that checkpoint"):
        _run(request, launch, 2, folder)
    assert tries == [0, 1]
    assert SESSION.last_run.attempts[0].startswith("rank 1 on h: killed by signal 9")
    assert SESSION.last_run.attempts[1].startswith("not started: np=2 needs 2 free")


def test_an_attempts_facts_reach_the_rank_as_it_reads_them(tmp_path):
    """The driver sets the attempt's four variables in one place and the rank's typed spec
    reads each back (a name spelled differently on one side fails here)."""
    from hvd_magics.common.checkpoints import Position, write_checkpoint
    from hvd_magics.job.restarts import attempt_checkpoints
    from hvd_magics.rank.rank_job import RankJob

    folder = tmp_path / "c"
    with attempt_checkpoints(folder, 2) as facts:
        job = RankJob.read(facts.rank_env())
        assert (job.attempt, job.checkpoint_dir, job.resume_step) == (2, folder, "none")
        assert job.checkpoint_token and (folder / job.checkpoint_token).exists()
    write_checkpoint(folder, Position(0, 0, 26), "pkl", lambda path: path.write_bytes(b"x"), 2)
    with attempt_checkpoints(folder, 3) as facts:
        assert RankJob.read(facts.rank_env()).resume_step == "26"
