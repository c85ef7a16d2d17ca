"""Each rank's thread count: its share of the cores it runs on (task/threads.py)."""
import pytest

from hvd_magics.task.threads import task_cpus, thread_share, with_thread_share

pytestmark = pytest.mark.fast


def test_a_ranks_share_is_the_cores_over_the_ranks_and_never_below_one():
    assert [thread_share(8, n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert thread_share(1, 0) == 1


def test_the_jobs_setting_wins_and_the_notebooks_own_only_on_the_driver():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "8"}  # a Spark worker's: the task's CPUs
    assert with_thread_share(base, {}, 8, 4, keep_base=False)["OMP_NUM_THREADS"] == "2"
    assert with_thread_share(base, {}, 8, 4, keep_base=True)["OMP_NUM_THREADS"] == "8"
    assert with_thread_share(base, {"OMP_NUM_THREADS": "6"}, 8, 4,
                             keep_base=False)["OMP_NUM_THREADS"] == "8"  # the job's comes later
    assert with_thread_share({"PATH": "/bin"}, {}, 2, 2, keep_base=True) == \
        {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    # a rank alone is left as it was (and so is its zygote's key)
    assert with_thread_share({"PATH": "/bin"}, {}, 2, 1, keep_base=True) == {"PATH": "/bin"}
    assert with_thread_share(base, {}, 8, 1, keep_base=False)["OMP_NUM_THREADS"] == "8"
    assert base["OMP_NUM_THREADS"] == "8"  # the worker's own mapping is not changed


def test_a_tasks_cpus_come_from_its_context_or_else_this_process():
    class Context:
        def __init__(self, cpus):
            self._cpus = cpus

        def cpus(self):
            if self._cpus is None:
                raise AttributeError("an old Spark")
            return self._cpus

    from hvd_magics.task.threads import driver_cores

    assert task_cpus(Context(4)) == 4
    assert task_cpus(Context(0)) == 1
    assert task_cpus(Context(None)) == task_cpus(None) == driver_cores()
