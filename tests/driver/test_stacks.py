"""Where each rank is: stalls shown with the line a rank is in, --timeout, interrupts."""
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, JobInterrupted, JobTimeoutError, last_run
from tests import jobs
from tests.conftest import interrupt_once_marked, rank_processes_alive


def test_a_timeout_stops_the_job_and_says_where_each_rank_was(capsys):
    began = time.monotonic()
    with pytest.raises(JobTimeoutError) as info:
        HorovodRunner(np=-2, timeout=8, stall_after=2).run(jobs.wait_for_a_sleeping_peer)
    text = str(info.value)
    assert "ran past its timeout of 8 s" in text and "--timeout" in text
    assert "rank 1: " in text and "slow_down (time.sleep(600))" in text
    assert "rank 0: " in text and "in horovod/torch/mpi_ops.py" in text
    assert "rank 0 waits in a Horovod collective for rank 1" in text
    assert time.monotonic() - began < 30
    # the stall was shown while it ran, with the line each rank was in
    shown = capsys.readouterr().out
    assert "[1] no output or progress for 2 s, in " in shown and "slow_down" in shown
    assert last_run().status == "failed"
    assert rank_processes_alive(list(last_run().pids.values())) == []


def test_an_interrupt_says_where_each_rank_was(tmp_path):
    interrupt_once_marked(tmp_path)
    with pytest.raises(JobInterrupted) as info:
        HorovodRunner(np=-2).run(jobs.pool_sleep_marked, marks=str(tmp_path))
    text = str(info.value)
    assert "nothing is left running" in text and "Where each rank was:" in text
    # both ranks sleep on the same line: said once, for both
    assert "ranks 0, 1: " in text and "rank 0: " not in text and "pool_sleep_marked" in text
    assert rank_processes_alive(list(last_run().pids.values())) == []


def test_a_rank_that_waited_out_horovods_start_says_so_in_our_words_and_the_fix():
    """Gloo's start timeout ends the waiting rank by SIGABRT (a C++ exception): the error names
    that rank with the exception's type and message once, then what it means and the fix, and
    leaves the late rank running nowhere."""
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "3"}).run(
            jobs.horovod_init_late, late=1, seconds=8)
    text = str(info.value)
    first = text.splitlines()[0]
    assert first.startswith("1 of 2 ranks failed; the first was rank 0 on ")
    assert first.endswith("gloo::IoException: Wait timeout after 3 seconds for key(s): 1. You "
                          "may want to increase the timeout via HOROVOD_GLOO_TIMEOUT_SECONDS")
    assert text.count("gloo::IoException") == 1  # said once, not again in the ranks' list
    shown = "\n".join(info.value._render_traceback_())  # what the cell shows
    assert shown.count("gloo::IoException") == 1 and "terminate called" not in shown, shown
    assert "Horovod's start timed out" in text and "--env HOROVOD_GLOO_TIMEOUT_SECONDS=120" in text
    assert rank_processes_alive(list(last_run().pids.values())) == []
