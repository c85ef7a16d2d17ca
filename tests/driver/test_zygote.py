"""Ranks forked from a zygote (hvd_magics.task.zygotes): they start as a fresh rank process would,
from a zygote of their own environment, and never from one whose modules changed on disk."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from hvd_magics import HorovodRunner
from hvd_magics.task.zygotes import ZYGOTES
from tests import jobs
from tests.conftest import ROOT, processes_left


def _zygote_ready(module: str, within: float = 120.0) -> None:
    """Wait until one of this process's zygotes holds ``module`` (it imports in the background)."""
    deadline = time.monotonic() + within
    while not any(module in held for held in ZYGOTES.ready()):
        assert time.monotonic() < deadline, f"no zygote holding {module} within {within} s"
        time.sleep(0.05)


def _forked(runner: HorovodRunner, job=jobs.zygote_setting, within: float = 120.0, **kwargs):
    """What ``job`` returns on the first run whose ranks were all forked from a zygote (the runs
    before it start fresh while the zygote of their environment imports)."""
    deadline = time.monotonic() + within
    while True:
        seen = runner.run(job, **kwargs)
        if all(rank["zygote"] for rank in seen) if job is jobs.zygote_draws else seen[2]:
            return seen
        assert time.monotonic() < deadline, f"no rank forked from a zygote within {within} s"


def test_ranks_forked_from_a_zygote_draw_what_fresh_processes_would():
    """numpy's and torch's global generators are seeded once per process: forked ranks shared
    the zygote's, so both ranks of every job drew the same numbers, job after job."""
    ranks = _forked(HorovodRunner(np=-2), jobs.zygote_draws)
    ranks += HorovodRunner(np=-2).run(jobs.zygote_draws)
    assert all(rank["zygote"] for rank in ranks), ranks  # all four forked from a zygote
    for source in range(3):  # Python's random, numpy, torch
        draws = [rank["draws"][source] for rank in ranks]
        assert len(set(draws)) == len(draws), (source, draws)


def test_the_first_job_of_an_environment_starts_its_zygote_and_every_rank_forks_from_it():
    """The first job of an environment started its ranks fresh, each importing torch, and its
    zygote only once they ended (a third import); the next job, started at once, found that
    zygote importing. Now the first rank starts the zygote (its job leads with framework
    imports) and every rank of the job waits for it and forks: one import, and the next job
    forks from the same zygote."""
    import uuid

    runner = HorovodRunner(np=-2, env={"HVD_TEST_WAIT": uuid.uuid4().hex})  # a new environment
    first = {rank["zygote"] for rank in runner.run(jobs.zygote_draws)}
    assert len(first) == 1 and None not in first, first
    second = {rank["zygote"] for rank in runner.run(jobs.zygote_draws)}
    assert second == first


def test_an_environment_gets_its_own_zygote_and_none_is_used_when_turned_off(monkeypatch):
    """A variable a framework may read on import (anything but a rank's own) gets a zygote
    started with it; ``HVD_MAGICS_ZYGOTE=0`` starts every rank fresh."""
    seen = {}
    for value in ("a", "b"):
        runner = HorovodRunner(np=-1, env={"HVD_TEST_IMPORT_SETTING": value})
        rank_sees, zygote_saw, seen[value] = _forked(runner, name="HVD_TEST_IMPORT_SETTING")
        assert (rank_sees, zygote_saw) == (value, value)
    assert seen["a"] != seen["b"]
    monkeypatch.setenv("HVD_MAGICS_ZYGOTE", "0")
    assert HorovodRunner(np=-1, env={"HVD_TEST_IMPORT_SETTING": "a"}).run(
        jobs.zygote_setting, name="HVD_TEST_IMPORT_SETTING") == ("a", None, None)


