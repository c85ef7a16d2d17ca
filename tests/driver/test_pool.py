"""Warm pools on the driver (np < 0): real rank processes that live across runs."""
import os
import signal
import threading
import time

import pytest

from hvd_magics import (HorovodJobError, HorovodPool, HorovodRunner, JobInterrupted, PoolError,
                         last_run)
from tests import jobs
from tests.conftest import rank_processes_alive


@pytest.fixture()
def pool():
    with HorovodPool(np=-2) as warm:
        yield warm


def test_runs_share_the_same_processes_and_what_they_kept(pool):
    pids = pool.run(jobs.pool_keep, answer=42)
    value, again = pool.run(jobs.pool_read, name="answer")
    assert value == 42 and again == pids
    assert last_run().where == "driver (warm pool)" and last_run().status == "succeeded"
    assert "2 warm ranks on driver" in repr(pool) and "2 cells run" in repr(pool)


def _threads_on_cpu_s(pid: int) -> dict[str, tuple[float, float]]:
    """Each thread of ``pid``: its seconds on a CPU and waiting for one so far (the kernel's
    ``schedstat``), by thread id and name."""
    seen = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm, \
                    open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                ran_ns, waited_ns, _ = map(int, stat.read().split())
                seen[f"{tid} {comm.read().strip()}"] = (ran_ns / 1e9, waited_ns / 1e9)
        except OSError:  # a thread that ended while it was read
            continue
    return seen


def test_an_idle_pool_leaves_the_cores_alone(pool):
    """Horovod's timeline writer (rank 0, whenever HOROVOD_TIMELINE is set; a pool's ranks start
    with DYNAMIC so that a cell can ask for a timeline) waited for records in a loop of
    sched_yield: an idle pool of 2 ranks used 1.5 CPU s a second, rank 0 most of it. A thread
    that waits so is runnable all the time, on a CPU or queued for one, however busy the machine
    (its CPU seconds are not: in the CI of stop 79 an idle rank 0 used 1.73 CPU s in 3 s beside
    the suite's lanes, over a bound on them). Idle, each thread of each rank is runnable a tenth
    of the time or less, quiet or beside 6 spinning processes; a thread of sched_yield, 100%.
    And Horovod's background loop negotiated nothing with the peers every millisecond: 7% of a
    core a rank (0.33-0.45 CPU s in 5 s); it now waits for the next enqueue (change 11 of
    hvd_magics/horovod/patches.py): rank 1, which has no timeline writer, 0.5-1% of a core."""
    pool.run(jobs.pool_horovod_init)
    before = {rank: _threads_on_cpu_s(pid) for rank, pid in pool.pids.items()}
    started = time.monotonic()
    time.sleep(3.0)  # the idle time being measured, not a wait for a condition
    after = {rank: _threads_on_cpu_s(pid) for rank, pid in pool.pids.items()}
    idle_s = time.monotonic() - started
    runnable = {f"rank {rank} thread {name}": (
        (ran - before[rank][name][0]) / idle_s, (waited - before[rank][name][1]) / idle_s)
        for rank in after for name, (ran, waited) in after[rank].items() if name in before[rank]}
    busiest = max(runnable, key=lambda name: sum(runnable[name]))
    ran, waited = runnable[busiest]
    assert ran + waited < 0.5, (f"{busiest} was runnable {ran + waited:.0%} of {idle_s:.1f} s "
                                f"idle (on a CPU {ran:.0%}, queued {waited:.0%})")
    assert 0 < ran, runnable  # the threads read are the ranks' that run Horovod
    on_cpu = sum(share for name, (share, _) in runnable.items() if name.startswith("rank 1 "))
    assert on_cpu < 0.03, f"rank 1 was on a CPU {on_cpu:.1%} of {idle_s:.1f} s idle"


def test_a_runs_environment_is_its_own(pool):
    assert HorovodRunner(np=-2, env={"HVD_TEST_X": "1"}, pool=pool).run(
        jobs.environment_value, name="HVD_TEST_X") == "1"
    assert pool.run(jobs.environment_value, name="HVD_TEST_X") is None


def test_a_model_built_in_one_run_is_trained_in_the_next(pool):
    first = pool.run(jobs.pool_build_model)
    trained = pool.run(jobs.pool_train_kept, steps=5)
    assert trained != first
    assert pool.run(jobs.pool_train_kept, steps=0) == trained  # rank 0 kept the trained model
    record = last_run()
    assert record.exit_codes == {0: 0, 1: 0}


def test_a_failing_rank_fails_the_run_and_the_pool_keeps_every_namespace(pool):
    pids = pool.run(jobs.pool_keep, kept="yes")
    with pytest.raises(HorovodJobError) as info:
        pool.run(jobs.raise_on_rank, bad_rank=1)
    assert info.value.failures[0].rank == 1 and "boom from rank 1" in str(info.value)
    assert "restarted" not in str(info.value)
    assert "Rank 0 finished the cell and rank 1 did not: the ranks' variables now differ" in \
        str(info.value)
    assert pool.run(jobs.pool_read, name="kept") == ("yes", pids)


