"""A host lost mid-training on three one-core hosts with one spare (tests/hosts.py): the job
restarts on the other two, from the last checkpoint in a folder every host shares, under DDP
and Horovod."""
import os
import shutil
import time
from pathlib import Path

import pytest

from hvd_magics import HorovodRunner, last_run
from hvd_magics.channel import BEAT_EVERY_S
from hvd_magics.job.live_job import STOP_WAIT_S
from hvd_magics.job.verdicts.lost_host import HOST_SILENT_S
from tests import engine_jobs


@pytest.fixture(scope="module")
def three_hosts():
    from tests.conftest import _stop_active
    from tests.hosts import HostCluster

    cluster = HostCluster(hosts=3, cores=1)
    yield cluster
    _stop_active()
    cluster.stop()
    assert cluster.left() == []


@pytest.fixture()
def three_hosts_spark(three_hosts):
    from tests.conftest import _session

    from hvd_magics.launch.spark_slots import task_slots

    spark = _session(three_hosts.url, **three_hosts.session_conf())
    deadline = time.monotonic() + 90  # also the slots of a host lost by the test before
    while task_slots(spark.sparkContext)[1] < 3:
        assert time.monotonic() < deadline, "the hosts' executors did not register"
        time.sleep(0.2)
    return spark


@pytest.fixture()
def shared_folder():
    """A folder every host sees (outside /tmp, which each host has of its own), as an NFS
    mount would be."""
    folder = Path("/var/tmp") / f"hvd-magics-tests-{os.getpid()}-{time.monotonic_ns()}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("engine", ["torch", "horovod"])
def test_a_cut_host_restarts_the_job_on_the_other_hosts(three_hosts_spark, three_hosts,
                                                        shared_folder, engine):
    """A torch job resumed 93 s after the cut blaming a survivor; a Horovod job did not restart
    (the survivors' HorovodInternalError was taken for the user's own error). The restart is
    decided once the host is silent (10 s, its beats 1 s apart) and the survivors are stopped
    (at most the stop's own wait), then launched as the first attempt was: the decision is
    bounded by those, the launch and the ranks' start only by the job's wait. (A bound on the
    first step against twice the first attempt's time to its first checkpoint failed: a
    Horovod first attempt on warm hosts checkpointed 2.3 s after its start, while the next
    attempt's ranks started cold on the spare host; decided 11.1-11.3 s after the cut in two
    runs alone, the next attempt's first step 11.8-20.7 s after it.)"""
    job = HorovodRunner(np=2, engine=engine, restarts=1, checkpoint_dir=shared_folder).start(
        engine_jobs.steps_with_checkpoints, steps=150, every=5, engine=engine, step_s=0.05)
    try:
        deadline = time.monotonic() + 120
        while not list((shared_folder / "checkpoints").glob("ckpt-1[05]-*")):
            assert time.monotonic() < deadline and not job.done(), "no checkpoint was written"
            time.sleep(0.1)
        first = job.live.job
        host = first.ranks[1].host
        cut = next(h for h in three_hosts.hosts if h.address == host)
        cut.cut()
        began = time.time()
        while job.live.job is first and not job.done():  # the next attempt's state replaces it
            time.sleep(0.05)
        decided = time.time() - began
        resumed = job.wait(timeout=240)
    finally:
        for each in three_hosts.hosts:
            each.restore()
        job.stop()
    record = last_run()
    assert record.status == "succeeded" and len(record.attempts) == 2, record.attempts
    assert record.attempts[0].startswith(f"rank 1 on {host}: RankLost: host {host} "), \
        record.attempts[0]
    assert resumed["attempt"] == 1 and resumed["start"] >= 10
    took = resumed["first_step_at"] - began
    assert decided < HOST_SILENT_S + BEAT_EVERY_S + STOP_WAIT_S, decided
    print(f"{engine}: after the cut, the restart decided in {decided:.1f} s, the next attempt's "
          f"rank 0 process started in {resumed['process_at'] - began:.1f} s, its job's function "
          f"in {resumed['entered_at'] - began:.1f} s, its first step in {took:.1f} s")


def _cut_once_kept(job, three_hosts, keep: Path, kept: str, copies: int, steps: Path):
    """Once ``copies`` files matching ``kept`` are in the hosts' kept steps, cut rank 1's host;
    the job's value once it succeeded on a second attempt resumed from memory, when the cut
    came (``time.time()``), and the steps rank 0 took twice (at most one)."""
    try:
        deadline = time.monotonic() + 120
        while len(list(keep.glob(f"*/*/{kept}"))) < copies:
            assert time.monotonic() < deadline and not job.done(), "no step was kept"
            time.sleep(0.1)
        host = job.live.job.ranks[1].host
        next(h for h in three_hosts.hosts if h.address == host).cut()
        began = time.time()
        resumed = job.wait(timeout=240)
    finally:
        for each in three_hosts.hosts:
            each.restore()
        job.stop()
    record = last_run()
    assert record.status == "succeeded" and len(record.attempts) == 2, record.attempts
    assert "kept in the memory of" in record.attempts[0], record.attempts[0]
    taken = [tuple(map(int, line.split())) for line in open(f"{steps}-0")]
    before = {step for attempt, step in taken if attempt == 0}
    redone = [step for attempt, step in taken if attempt == 1 and step in before]
    assert len(redone) <= 1, redone
    return resumed, began, redone


