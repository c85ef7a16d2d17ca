"""The parts of an elastic job that need no cluster: sizes, the slot registry Horovod's elastic
driver discovers, the job state across re-formings, and the Keras epoch count across resets."""
import io
import threading
import time
import types

import pytest

from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_state import DONE, FAILED, READY, RUNNING
from hvd_magics.options import ElasticSize, validate_size
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.views.text_view import TextView
from hvd_magics.launch.elastic_backend import LOST_CODE, TaskSlots
from hvd_magics.protocol import (CHANNEL_CLOSED, EXIT, OUTPUT, RESIZE, RESULT,
                                 SLOT_OFFER, STARTED)
from hvd_magics.rank.integrations.keras import _elastic_epochs_done
from hvd_magics.task.elastic_task import slot_host_name


@pytest.mark.parametrize("given, size", [
    ("2:4", ElasticSize(2, 4)), ((1, 3), ElasticSize(1, 3)), ([2, 2], ElasticSize(2, 2)),
    (-2, -2), (ElasticSize(1, 2), ElasticSize(1, 2))])
def test_sizes_fixed_and_elastic(given, size):
    assert validate_size(given) == size


@pytest.mark.parametrize("given, fix", [(" 3 ", "np=3"), ("-2", "np=-2")])
def test_a_fixed_size_given_as_text_is_refused_with_the_number(given, fix):
    """``np="-2"`` was taken while ``restarts="1"`` was refused: a number is given as one (a
    magic's line reads its own text first)."""
    with pytest.raises(ValueError, match=f"np takes a number, not text: got '{given}'. Fix: {fix}$"):
        validate_size(given)


@pytest.mark.parametrize("bad", ["4:2", "0:2", "a:b", (1,), (1.0, 2), (True, 2), "x", 0])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="np"):
        validate_size(bad)


def test_slot_host_names_have_no_colon_and_differ_per_attempt():
    assert slot_host_name("10.0.0.5", 3, 1) == "10.0.0.5-task3-try1"
    assert ":" not in slot_host_name("fe80::1", 0, 0)


def test_task_slots_are_discovered_until_their_rank_fails_or_their_task_is_lost():
    slots = TaskSlots()
    slots.offer("a-task0-try0", 0)
    slots.offer("a-task1-try0", 1)
    assert slots.find_available_hosts_and_slots() == {"a-task0-try0": 1, "a-task1-try0": 1}
    assert slots.task_of("a-task1-try0") == 1
    assert slots.ended(1, -9) == "a-task1-try0"
    assert slots.ended(1, LOST_CODE) is None  # its channel closing after the exit adds nothing
    assert slots.find_available_hosts_and_slots() == {"a-task0-try0": 1}
    assert slots.wait_exit("a-task1-try0", []) == -9
    slots.offer("b-task1-try1", 1)  # Spark ran the task again elsewhere: a new host
    assert slots.ready == 2
    assert slots.ended(0, 0) == "a-task0-try0"  # a rank that ended well stays discoverable
    assert slots.ready == 2
    assert slots.ended(5, 1) is None  # a task that never offered


def test_waiting_for_an_exit_stops_when_the_driver_says_so():
    slots, stop = TaskSlots(), threading.Event()
    slots.offer("h-task0-try0", 0)
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    assert slots.wait_exit("h-task0-try0", [stop]) is None
    assert time.monotonic() - start < 2
    threading.Timer(0.2, lambda: slots.ended(0, 3)).start()
    assert slots.exit_of("h-task0-try0", 5) == 3


def test_wait_ready_returns_at_the_count_or_the_deadline():
    slots, never = TaskSlots(), threading.Event()
    threading.Timer(0.1, lambda: slots.offer("h-task0-try0", 0)).start()
    assert slots.wait_ready(1, time.monotonic() + 5, never) == 1
    start = time.monotonic()
    assert slots.wait_ready(2, time.monotonic() + 0.3, never) == 1
    assert 0.25 < time.monotonic() - start < 2


def _event(kind, task, recv, **fields):
    return {"kind": kind, "rank": task, "host": f"h{task}", "recv": recv, **fields}


