"""A job's failure policy decides from typed causes: each rank's cause judged once from what it
left, an attempt's cause from its ranks', and the policy's table over those."""
from types import SimpleNamespace

import pytest

from hvd_magics.causes import AttemptCause, RankCause, attempt_cause, rank_cause
from hvd_magics.errors import HorovodJobError, Preempted, RankFailure, StartTimeoutError
from hvd_magics.job.failure_policy import Decision, FailurePolicy, preempted

GLOO_PEER = "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:5000"


def test_a_ranks_cause_is_judged_once_from_what_it_left():
    assert rank_cause("") is RankCause.DIED  # killed, no Python exception
    assert rank_cause("RankLost", "its executor was lost") is RankCause.DIED
    assert rank_cause("RankLost", "stopped answering", host_lost=True) is RankCause.HOST_LOST
    assert rank_cause(Preempted.__name__, "the checkpoint of step 4 was saved") \
        is RankCause.PREEMPTED
    assert rank_cause("RuntimeError", GLOO_PEER) is RankCause.PEER_LOST
    assert rank_cause("HorovodInternalError", "ring broke") is RankCause.PEER_LOST
    # failed in the collective library, by its traceback: a consequence only beside a death
    assert rank_cause("RuntimeError", "boom", "File .../nccl.py\nNCCL error") \
        is RankCause.COLLECTIVE
    assert rank_cause("ValueError", "bad shard") is RankCause.OWN_ERROR


@pytest.mark.parametrize(("failed", "cause"), [
    ([(1, RankCause.DIED), (0, RankCause.PEER_LOST)], AttemptCause.LOST_RANK),
    ([(1, RankCause.HOST_LOST), (0, RankCause.COLLECTIVE)], AttemptCause.LOST_HOST),
    ([(1, RankCause.DIED), (0, RankCause.OWN_ERROR)], AttemptCause.USER_ERROR),
    ([(0, RankCause.PEER_LOST)], AttemptCause.USER_ERROR),  # nobody died: not a loss
    ([(0, RankCause.PREEMPTED), (1, RankCause.DIED)], AttemptCause.PREEMPTION),
    # rank 0 lost while it wrote: the others' notice is no checkpoint
    ([(1, RankCause.PREEMPTED), (0, RankCause.DIED)], AttemptCause.LOST_RANK),
    ([(0, RankCause.PREEMPTED), (1, RankCause.OWN_ERROR)], AttemptCause.USER_ERROR),
    ([], AttemptCause.USER_ERROR),
])
def test_an_attempts_cause_follows_from_its_ranks(failed, cause):
    assert attempt_cause(failed) is cause


def test_the_policys_table():
    none, two = FailurePolicy(0), FailurePolicy(2, preemptions=1)
    for lost in (AttemptCause.LOST_RANK, AttemptCause.LOST_HOST, AttemptCause.LOST_EXECUTOR):
        assert none.decide(lost, 0, 0) is Decision.FAIL
        assert two.decide(lost, 1, 0) is Decision.RESTART
        assert two.decide(lost, 2, 0) is Decision.FAIL  # used up
    assert none.decide(AttemptCause.PREEMPTION, 0, 0) is Decision.FAIL  # says how to resume
    assert two.decide(AttemptCause.PREEMPTION, 2, 0) is Decision.RESUME  # not counted
    assert two.decide(AttemptCause.PREEMPTION, 0, 1) is Decision.FAIL
    for own in (AttemptCause.USER_ERROR, AttemptCause.START_TIMEOUT):
        assert two.decide(own, 0, 0) is Decision.FAIL


def test_an_errors_cause_is_its_ranks_or_the_one_its_maker_gave():
    killed, peer = RankFailure(1, "h", -9), RankFailure(0, "h", 1, "RuntimeError", GLOO_PEER)
    assert HorovodJobError("1 of 2 ranks failed", [killed, peer]).cause is AttemptCause.LOST_RANK
    assert StartTimeoutError("rank 1 did not start", [killed]).cause \
        is AttemptCause.START_TIMEOUT
    saved = RankFailure(0, "h", 1, Preempted.__name__, "the checkpoint of step 8 was saved")
    assert preempted(HorovodJobError("2 of 2", [saved, killed])) == saved.message
    assert preempted(HorovodJobError("2 of 2", [killed])) is None


def test_a_stage_that_lost_an_executor_before_any_rank_reported_is_a_loss(tmp_path):
    """Once judged from the words of the job's error (any that said 'was lost')."""
    from hvd_magics.job.job_state import JobState
    from hvd_magics.job.watch.outcome import failure_of

    def stage(said):
        backend = SimpleNamespace(refused=None, describe_failure=lambda: said,
                                  took_every_rank=lambda: False)
        job = JobState(2, tmp_path / "ranks.log")
        try:
            return failure_of(job, backend)
        finally:
            job.end()

    assert stage("an executor was lost (Command exited with code 137)").cause \
        is AttemptCause.LOST_EXECUTOR
    assert stage("the executor's Python failed:\nValueError: the rows was lost").cause \
        is AttemptCause.USER_ERROR


def test_the_controller_steps_through_its_states_a_turn_a_step(tmp_path):
    """An attempt watched for three turns, lost, restarted, then watched to its end: each turn
    of the watch is a step of the one loop, and the loss a state of it, not a nested loop."""
    from hvd_magics.job.controller import JobController, State
    from hvd_magics.job.launch_request import LaunchRequest
    from hvd_magics.job.records.run_record import RunRecord
    from hvd_magics.launch.payload import JobPayload
    from hvd_magics.options import JobOptions

    class Watched:
        def __init__(self, request):
            self.request, self.turns = request, 0

        def start(self):
            pass

        def turn(self):
            self.turns += 1
            if self.request.attempt == 0 and self.turns == 3:
                raise HorovodJobError("1 of 2 ranks failed", [RankFailure(1, "h", -9)])
            return self.request.attempt > 0 and self.turns == 2

        def succeeded(self):
            pass

        def end(self, failure):
            if failure is not None:
                raise failure
            return RunRecord(job_id="j", np=2, where="driver", log_path="")

    request = LaunchRequest(JobPayload(b""), JobOptions(ranks=2), {}, [])
    controller = JobController(request, FailurePolicy(1), tmp_path / "c", attempts=Watched)
    record = controller.run()
    assert controller.visited == [State.STARTING, State.RUNNING, State.RUNNING, State.RUNNING,
                                  State.RESTARTING, State.STARTING, State.RUNNING,
                                  State.RUNNING]
    assert controller.state is State.FINISHED
    assert record.attempts[0].startswith("rank 1 on h: killed by signal 9") and \
        record.attempts[-1] == "succeeded"
