"""The start timeout of a job whose executors first fetch and unpack the notebook's shipped
environment (hvd_magics/job/verdicts/startup.py): a 2 GB archive's first job failed after 120 s with a
StartTimeoutError while the executors were still unpacking it. The backend here is the smallest
one the runner takes (a Spark stage whose tasks are never heard from), not a cluster: a real
archive large enough to need the allowance takes minutes to unpack."""
import queue
import time

import pytest

from hvd_magics.errors import StartTimeoutError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.watch.loop import watch as _watch


class SilentStage:
    """A stage whose tasks were submitted and have not spoken (they fetch and unpack)."""

    where, keeps_ranks, restart_note = "spark spark://h:7077", False, ""
    live, reads_data, finished, drained, refused = True, False, False, False, None

    def __init__(self, unpacking):
        self._unpacking = unpacking

    def unpacking(self):
        return self._unpacking

    def heard_ago(self, now):
        return {}

    def silence_note(self, ranks):
        return ""

    def request_stacks(self, request):
        pass

    def decommissioning(self, tasks):
        return {}


@pytest.mark.parametrize("unpacking, waited", [(None, 1.0), ((1.5, "the executors fetch and "
                                                               "unpack the notebook's environment "
                                                               "(2.0 GB packed) before its ranks "
                                                               "start"), 2.5)])
def test_the_start_timeout_does_not_count_the_unpacking_of_a_new_environment(
        tmp_path, capfd, unpacking, waited):
    job = JobState(2, tmp_path / "ranks.log")
    began = time.monotonic()
    with pytest.raises(StartTimeoutError) as info:
        _watch(job, SilentStage(unpacking), queue.Queue(), start_timeout=1.0)
    took = time.monotonic() - began
    assert waited <= took < waited + 1.0, took
    text = str(info.value)
    assert text.startswith(f"Timed out after {waited:.0f} s")
    if unpacking:
        assert "(1 s, and 2 s while the executors fetch and unpack the notebook's environment" \
            in text, text
        assert "the executors fetch and unpack the notebook's environment (2.0 GB packed) " \
            "before its ranks start: 0 s so far" in capfd.readouterr().err