def test_a_zygote_grows_to_hold_what_the_next_jobs_import():
    """A job that imports more than its zygote holds: the zygote forks one that also imports it,
    which takes its place for the next jobs (of any process)."""
    import uuid

    import psutil

    runner = HorovodRunner(np=-1, env={"HVD_TEST_GROW": uuid.uuid4().hex})
    deadline = time.monotonic() + 120
    while True:  # the first runs start fresh while the zygote imports scipy
        held, first = runner.run(jobs.zygote_imports, modules=["scipy"])
        if first is not None:
            break
        assert time.monotonic() < deadline, "no rank forked within 120 s"
    assert held == ["scipy"]
    runner.run(jobs.zygote_imports, modules=["sklearn"])  # forked from it; it grows after
    while True:
        held, grown = runner.run(jobs.zygote_imports, modules=["scipy", "sklearn"])
        if grown not in (first, None):
            break
        assert time.monotonic() < deadline, "the zygote did not grow within 120 s"
    assert held == ["scipy", "sklearn"]
    # the old one serves no more, and ends once its own ranks have (it counted the grown one
    # as a keeper and lived as long: chains of 4 to 6 zygotes per host, 3.4 GB)
    while psutil.pid_exists(first) and psutil.Process(first).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the retired zygote did not end"
        time.sleep(0.2)  # polling for the condition, bounded by the deadline
    assert psutil.Process(grown).is_running()
    held, again = runner.run(jobs.zygote_imports, modules=["scipy", "sklearn"])
    assert again == grown and held == ["scipy", "sklearn"]  # the grown one serves on


def test_a_zygote_holding_torch_also_holds_what_its_first_optimizer_imports():
    """PyTorch's first optimizer imports ``torch._dynamo``: every rank forked from a zygote that
    held only torch imported it again (0.8 CPU s a rank)."""
    import uuid

    runner = HorovodRunner(np=-1, env={"HVD_TEST_COMPANION": uuid.uuid4().hex})
    deadline = time.monotonic() + 120
    while runner.run(jobs.zygote_imports, modules=["torch"])[1] is None:  # fresh until it serves
        assert time.monotonic() < deadline, "no rank forked within 120 s"
    held, zygote = runner.run(jobs.zygote_imports, modules=["torch._dynamo"])
    assert zygote is not None and held == ["torch._dynamo"]


