"""Synthetic events through the driver's job state and epoch timer (no ranks, no Spark)."""
from hvd_magics.job.records.epoch_timing import EpochTimer
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_state import DONE, FAILED, LOST, RUNNING, STARTING
from hvd_magics.protocol import (CHANNEL_CLOSED, EPOCH_BEGIN, EPOCH_END, ERROR, EXIT, OUTPUT,
                                 RESULT, STARTED, TASK_STARTED)


def _event(kind, rank, recv, **fields):
    return {"kind": kind, "rank": rank, "host": f"h{rank}", "recv": recv, **fields}


def test_a_healthy_rank_goes_waiting_starting_running_done(tmp_path):
    job = JobState(1, tmp_path / "log", where="test")
    assert job.ranks[0].state == "waiting" and not job.all_started
    job.handle(_event(TASK_STARTED, 0, 1.0))
    assert job.ranks[0].state == STARTING
    job.handle(_event(STARTED, 0, 2.0, pid=42))
    assert job.ranks[0].state == RUNNING and job.all_started and job.ranks[0].pid == 42
    job.handle(_event(RESULT, 0, 3.0, parts={"value": {"blob": "x"}}))
    job.handle(_event(EXIT, 0, 4.0, code=0))
    assert job.ranks[0].state == DONE and job.all_exited and not job.any_failed
    assert job.result_parts == {"value": {"blob": "x"}}
    job.end()


def test_exit_zero_without_a_result_is_a_failure_and_unknown_ranks_are_ignored(tmp_path):
    job = JobState(2, tmp_path / "log")
    job.handle(_event(EXIT, 1, 1.0, code=0))
    job.handle(_event(EXIT, 7, 1.0, code=0))  # not a rank of this job
    assert job.ranks[1].state == FAILED
    assert job.failures()[0].headline() == "rank 1 on h1: exited with code 0 without a Python exception"
    job.end()


def test_failures_list_root_causes_first_and_peers_that_lost_them_after(tmp_path):
    job = JobState(3, tmp_path / "log")
    job.handle(_event(ERROR, 0, 1.0, error="HorovodInternalError", message="Horovod has been shut down"))
    job.handle(_event(ERROR, 2, 2.0, error="ValueError", message="bad shard"))
    job.handle(_event(CHANNEL_CLOSED, 1, 3.0, clean=False))  # its executor vanished
    order = [(f.rank, f.error) for f in job.failures()]
    assert order == [(2, "ValueError"), (1, LOST), (0, "HorovodInternalError")]
    assert "executor was lost or killed" in job.failures()[1].headline()
    # the rank that lost its peer is not counted among those that failed
    assert job.failed_count() == "2 of 3 ranks failed (rank 0 then stopped: it lost a peer)"
    job.end()


def test_ranks_that_all_lost_a_peer_are_all_counted(tmp_path):
    job = JobState(2, tmp_path / "log")
    for rank in range(2):
        job.handle(_event(ERROR, rank, 1.0, error="HorovodInternalError",
                          message="Horovod has been shut down"))
    assert job.failed_count() == "2 of 2 ranks failed"  # which went first is not known
    job.end()


def test_a_clean_close_after_exit_is_not_a_loss(tmp_path):
    job = JobState(1, tmp_path / "log")
    job.handle(_event(RESULT, 0, 1.0, parts=None))
    job.handle(_event(EXIT, 0, 2.0, code=0))
    job.handle(_event(CHANNEL_CLOSED, 0, 3.0, clean=True))
    assert not job.any_failed and job.ranks[0].state == DONE
    job.end()


def test_output_goes_to_the_log_and_moves_the_epoch_counter(tmp_path):
    job = JobState(1, tmp_path / "log")
    job.handle(_event(OUTPUT, 0, 1.0, lines=["Epoch 2/5", "hello"]))
    assert (job.ranks[0].epoch, job.ranks[0].epochs) == (2, 5)
    job.end()
    assert "[0@h0] Epoch 2/5" in (tmp_path / "log").read_text()


def test_the_epoch_timer_measures_each_epoch_across_ranks():
    timer = EpochTimer(submitted=0.0)
    events = [_event(OUTPUT, 0, 10.2, lines=["Epoch 1/2"]),
              _event(OUTPUT, 0, 12.1, lines=["Epoch 2/2"])]
    for rank, offset in ((0, 0.0), (1, 0.5)):
        events += [_event(EPOCH_BEGIN, rank, 10.0 + offset, epoch=1),
                   _event(EPOCH_END, rank, 12.0 + offset, epoch=1, duration=2.0, samples=100),
                   _event(EPOCH_BEGIN, rank, 12.0 + offset, epoch=2),
                   _event(EPOCH_END, rank, 13.0 + offset, epoch=2, duration=1.0, samples=None)]
    for event in sorted(events, key=lambda e: e["recv"]):  # in the order the driver gets them
        timer.observe(event)
    first, second = timer.rows()
    assert first["wall_s"] == 2.5 and first["slowest_rank_s"] == 2.0
    assert first["rank_seconds"] == {0: 2.0, 1: 2.0}
    assert first["samples"] == 200 and first["samples_per_s"] == 80.0
    assert round(first["line_to_line_s"], 6) == 1.9 and second["line_to_line_s"] is None
    assert second["samples"] is None  # one rank did not say: no made-up figure
    assert timer.split(20.0) == {"startup_s": 10.0, "training_s": 3.5}


def test_stacks_of_ranks_that_have_not_started_say_so(tmp_path):
    import time

    from hvd_magics.job.job_state import JobState
    from hvd_magics.job.following import collect_stacks

    class Backend:
        asked = 0

        def request_stacks(self, request):
            self.asked += 1

    import queue

    job = JobState(2, tmp_path / "ranks.log", [], "test")
    backend = Backend()
    began = time.monotonic()
    stacks = collect_stacks(job, backend, queue.Queue(), wait=0.3)
    assert time.monotonic() - began < 5 and backend.asked == 1
    assert stacks.starting == [0, 1] and "ranks 0, 1: starting (the process has not begun" in str(stacks)
    assert stacks.where() == {0: "starting (its process has not begun the job yet)",
                              1: "starting (its process has not begun the job yet)"}