def test_a_stuck_rank_restarts_the_ranks_and_the_error_says_so(pool):
    pids = pool.run(jobs.pool_keep, kept="yes")
    with pytest.raises(HorovodJobError) as info:
        pool.run(jobs.pool_raise_on_rank_1_while_0_allreduces)
    text = str(info.value)
    assert "rank 1 on localhost: ValueError: rank 1 gives up" in text
    assert "The ranks were restarted: rank 0 did not come back" in text, text
    assert "their variables are gone" in text
    value, new_pid = pool.run(jobs.pool_read, name="kept")
    assert value is None and new_pid != pids
    assert rank_processes_alive([pids]) == []
    assert pool.restarts == 1


def test_an_interrupt_stops_the_run_on_every_rank_and_keeps_the_pool(pool, tmp_path):
    pids = pool.run(jobs.pool_keep, kept="yes")

    def interrupt_when_running():
        while not all((tmp_path / str(r)).exists() for r in (0, 1)):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    with pytest.raises(JobInterrupted, match="interrupted the cell on every rank of the warm "
                                             "pool; the pool keeps its ranks") as info:
        pool.run(jobs.pool_sleep_marked, marks=str(tmp_path))
    assert "Where each rank was:" in str(info.value) and "pool_sleep_marked" in str(info.value)
    assert last_run().status == "interrupted"
    assert pool.run(jobs.pool_read, name="kept") == ("yes", pids)


def test_an_idle_pool_ends_frees_its_ranks_and_says_so():
    pool = HorovodPool(np=-1, idle_timeout=0.5)
    pid = pool.run(jobs.pool_keep)
    deadline = time.monotonic() + 30
    while pool.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pool.alive
    with pytest.raises(PoolError, match=r"has ended: it ran nothing for 0 s \(its idle timeout\)"
                                        r".*Fix: start it again"):
        pool.run(jobs.pool_keep)
    assert rank_processes_alive([pid]) == []


def test_closing_a_pool_leaves_no_process_and_refuses_more_work():
    pool = HorovodPool(np=-2)
    pids = [pool.run(jobs.pool_keep)]
    pool.close()
    assert rank_processes_alive(pids) == []
    with pytest.raises(PoolError, match="it was stopped"):
        pool.run(jobs.pool_keep)


def test_a_pool_refuses_an_elastic_size_and_a_runner_of_another_size():
    with pytest.raises(ValueError, match="a warm pool has a fixed number of ranks"):
        HorovodPool(np="1:2")
    with HorovodPool(np=-1) as pool:
        with pytest.raises(ValueError, match="np=-2 is not the warm pool's np=-1"):
            HorovodRunner(np=-2, pool=pool)


def test_the_magic_runs_cells_on_the_pool_and_they_share_variables(ip, capsys):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="%hvd_pool start np=2"):
        ip.run_cell_magic("horovod", "", "1")
    ip.run_line_magic("hvd_pool", "start np=-2")
    try:
        assert "2 warm ranks on driver" in capsys.readouterr().out
        ip.run_cell_magic("horovod", "", "import os\nbase = int(os.environ['HOROVOD_RANK'])\n"
                                         "kept = base + 7")
        ip.user_ns["step"] = 10
        assert ip.run_cell_magic("horovod", "--return total", "total = base + step\ntotal") == 10
        assert ip.user_ns["total"] == 10
        assert ip.run_cell_magic("horovod", "np=-2", "base") == 0  # the pool's own np
        with pytest.raises(HorovodJobError, match="NameError: name 'base' is not defined"):
            ip.run_cell_magic("horovod", "np=-2 --cold", "base")  # new ranks
        assert last_run().where == "driver"
        ip.run_line_magic("hvd_pool", "")
        assert "3 cells run" in capsys.readouterr().out
        # what an earlier cell made on the pool comes back without being assigned again
        ip.run_cell_magic("horovod", "--return kept", "None")
        assert ip.user_ns["kept"] == 7
        with pytest.raises(UsageError, match="a warm pool runs already"):
            ip.run_line_magic("hvd_pool", "start np=-2")
        ip.run_line_magic("hvd_pool", "restart")
        with pytest.raises(HorovodJobError, match="NameError: name 'base' is not defined"):
            ip.run_cell_magic("horovod", "", "base")
    finally:
        ip.run_line_magic("hvd_pool", "stop")
    assert "has ended; its slots are free" in capsys.readouterr().out


