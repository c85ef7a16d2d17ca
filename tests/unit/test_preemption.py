"""A preemption notice without Spark: the ranks' side (which call turns True, the save that ends
the attempt) and the driver's (which call it picks, what the cell says, how an attempt that
ended so is told from a failure)."""
import json

import pytest

from hvd_magics.errors import HorovodJobError, Preempted, RankFailure
from hvd_magics.job.readings.preemption import EXTRA_CALLS, MARGIN_S, PreemptionWatch
from hvd_magics.job.verdicts.preemption import notice_text
from hvd_magics.job.failure_policy import preempted
from hvd_magics.rank.api import preemption


@pytest.fixture(autouse=True)
def _fresh():
    preemption.reset()
    yield
    preemption.reset()


def test_preempting_turns_true_at_the_driver_s_call_and_the_next_save_ends_the_attempt(capfd):
    assert [preemption.preempting() for _ in range(3)] == [False] * 3
    preemption.on_order(json.dumps({"at": 6, "notice": "executor 1 is being decommissioned"}))
    assert [preemption.preempting() for _ in range(4)] == [False, False, True, True]
    with pytest.raises(Preempted, match=r"checkpoint of step 1,200 was saved on a preemption "
                                        r"notice \(executor 1 is being decommissioned\)"):
        preemption.after_save(1200)
    preemption.reset()  # a notice after its call: this rank turns True at its next call
    for _ in range(5):
        preemption.preempting()
    preemption.on_order(json.dumps({"at": 3, "notice": "late"}))
    assert "came after call 3" in capfd.readouterr().err
    assert preemption.preempting()


def test_a_save_without_a_notice_does_not_end_anything():
    preemption.preempting()
    preemption.after_save(10)  # no notice: nothing raised


def test_the_driver_picks_a_call_every_rank_is_still_short_of():
    watch = PreemptionWatch()
    assert watch.target(10.0) is None  # nobody calls checkpoint.preempting()
    watch.observe(0, 100, 1.0)
    watch.observe(0, 120, 2.0)  # 20 calls a second
    watch.observe(1, 118, 2.0)
    watch.observe(1, 140, 3.0)  # 22 a second, reported a second later
    # rank 0: 120 + 20 * (3.5 - 2.0 + MARGIN_S); rank 1: 140 + 22 * (0.5 + MARGIN_S)
    expected = max(120 + 20 * (1.5 + MARGIN_S), 140 + 22 * (0.5 + MARGIN_S)) + EXTRA_CALLS
    assert watch.target(3.5) == int(expected)
    assert notice_text({4: ("3", "10.0.0.4"), 5: ("3", "10.0.0.4")}) == (
        "executor 3 (host 10.0.0.4, ranks 4, 5) is being decommissioned")
    assert notice_text({0: ("1", ""), 1: ("2", "")}) == (
        "executor 1 (rank 0) and executor 2 (rank 1) are being decommissioned")


def _error(*failures):
    return HorovodJobError("1 of 2 ranks failed", failures=list(failures))


def test_an_attempt_that_ended_on_the_notice_is_told_from_a_failure():
    saved = RankFailure(0, "h", 1, "Preempted", "the checkpoint of step 45 was saved on a ...")
    assert preempted(_error(saved, RankFailure(1, "h", 1, "Preempted", "the checkpoint of step "
                                                                     "45 was saved"))) == \
        saved.message
    assert preempted(_error(saved, RankFailure(1, "h", None, "", ""))) == saved.message  # gone
    assert preempted(_error(saved, RankFailure(1, "h", 1, "ValueError", "bad shard"))) is None
    assert preempted(_error(RankFailure(1, "h", 1, "ValueError", "bad shard"))) is None
    # rank 0, which writes, lost during its save: its peer's "Preempted" claims nothing saved,
    # and the attempt is a loss (it was told as "the checkpoint of step 56 was saved")
    part = RankFailure(1, "h", 1, "Preempted", "this rank's part of the checkpoint of step 56 "
                                               "is done, on a preemption notice (...)")
    assert preempted(_error(part, RankFailure(0, "h", None, "", ""))) is None
    from hvd_magics.job.failure_policy import loss

    assert loss(_error(part, RankFailure(0, "h", None, "", ""))).startswith("rank 0 on h")
