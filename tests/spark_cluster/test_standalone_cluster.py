"""A real standalone Spark cluster on loopback: a master and two one-core workers."""
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from tests import jobs
from tests.conftest import rank_processes_alive


def test_ranks_run_in_two_executors_and_allreduce(cluster_spark):
    result = HorovodRunner(np=2).run(jobs.torch_allreduce)
    assert [r["sum"] for r in result] == [3.0, 3.0]
    assert last_run().where.startswith("spark spark://127.0.0.1:")
    # each standalone executor runs in its own work folder (.../work/app-*/<executor id>)
    assert len({r["cwd"] for r in result}) == 2, result
    tf_result = HorovodRunner(np=2).run(jobs.tf_allreduce)
    assert [r["avg"] for r in tf_result] == [[0.5, 1.0], [0.5, 1.0]]


def test_a_failing_rank_on_the_cluster_ends_the_job(cluster_spark):
    start = time.monotonic()
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=0, how="raise")
    assert time.monotonic() - start < 30
    assert "boom from rank 0" in "\n".join(info.value._render_traceback_())
    assert rank_processes_alive(last_run().pids.values()) == []
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


def test_the_timeline_comes_back_from_the_executor(cluster_spark, tmp_path):
    import json

    path = tmp_path / "cluster-trace.json"
    HorovodRunner(np=2, timeline=path).run(jobs.torch_allreduce_steps, steps=10)
    assert last_run().timeline_path == str(path)
    assert any(e.get("name") == "ALLREDUCE" for e in json.loads(path.read_text()))
