"""Jobs on a standalone cluster of real hosts (tests/hosts.py: network namespaces with their own
addresses, names, /etc/hosts and /tmp, one worker each, the driver on their bridge): every
engine across hosts whose names resolve to addresses the peers cannot reach, and what the hosts
do not share."""
import pytest

from hvd_magics import HorovodJobError, HorovodRunner, last_run
from tests import engine_jobs


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_ranks_on_two_hosts_whose_names_resolve_to_unreachable_addresses(hosts_spark, engine):
    """Each host resolves its own name to a management network the other cannot reach (the first
    to Debian's 127.0.1.1): Horovod's ranks failed (killed by signal 6: 'connect [10.78...]: No
    route to host'), its process sets' Gloo device bound to the name's address (patch 9)."""
    views = HorovodRunner(np=4, engine=engine, timeout=120).run(engine_jobs.hosts_of_ranks,
                                                               engine=engine)
    assert [(rank, total) for rank, _host, total in views] == [(r, 4.0) for r in range(4)]
    assert sorted(host for _rank, host, _total in views) == ["host1", "host1", "host2", "host2"]
    assert {views[0][1], views[1][1]} == {"host1"} or {views[0][1], views[1][1]} == {"host2"}
    record = last_run()
    assert record.status == "succeeded"


def test_a_tf_job_across_the_hosts(hosts_spark):
    executable, _package, total, workers = HorovodRunner(np=4, engine="tf", timeout=120).run(
        engine_jobs.tf_where)
    assert (total, workers) == (4.0, 4)


def test_a_checkpoint_folder_the_hosts_do_not_share_is_refused_before_training(hosts_spark):
    """The default folder is under each machine's own /tmp: rank 1 resumed from nothing while
    rank 0 resumed from step 15, and the job hung. Refused at the first checkpoint call."""
    with pytest.raises(HorovodJobError) as info:
        HorovodRunner(np=4, engine="torch", restarts=1, timeout=120).run(
            engine_jobs.steps_with_checkpoints)
    text = str(info.value)
    assert "CheckpointFolderNotShared: rank " in text, text
    assert "does not see the job's checkpoint folder " in text
    assert "hvd_magics/checkpoints/" in text
    assert "Fix: a folder that every executor and the driver share" in text
    assert "starting attempt" not in text and len(last_run().attempts) == 0  # not retried
