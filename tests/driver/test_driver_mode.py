"""np < 0: real Horovod ranks (Gloo) as processes on the driver, no Spark."""
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from hvd_magics.protocol import ENV_PREIMPORT
from tests import jobs
from tests.conftest import rank_processes_alive


def test_torch_allreduce_on_two_driver_ranks(capsys):
    result = HorovodRunner(np=-2).run(jobs.torch_allreduce)
    assert [r["sum"] for r in result] == [3.0, 3.0]
    assert [(r["rank"], r["local_rank"], r["size"]) for r in result] == [(0, 0, 2), (1, 1, 2)]
    assert rank_processes_alive([r["pid"] for r in result]) == []
    record = last_run()
    assert record.status == "succeeded" and record.where == "driver"
    assert record.exit_codes == {0: 0, 1: 0}


def test_tensorflow_allreduce_and_keras_weights_agree():
    result = HorovodRunner(np=-2).run(jobs.tf_allreduce)
    assert [r["sum"] for r in result] == [[1.0, 2.0], [1.0, 2.0]]
    assert [r["avg"] for r in result] == [[0.5, 1.0], [0.5, 1.0]]
    trained = HorovodRunner(np=-2).run(jobs.keras_two_steps)
    assert trained[0]["keras"].startswith("tf_keras")
    assert trained[0]["weights"] == trained[1]["weights"]


def test_output_lines_arrive_tagged_and_in_order(capsys):
    assert HorovodRunner(np=-2).run(jobs.print_lines, count=30) == 0
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        mine = [line for line in out if line.startswith(f"[{rank}] ")]
        assert mine == [f"[{rank}] line {i} of rank {rank}" for i in range(30)]
    log = open(last_run().log_path).read()
    assert log.count("of rank 1") == 30


@pytest.mark.parametrize("how, expect", [
    ("raise", "ValueError: boom from rank 1"),
    ("exit", "exited with code 3 without a Python exception"),
    ("kill", "killed by signal 9"),
])
def test_a_failing_rank_ends_the_whole_job_promptly(how, expect):
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=-2).run(jobs.fail_on_rank, bad_rank=1, how=how)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"took {elapsed:.1f} s"
    err = info.value
    assert err.failures[0].rank == 1 and expect in err.failures[0].headline()
    rendered = "\n".join(err._render_traceback_())
    assert "[rank 1]" in rendered and "rank 1 before the failure" in rendered
    if how == "raise":
        assert "in inner" in rendered and "boom from rank 1" in rendered
    record = last_run()
    assert record.status == "failed"
    assert rank_processes_alive(record.pids.values()) == []
    # the next job in the same process works
    assert HorovodRunner(np=-2).run(jobs.print_lines, count=1) == 0


def test_np_zero_and_bad_verbosity_are_refused():
    with pytest.raises(ValueError, match="np=0 runs nothing"):
        HorovodRunner(np=0)
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="loud")


def test_start_timeout_names_what_it_waited_for_and_the_knob():
    from hvd_magics import StartTimeoutError

    # the ranks block in an early import, so they never start (a rank that started in time
    # would sleep forever: the watch found both started on a loaded machine and waited 600 s)
    never = {ENV_PREIMPORT: "tests.never_starts"}
    with pytest.raises(StartTimeoutError, match=r"waiting for ranks .* to start.*raise start_timeout"):
        HorovodRunner(np=-2, start_timeout=0.5, env=never).run(jobs.sleep_forever)
    record = last_run()
    assert record.status == "failed"
    assert rank_processes_alive(record.pids.values()) == []  # reaped before run() returned


def test_extra_environment_reaches_the_ranks():
    def read_env():
        import os

        return os.environ["HVD_TEST_SETTING"], os.environ["TF_USE_LEGACY_KERAS"]

    assert HorovodRunner(np=-1, env={"HVD_TEST_SETTING": "on"}).run(read_env) == ("on", "1")


def test_ranks_on_the_driver_share_its_cores_unless_the_job_or_the_notebook_says(monkeypatch):
    """Two PyTorch ranks on two cores each took a pool of two threads and spun on each other's
    cores (200 small steps: 14.4 CPU s, 4.6 with one thread each)."""
    from hvd_magics.task.threads import driver_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = max(1, driver_cores() // 2)
    assert HorovodRunner(np=-2).run(jobs.rank_threads) == [(str(share), share)] * 2
    # (PyTorch takes no more threads than the host's cores: only the variable is compared)
    ranks = HorovodRunner(np=-2, env={"OMP_NUM_THREADS": "3"}).run(jobs.rank_threads)
    assert [variable for variable, _ in ranks] == ["3", "3"]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the notebook's own setting
    assert HorovodRunner(np=-1).run(jobs.rank_threads)[0][0] == "4"


def test_keras3_with_distributed_gradient_tape_keeps_ranks_identical():
    result = HorovodRunner(np=-2, env={"TF_USE_LEGACY_KERAS": "0"}).run(jobs.keras3_gradient_tape)
    assert result["keras"].startswith("3.")
    assert result["weights"][0] == result["weights"][1]
