"""Several ranks per Spark task on local Spark (issue 41): the magic's option and its bad input,
and a warm pool whose one task holds both ranks."""
import pytest
from IPython.core.error import UsageError

from hvd_magics import HorovodPool, last_run
from tests import engine_jobs


def test_the_magic_runs_two_ranks_in_one_task_and_refuses_what_cannot_be(ip, local_spark):
    cell = ("import horovod.torch as hvd, torch\n"
            "hvd.init()\n"
            "total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()\n"
            "local = (hvd.local_rank(), hvd.local_size())\n")
    ip.run_cell_magic("horovod", "np=2 --ranks-per-task 2 --return total,local -q", cell)
    assert ip.user_ns["total"] == 3.0 and ip.user_ns["local"] == (0, 2)
    assert last_run().where == "spark local[2] (1 task x 2 ranks)"
    assert len(set(last_run().pids.values())) == 2  # a process each
    ip.run_cell_magic("horovod", "np=2 ranks_per_task=1 --return local -q", cell)
    assert ip.user_ns["local"] == (0, 2) and last_run().where == "spark local[2]"
    with pytest.raises(UsageError, match=r"np=2 is not a multiple of ranks_per_task=3.*"
                                         r"Fix: np=3"):
        ip.run_cell_magic("horovod", "np=2 --ranks-per-task 3", cell)
    with pytest.raises(UsageError, match="ranks_per_task .--ranks-per-task. must be a whole "
                                         "number >= 1.*got 'two'"):
        ip.run_cell_magic("horovod", "np=2 --ranks-per-task two", cell)
    with pytest.raises(UsageError, match="ranks on the driver are a process each"):
        ip.run_cell_magic("horovod", "np=-2 --ranks-per-task 2", cell)


def test_a_warm_pool_of_two_ranks_in_one_task_keeps_them(local_spark):
    with HorovodPool(np=2, ranks_per_task=2, engine="torch") as pool:
        first = pool.run(engine_jobs.ddp_allreduce_kept)
        again = pool.run(engine_jobs.ddp_allreduce_kept)
        assert pool.where.endswith("(1 task x 2 ranks)")
    assert first["sum"] == again["sum"] == 3.0
    assert first["pid"] == again["pid"] and again["initialised_before"]
    assert not pool.alive