def test_a_notebook_value_travels_again_only_when_it_changed(ip):
    from hvd_magics.job.session import SESSION

    ip.run_line_magic("hvd_pool", "start np=-2")
    try:
        pool = next(iter(SESSION.live_pools))
        ip.user_ns["values"] = list(range(1000))
        # a cell that changes the value on the ranks does not change what the next cell gets
        assert ip.run_cell_magic("horovod", "", "values.append(-1)\nlen(values)") == 1001
        assert pool.pack_values({"values": ip.user_ns["values"]})["values"].pickled is None
        assert ip.run_cell_magic("horovod", "", "len(values), values[-1]") == (1000, 999)
        ip.user_ns["values"].append(5)  # changed in the notebook: sent again
        assert pool.pack_values({"values": ip.user_ns["values"]})["values"].pickled is not None
        assert ip.run_cell_magic("horovod", "", "len(values), values[-1]") == (1001, 5)
        with pytest.raises(HorovodJobError, match="ZeroDivisionError"):
            ip.run_cell_magic("horovod", "", "len(values) / (hvd_rank := int(__import__("
                                             "'os').environ['HOROVOD_RANK']))")
        # after a failed cell nothing is taken as held: everything is sent again
        assert pool.pack_values({"values": ip.user_ns["values"]})["values"].pickled is not None
        assert ip.run_cell_magic("horovod", "", "values[-1]") == 5
        ip.run_line_magic("hvd_pool", "restart")
        assert ip.run_cell_magic("horovod", "", "values[-1]") == 5  # new ranks get it anew
    finally:
        ip.run_line_magic("hvd_pool", "stop")


def test_a_rank_killed_between_runs_is_replaced_at_the_next_run_which_says_so(pool, capsys):
    pool.run(jobs.pool_keep, kept="yes")
    os.kill(pool.pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not pool.lost_since_last_cell() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.run(jobs.pool_read, name="kept")[0] is None
    assert ("the warm pool lost rank 1 since its last cell; its ranks were restarted"
            in capsys.readouterr().err)


def test_ranks_on_an_executor_decommissioned_between_runs_are_restarted_first(pool, capsys,
                                                                             monkeypatch):
    """Spark's scheduler stands in here (ranks on the driver have no executor): what it says of
    the pool's tasks is the real one's shape (tests/spark_cluster/test_preemption.py has the
    real one during a cell)."""
    pool.run(jobs.pool_keep, kept="yes")
    monkeypatch.setattr(pool, "tasks", {0: 11, 1: 12})
    monkeypatch.setattr(pool.backend, "decommissioning",
                        lambda tasks: {1: ("3", "10.0.0.4")} if 12 in tasks.values() else {})
    assert pool.run(jobs.pool_read, name="kept")[0] is None  # run on restarted ranks
    assert pool.restarts == 1
    assert ("hvd_magics: executor 3 (host 10.0.0.4, rank 1) is being decommissioned: the warm "
            "pool's ranks were restarted away from it, so their variables are gone."
            in capsys.readouterr().err)


def test_a_rank_killed_during_a_run_fails_it_and_the_pool_comes_back(pool):
    with pytest.raises(HorovodJobError) as info:
        pool.run(jobs.fail_on_rank, bad_rank=1, how="kill")
    assert "The ranks were restarted: the pool lost rank 1" in str(info.value), str(info.value)
    assert pool.run(jobs.pool_read, name="kept")[0] is None


def test_a_users_module_edited_between_cells_is_reloaded_on_the_ranks(tmp_path, capfd):
    """The pool's ranks kept the old code of a module from the user's folder (cold ranks saw
    the new)."""
    module = tmp_path / "user_helpers_mod.py"
    module.write_text("VALUE = 1\n")
    with HorovodPool(np=-2, env={"PYTHONPATH": str(tmp_path)}) as pool:
        assert pool.run(jobs.module_value, name="user_helpers_mod") == 1
        module.write_text("VALUE = 2  # edited\n")
        assert pool.run(jobs.module_value, name="user_helpers_mod") == 2
        shown = "".join(capfd.readouterr())
        assert "hvd_magics: reloaded user_helpers_mod on the pool's ranks" in shown, shown
        assert shown.count("reloaded user_helpers_mod") == 1  # said by rank 0 only
        assert pool.run(jobs.module_value, name="user_helpers_mod") == 2
        assert "reloaded" not in "".join(capfd.readouterr())  # unchanged: not again
        module.write_text("VALUE = = 3\n")  # a broken edit fails the cell, as a cold import
        with pytest.raises(HorovodJobError, match="SyntaxError"):
            pool.run(jobs.module_value, name="user_helpers_mod")
        module.write_text("VALUE = 4\n")
        assert pool.run(jobs.module_value, name="user_helpers_mod") == 4


def test_a_plain_ddp_loop_is_seen_cell_after_cell_on_a_torch_pool():
    """The inferred epochs of one cell end with it: the next cell's loop starts at epoch 1."""
    from tests import engine_jobs

    with HorovodPool(np=-2, engine="torch") as torch_pool:
        torch_pool.run(engine_jobs.plain_ddp_loop, epochs=2)
        assert [(r["epoch"], r["samples"]) for r in last_run().epochs] == [(1, 256), (2, 256)]
        torch_pool.run(engine_jobs.plain_ddp_loop, epochs=3, set_epoch=False)
        assert [r["epoch"] for r in last_run().epochs] == [1, 2, 3]
