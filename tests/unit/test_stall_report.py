"""Horovod's stall reports read from the ranks' output (a finished rank awaited by a peer)."""
from hvd_magics.job.stall_report import StallReports
from hvd_magics.protocol import END_TENSOR

HEADER = ("[2026-11-23 14:00:00.000000: W /tmp/horovod/common/stall_inspector.cc:107] One or "
          "more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks "
          "and are waiting for remainder of ranks for more than 5 seconds. This may indicate "
          "that different ranks are trying to submit different tensors or that only subset of "
          "ranks is submitting tensors, which will cause deadlock. ")


def feed(reports, rank, lines):
    return [reports.feed(rank, line) for line in lines]


def test_a_finished_rank_awaited_in_a_collective_is_an_early_finish():
    reports = StallReports(2)
    shown = feed(reports, 0, ["step 3", HEADER, "Missing ranks:", f"0: [{END_TENSOR}]",
                              "1: [allreduce.noname.5]", "step 4"])
    assert shown == [False, True, True, True, True, False]
    finish = reports.early_finish
    assert finish.finished == [1] and finish.waiting == {0: ["allreduce.noname.5"]}
    assert finish.message().startswith("rank 1 finished (its function returned) while rank 0 "
                                       "still waited for it in a Horovod collective "
                                       "('allreduce.noname.5')")


def test_a_stall_without_a_finished_rank_is_only_hidden():
    """Ranks waiting for a slow peer (rank 0 validating, say) are legitimate."""
    reports = StallReports(3)
    assert all(feed(reports, 0, [HEADER, "Missing ranks:", "2: [grad.dense, grad.bias]"]))
    assert reports.early_finish is None


def test_tensorflow_names_and_shutdown_marks_are_read():
    reports = StallReports(4)
    feed(reports, 0, [HEADER, "Missing ranks:", f"0!: [HorovodAllreduce_{END_TENSOR}_0]",
                      f"2: [HorovodAllreduce_{END_TENSOR}_0]", "1: [grad_0, grad_1, a, b, c, d ...]"])
    finish = reports.early_finish
    assert finish.finished == [1, 3] and sorted(finish.waiting) == [0, 2]
    assert "ranks 1, 3 finished" in finish.message()
    assert "'a', 'b', 'c' ..." in finish.message()  # at most three names, sorted