def test_a_zygote_whose_modules_changed_on_disk_starts_no_rank():
    """A module file changed since the zygote imported it (a new version installed between
    jobs): the next rank starts fresh, and the one after from a new zygote."""
    old = _forked(HorovodRunner(np=-1), name="HOME")[2]
    import hvd_magics.rank.rank_events as changed

    stat = os.stat(changed.__file__)
    os.utime(changed.__file__, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert HorovodRunner(np=-1).run(jobs.zygote_setting, name="HOME")[2] is None
        new = _forked(HorovodRunner(np=-1), name="HOME")[2]
    finally:
        os.utime(changed.__file__, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert new not in (None, old)


def test_a_killed_kernel_takes_the_ranks_forked_for_it_along_and_its_zygote_serves_the_next(
        tmp_path):
    """A zygote serves every process of the host: when one dies (a kernel killed), the keepers
    of its ranks kill their ranks, and the zygote forks the next process's ranks (a second
    "kernel" started as the first, so that their ranks' environments are the same)."""
    prelude = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import cloudpickle
        from hvd_magics import HorovodRunner
        from tests import jobs
        from tests.driver.test_zygote import _zygote_ready
        cloudpickle.register_pickle_by_value(jobs)
    """)
    owner = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(f"""
        HorovodRunner(np=-2).run(jobs.zygote_draws)
        _zygote_ready("horovod.torch")
        HorovodRunner(np=-2).run(jobs.sleep_in_allreduce, pid_dir={str(tmp_path)!r})
    """)])
    deadline = time.monotonic() + 180
    while len(list(tmp_path.iterdir())) < 2:
        assert owner.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    ranks = [int(path.read_text()) for path in tmp_path.iterdir()]
    zygotes = {subprocess_grandparent(pid) for pid in ranks}
    assert len(zygotes) == 1 and None not in zygotes
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert processes_left(ranks) == []
    assert processes_left(list(zygotes), within=0.5) == list(zygotes)
    next_kernel = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent("""
        print(json.dumps([rank["zygote"] for rank in HorovodRunner(np=-2).run(jobs.zygote_draws)]))
    """)], capture_output=True, text=True, check=True)
    assert set(json.loads(next_kernel.stdout.strip().splitlines()[-1])) == zygotes


def subprocess_grandparent(pid: int) -> int | None:
    """The pid of the zygote ``pid`` was forked from (rank -> keeper -> zygote), if it was."""
    import psutil

    from hvd_magics.protocol import ZYGOTE_MODULE

    above = psutil.Process(pid).parent().parent()
    return above.pid if ZYGOTE_MODULE in " ".join(above.cmdline()) else None


def test_a_zygote_forks_nothing_for_another_user():
    """Its folder is closed to others; should its socket be reached anyway, a zygote hangs up
    on a process of another user without a word."""
    from hvd_magics.protocol import ENV_ZYGOTE_IMPORTS, ENV_ZYGOTE_SOCKET, ZYGOTE_MODULE

    if os.getuid() != 0:  # only root can connect as another user: check the peer test itself
        import socket
        from unittest import mock

        from hvd_magics.rank.zygote import same_user

        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        assert same_user(here)
        with mock.patch("os.getuid", return_value=os.getuid() + 1):
            assert not same_user(here)
        here.close()
        there.close()
        return
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's folders are closed to other users
    folder.chmod(0o777)
    path = folder / "z.sock"
    zygote = subprocess.Popen([sys.executable, "-m", ZYGOTE_MODULE], cwd=ROOT,
                              env={**os.environ, ENV_ZYGOTE_SOCKET: str(path),
                                   ENV_ZYGOTE_IMPORTS: ""})
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert zygote.poll() is None and time.monotonic() < deadline, "it never served"
            time.sleep(0.05)
        path.chmod(0o777)
        assert _greeting(str(path)).startswith(b"ready")
        assert _greeting(str(path), as_user=65534) == b""
    finally:
        zygote.kill()
        zygote.wait()
        shutil.rmtree(folder)


def _greeting(path: str, as_user: int | None = None) -> bytes:
    """What the zygote at ``path`` says to a process that connects (of user ``as_user``: a child
    forked here that takes that user on; it cannot run this Python, which lives in /root)."""
    import socket

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            if as_user is not None:
                os.setgid(as_user)
                os.setuid(as_user)
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            connection.settimeout(30)
            connection.connect(path)
            os.write(write, b"said " + connection.recv(100))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        answer = said.read()
    os.waitpid(pid, 0)
    assert answer.startswith(b"said "), "the connection failed"
    return answer[len(b"said "):]


def test_a_hung_zygote_costs_a_job_seconds_and_another_takes_its_place():
    """A zygote that stopped answering (here SIGSTOP): the rank starts fresh after
    ``FORK_WAIT_S``, not never (the ends of the pipes it was sent stay open in it), and a new
    zygote serves the next jobs."""
    import uuid

    from hvd_magics.task.zygotes import FORK_WAIT_S

    runner = HorovodRunner(np=-1, env={"HVD_TEST_HUNG": uuid.uuid4().hex})
    deadline = time.monotonic() + 120
    while (hung := runner.run(jobs.zygote_imports, modules=["scipy"])[1]) is None:
        assert time.monotonic() < deadline, "no rank forked within 120 s"
    os.kill(hung, signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert runner.run(jobs.zygote_imports, modules=["scipy"])[1] is None  # started fresh
        assert time.monotonic() - began < FORK_WAIT_S + 30
        while (new := runner.run(jobs.zygote_imports, modules=["scipy"])[1]) in (None, hung):
            assert time.monotonic() < deadline + 60, "no new zygote within a minute"
    finally:
        os.kill(hung, signal.SIGCONT)
    assert new != hung


def test_a_rank_whose_keeper_died_says_what_is_known_not_a_signal_nobody_saw():
    """A keeper forked by a zygote is not its supervisor's child: when it ended without writing
    the rank's exit code, the supervisor made one up (-9), and the job said 'killed by signal 9
    without a Python exception' as fact (in the hosts tier, of a rank nobody had signalled).
    Now the keeper says why it was stopped, and a silent one is called silent."""
    import pytest

    from hvd_magics import HorovodJobError

    runner = HorovodRunner(np=-1)
    said = {}
    for sig in (signal.SIGKILL, signal.SIGTERM):
        deadline = time.monotonic() + 120
        while sig not in said:
            assert time.monotonic() < deadline, "no rank forked from a zygote within 120 s"
            try:
                assert runner.run(jobs.kill_own_keeper, sig=int(sig)) == "fresh"
            except HorovodJobError as exc:
                said[sig] = str(exc).splitlines()[0]
    assert "which was killed without a word (SIGKILL, or the host ran out of memory), without " \
        "a Python exception" in said[signal.SIGKILL], said
    assert "which something on the host stopped (SIGTERM)" in said[signal.SIGTERM], said
    assert not any("killed by signal" in line for line in said.values()), said
    with pytest.raises(HorovodJobError):  # and the next job runs as before
        runner.run(jobs.kill_own_keeper, sig=int(signal.SIGKILL))