def test_an_elastic_jobs_rows_are_tasks_that_change_rank_and_come_back(tmp_path):
    out = io.StringIO()
    job = JobState(3, tmp_path / "log", [TextView(stream=out)], "test", ElasticSize(2, 3))
    for task in range(3):
        job.handle(_event(SLOT_OFFER, task, 1.0, attempt=0))
    assert [r.state for r in job.ranks] == [READY] * 3
    job.handle({"kind": RESIZE, "rank": None, "reset": 0, "size": 3, "ranks": {0: 1, 1: 2, 2: 0},
                "causes": [], "time": 1.0})
    assert [r.hvd_rank for r in job.ranks] == [1, 2, 0]
    for task in range(3):
        job.handle(_event(STARTED, task, 2.0, pid=100 + task))
    job.handle(_event(OUTPUT, 2, 2.5, lines=[
        "[2026-11-22 08:52:58: E /x/horovod/common/operations.cc:697] [0]: Horovod background loop "
        "uncaught exception: [/x/pair.cc:589] Read error [127.0.0.1]:65442: Connection reset by "
        "peer"]))
    job.handle(_event(EXIT, 1, 3.0, code=-9))
    assert job.ranks[1].state == FAILED
    job.handle({"kind": RESIZE, "rank": None, "reset": 1, "size": 2, "ranks": {0: 1, 2: 0},
                "causes": ["the rank of task 1 exited with code -9"], "time": 3.0})
    assert job.current_size == 2 and [r["size"] for r in job.resets] == [2]
    job.handle(_event(SLOT_OFFER, 1, 4.0, attempt=1))  # Spark ran task 1 again
    assert job.ranks[1].state == READY and job.ranks[1].attempt == 1
    assert job.ranks[1].exit_code is None and job.ranks[1].pid is None
    job.handle({"kind": RESIZE, "rank": None, "reset": 2, "size": 3, "ranks": {0: 1, 1: 2, 2: 0},
                "causes": ["task 1 joined"], "time": 5.0})
    job.handle(_event(STARTED, 1, 5.0, pid=200))
    assert job.ranks[1].state == RUNNING
    # the final rank 0 is task 2: its value is the job's
    job.handle(_event(RESULT, 0, 6.0, parts=None))
    job.handle(_event(RESULT, 2, 6.0, parts={"value": {"blob": "v"}}))
    job.handle(_event(RESULT, 1, 6.0, parts=None))
    for task in range(3):
        job.handle(_event(EXIT, task, 7.0, code=0))
    assert job.result_parts == {"value": {"blob": "v"}}
    assert [r.state for r in job.ranks] == [DONE] * 3
    job.end()
    text = out.getvalue()
    assert "elastic job started with 3 ranks (task 2 as rank 0, task 0 as rank 1, task 1 as rank 2)" in text
    assert ("reset 1: the rank of task 1 exited with code -9; training goes on with 2 ranks "
            "(task 2 as rank 0, task 0 as rank 1)") in text
    assert "reset 2: task 1 joined; training goes on with 3 ranks" in text
    assert "Connection reset by peer" not in text  # expected in an elastic job: in the log only
    assert "Connection reset by peer" in (tmp_path / "log").read_text()


def test_a_lost_task_is_named_as_a_task(tmp_path):
    job = JobState(2, tmp_path / "log", where="test", elastic=ElasticSize(1, 2))
    job.handle(_event(SLOT_OFFER, 1, 1.0, attempt=0))
    job.handle(_event(CHANNEL_CLOSED, 1, 2.0, clean=False))
    assert job.failures()[0].headline().startswith(
        "task 1 on h1: RankLost: Spark task 1 on h1 ended without a word")


def test_the_record_lists_each_reset_with_its_cause():
    record = RunRecord(job_id="j", np=3, elastic="2:3", final_size=1, resets=[
        {"reset": 1, "size": 2, "ranks": {0: 0, 2: 1}, "causes": ["task 1 was lost (its executor "
                                                                 "went away)"], "time": 0.0},
        {"reset": 2, "size": 1, "ranks": {0: 0}, "causes": [], "time": 1.0}])
    text = str(record)
    assert "ranks       elastic 2:3, ended with 1" in text
    assert "reset 1     task 1 was lost (its executor went away); 2 ranks after it" in text
    assert "reset 2     the ranks re-formed; 1 rank after it" in text


def test_keras_counts_epochs_on_across_an_elastic_reset():
    state = types.SimpleNamespace(epoch=3)
    epoch_state = type("UpdateEpochStateCallback", (), {"state": state})()
    assert _elastic_epochs_done([object(), epoch_state]) == 3
    assert _elastic_epochs_done([object()]) == 0