@pytest.mark.parametrize("engine", ["torch", "horovod"])
def test_a_cut_host_costs_at_most_a_step_kept_in_the_other_hosts_memory(
        three_hosts_spark, three_hosts, shared_folder, engine):
    """Issue 84: every step kept in each host's memory, no checkpoint file. A host cut: the next
    attempt runs on the survivor and the spare host, which fetches the step from the survivor's
    keeper; at most the step under way is redone, and the job ends bit for bit."""
    keep = Path("/dev/shm") / f"hvd-tests-keep-{os.getpid()}-{engine}"
    env = {"HVD_MAGICS_KEEP_DIR": str(keep), "HVD_MAGICS_KEEP_IDLE_S": "60"}
    steps = shared_folder / "steps"
    try:
        whole = HorovodRunner(np=2, engine=engine, env=env,
                              checkpoint_dir=shared_folder / "whole").run(
            engine_jobs.steps_kept, steps=60, engine=engine)
        job = HorovodRunner(np=2, engine=engine, restarts=1, env=env,
                            checkpoint_dir=shared_folder / "lost").start(
            engine_jobs.steps_kept, steps=60, engine=engine, step_s=0.1,
            steps_file=str(steps))
        resumed, began, redone = _cut_once_kept(job, three_hosts, keep, "step-1[0-9].part-*", 1,
                                                steps)
        assert (resumed["weights"], resumed["moment"]) == (whole["weights"], whole["moment"])
        took = resumed["first_step_at"] - began
        print(f"{engine}: a cut host to the next attempt's first step {took:.1f} s, "
              f"{len(redone)} step redone, resumed at step {resumed['start']}")
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def test_a_cut_host_s_fsdp2_parts_come_back_from_its_peer_host(three_hosts_spark, three_hosts,
                                                               shared_folder):
    """Issue 84, sharded: each rank keeps its FSDP2 part and sends a copy to the next host's
    keeper. A host cut: its rank's part comes back from the survivor, which held its copy, and
    the job ends bit for bit with at most one step redone."""
    keep = Path("/dev/shm") / f"hvd-tests-keep-{os.getpid()}-fsdp"
    env = {"HVD_MAGICS_KEEP_DIR": str(keep), "HVD_MAGICS_KEEP_IDLE_S": "60"}
    steps = shared_folder / "steps"
    try:
        whole = HorovodRunner(np=2, engine="torch", env=env,
                              checkpoint_dir=shared_folder / "whole").run(
            engine_jobs.fsdp_kept, steps=60)
        job = HorovodRunner(np=2, engine="torch", restarts=1, env=env,
                            checkpoint_dir=shared_folder / "lost").start(
            engine_jobs.fsdp_kept, steps=60, step_s=0.1, steps_file=str(steps))
        # rank 1's part of a step and its copy on the peer host
        resumed, began, redone = _cut_once_kept(job, three_hosts, keep,
                                                "step-1[0-9].part-1-of-2", 2, steps)
        record = last_run()
        assert (resumed["weights"], resumed["moments"]) == (whole["weights"], whole["moments"])
        print(f"fsdp2: a cut host to the next attempt's first step "
              f"{resumed['first_step_at'] - began:.1f} s, {len(redone)} step redone, resumed at "
              f"step {resumed['start']}; {record.kept}")
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def test_an_elastic_job_goes_on_without_a_cut_host(three_hosts_spark, three_hosts,
                                                  shared_folder):
    """An elastic job of 3 ranks waited for ever (a cut link never closes the channel its
    Horovod driver waits on; not re-formed 240 s after the cut): the host silent for 10 s is
    now lost, its slot ends, and the other two re-form and finish."""
    import threading

    from tests import jobs
    from tests.spark_local.test_elastic_local import wait_for

    (shared_folder / "hold").touch()
    moments = {}

    def cut_one_host() -> None:
        marked = wait_for(f"{shared_folder}/*-task2-*.pid", timeout=180)
        address = Path(marked).name.split("-task", 1)[0]
        moments["host"] = address
        next(h for h in three_hosts.hosts if h.address == address).cut()
        moments["cut"] = time.time()
        wait_for(f"{shared_folder}/size2", timeout=120)
        moments["size2"] = time.time()
        (shared_folder / "hold").unlink()

    threading.Thread(target=cut_one_host, daemon=True).start()
    try:
        result = HorovodRunner(np="2:3", timeout=300).run(jobs.elastic_torch, steps=300,
                                                          marks=str(shared_folder))
    finally:
        for each in three_hosts.hosts:
            each.restore()
    record = last_run()
    assert [(r["size"], r["step"]) for r in result] == [(2, 300)] * 2
    assert [(r["size"], r["causes"]) for r in record.resets] == [
        (2, [f"task 2 on {moments['host']} stopped answering: its link or machine was lost"])]
    took = moments["size2"] - moments["cut"]
    print(f"the elastic job went on with 2 ranks {took:.1f} s after the cut")
    # 15 s whichever rank the cut host ran. It was 55-89 s when it ran rank 0: Horovod's
    # driver told the lost coordinator of the change of hosts, holding the lock that re-forming
    # waits for, until the connection gave up (ReportingDriver.forget_workers_on)
    assert took < 45, took
