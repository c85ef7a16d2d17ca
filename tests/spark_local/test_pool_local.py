"""Warm pools on local Spark: one long barrier stage holds the ranks across runs."""
import pytest

from hvd_magics import HorovodPool, HorovodRunner, NotEnoughSlotsError, PayloadError, last_run
from tests import jobs
from tests.frames import mixed_frame


def test_a_pool_on_spark_keeps_its_ranks_and_their_model_and_holds_its_slots(local_spark):
    with HorovodPool(np=2) as pool:
        first = pool.run(jobs.pool_build_model)
        trained = pool.run(jobs.pool_train_kept, steps=3)
        assert trained != first
        assert last_run().where == "spark local[2] (warm pool)"
        kept, pid = pool.run(jobs.pool_read, name="model")
        assert kept is not None and pool.run(jobs.pool_read, name="model")[1] == pid
        with pytest.raises(NotEnoughSlotsError, match=r"has 0 free of 2.*Warm pools hold 2 of "
                                                      r"the slots.*%hvd_pool stop"):
            HorovodRunner(np=2).run(jobs.print_lines, count=1)
        with pytest.raises(PayloadError, match="a warm pool's ranks cannot receive a "
                                               "DataFrame's shards yet"):
            pool.run(jobs.shard_report, out="/nonexistent", train=mixed_frame(local_spark))
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0  # the slots are free again


def test_a_stuck_rank_on_spark_restarts_the_pool_in_place(local_spark):
    with HorovodPool(np=2) as pool:
        pool.run(jobs.pool_keep, kept="yes")
        with pytest.raises(Exception, match="The ranks were restarted: rank 0 did not come back"):
            pool.run(jobs.pool_raise_on_rank_1_while_0_allreduces)
        assert pool.run(jobs.pool_read, name="kept")[0] is None
        assert pool.run(jobs.pool_keep, kept="again") > 0
